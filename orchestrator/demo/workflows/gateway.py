"""The API gateway lifecycle of a cloud-function platform, on the orchestrator.

A gateway has a desired ``state`` (Running, Stopped, Deleted) that users set, and an
observed ``phase`` (Creating, Created, Deleting, Deleted) that only handlers move.
Creating makes its children (a runtime domain, a database, stages, cloud functions, cron
triggers), each a document of its own whose step provisions it, and waits for them all
(``lease.create_child``, ``lease.wait_for_children``): a retried step makes none twice,
and nothing polls. Deleting moves them to their deletion and waits until they are gone;
the data goes last. A deleted gateway is archived and removed.

``Platform`` stands in for the services the real platform calls (Kubernetes, the cloud
API). It is application code: it talks to its own collections directly, and writes one
entry per side effect to a ledger whose unique ``_id`` makes a repeated one visible.

The workflow is written once, async (``async def`` handlers on ``AsyncOrchestrator``, the
platform on PyMongo's async API), and every user of it runs that one definition on the
async engine: the API server on its own event loop, the demo's replicas as tasks of one
loop, its ``--processes`` replicas and ``orchestrator run`` each with ``asyncio.run``. A
second, sync copy for the threaded engine would be the same logic twice; an adapter
running these coroutines from worker threads would need a sync client beside the async
one, or an event loop per step, which an ``AsyncMongoClient`` (bound to one loop) refuses.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from orchestrator import DEFAULT_DATABASE, AsyncLease, AsyncOrchestrator, ConfigError, Resource
from orchestrator.core.trees import OWNER_FIELD, Owner
from orchestrator.demo.workflows.certificates import (
    CERTIFICATES,
    INGRESSES,
    CertManager,
    RuntimeDomain,
    register_domains,
)
from orchestrator.testing import async_memory_database

logger = logging.getLogger("orchestrator.demo.workflows.gateway")

CHILDREN_PER_KIND = {
    "runtimeDomains": 1,
    "databases": 1,
    "stages": 2,
    "cloudFunctions": 3,
    "cronTriggers": 2,
}
CREATE_ORDER = tuple(CHILDREN_PER_KIND)
"""The collections of a gateway's children, made in this order: the runtime domain first,
its certificate takes longest, so it starts earliest."""
PARTS = CREATE_ORDER[1:]
"""The children with no workflow of their own: a step provisions each, one removes it."""
DATA = "databases"
DROPPING = "Dropping"
"""The phase a database is removed in: the second stage of a deletion (``register``)."""

STOP_WANTED = {"state": "Stopped", "stopped": {"$ne": True}}
START_WANTED = {"state": "Running", "stopped": True}
ARCHIVE = "gatewaysArchive"
LEDGER = "sideEffects"
DEMO_MARK = "orchestratorDemo"
"""Its presence says the demo made this database's workflow collections (and may drop them)."""


class Gateway(Resource):
    collection = "gateways"
    unique = ("name",)

    name: str
    state: Literal["Running", "Stopped", "Deleted"] = "Running"
    custom_domain: str | None = None
    stopped: bool = False


class ServiceError(RuntimeError):
    """A platform service refused a call (an injected fault): the step is retried."""


class Faults:
    """Failures injected into the platform's services.

    ``rate`` draws per (resource, action, attempt) from ``seed``, so a run fails the same
    calls whichever replica makes them; ``schedule`` fails the next calls of one action.
    """

    def __init__(self, rate: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"fault rate must be in [0, 1), not {rate!r}")
        self.rate = rate
        self.seed = seed
        self._scheduled: Counter[str] = Counter()
        self._lock = threading.Lock()

    def schedule(self, action: str, times: int = 1) -> None:
        with self._lock:
            self._scheduled[action] += times

    def should_fail(self, resource: Any, action: str, attempt: int) -> bool:
        with self._lock:
            if self._scheduled[action] > 0:
                self._scheduled[action] -= 1
                return True
        return bool(self.rate) and self.draw(f"{resource}:{action}:{attempt}") < self.rate

    def check(self, resource: Any, action: str, attempt: int) -> None:
        if self.should_fail(resource, action, attempt):
            raise ServiceError(f"{action} refused for {resource} (injected fault)")

    def draw(self, key: str) -> float:
        """A number in [0, 1) fixed by the seed and ``key``."""
        digest = hashlib.sha256(f"{self.seed}:{key}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64


class Platform:
    """The services a gateway's steps call, and the operations users make."""

    def __init__(
        self,
        db: AsyncDatabase[dict[str, Any]],
        orch: AsyncOrchestrator,
        *,
        faults: Faults | None = None,
        cert_delay: float = 5.0,
    ) -> None:
        self.db = db
        self.orch = orch
        self.faults = faults if faults is not None else Faults()
        self.certs = CertManager(db, orch, delay=cert_delay, faults=self.faults, record=self.record)

    def now(self) -> datetime:
        """The orchestrator's estimate of the database server's clock."""
        return self.orch.clock.now()

    # -- what users do ---------------------------------------------------------------------

    async def create_gateway(self, name: str, custom_domain: str | None = None) -> dict[str, Any]:
        """Idempotent: a second create of one name returns the first gateway."""
        gateway = Gateway(name=name, state="Running", phase="Creating", custom_domain=custom_domain)
        return await self.orch.submit(Gateway, gateway, unique="name")

    async def set_state(self, name: str, state: Literal["Running", "Stopped", "Deleted"]) -> bool:
        """Change the desired state; False if there is no such gateway. A deletion is final."""
        result = await self.db[Gateway.collection].update_one(
            {"name": name, "state": {"$ne": "Deleted"}}, {"$set": {"state": state}}
        )
        if result.matched_count:
            return True
        return await self.db[Gateway.collection].count_documents({"name": name}, limit=1) > 0

    async def gateway(self, name: str) -> dict[str, Any] | None:
        """The live gateway, or its archived record once it is gone."""
        doc = await self.db[Gateway.collection].find_one({"name": name})
        if doc is None:
            doc = await self.db[ARCHIVE].find_one({"name": name}, sort=[("archivedAt", -1)])
        return doc

    # -- what steps call -------------------------------------------------------------------

    async def call(self, lease: AsyncLease[Any], action: str) -> None:
        """``create`` or ``delete`` the child ``lease`` holds (a database, a stage...)."""
        name, attempts = lease.doc["name"], lease.doc.get("attempts", 0)
        self.faults.check(name, f"{action}:{lease.collection}", attempts)
        await self.record(lease.id, action)

    async def scale(self, gateway: Gateway, replicas: int) -> None:
        """Stop (0) or start (1) the gateway's functions; idempotent, so not in the ledger."""
        await self.db["cloudFunctions"].update_many(
            {"gatewayId": gateway.id}, {"$set": {"replicas": replicas}}
        )

    async def archive(self, doc: dict[str, Any]) -> None:
        kept = {
            k: v
            for k, v in doc.items()
            if k not in {"lockedAt", "lockedUntil", "lockToken", "lastToken", "lockedBy"}
        }
        await self.db[ARCHIVE].replace_one(
            {"_id": doc["_id"]}, {**kept, "archivedAt": self.now()}, upsert=True
        )
        await self.record(doc["_id"], "archive")

    # -- the ledger ------------------------------------------------------------------------

    async def record(self, resource_id: Any, action: str) -> None:
        """One entry per side effect; a second one of the same key counts as a repeat."""
        key = f"{resource_id}:{action}"
        logger.info(
            "%s done by %s",
            key,
            self.orch.replica_id,
            extra={"replica": self.orch.replica_id, "doc_id": str(resource_id), "outcome": action},
        )
        try:
            await self.db[LEDGER].insert_one({"_id": key, "at": self.now(), "repeats": 0})
        except DuplicateKeyError:
            await self.db[LEDGER].update_one({"_id": key}, {"$inc": {"repeats": 1}})
            logger.error("side effect %s ran again", key, extra={"outcome": "repeated"})

    async def archived(self) -> int:
        return await self.db[ARCHIVE].count_documents({})

    async def reset(self) -> None:
        """Drop every collection of the workflow: a demo starts from nothing.

        Only in a database the demo has run in before (it leaves a mark) or that holds none
        of these collections: the default database is shared with the API server and
        ``orchestrator run``, whose gateways a demo must never drop.
        """
        names = (Gateway.collection, ARCHIVE, LEDGER, *CREATE_ORDER, CERTIFICATES, INGRESSES)
        present = set(await self.db.list_collection_names())
        theirs = sorted(present.intersection(names))
        if theirs and DEMO_MARK not in present:
            raise ConfigError(
                f"database {self.db.name!r} holds {', '.join(theirs)}, which the demo did"
                " not make, and the demo drops them before it runs: give it another"
                " database (--db)"
            )
        await self.db[DEMO_MARK].update_one(
            {"_id": "demo"}, {"$set": {"note": "orchestrator demo data"}}, upsert=True
        )
        for name in names:
            await self.db.drop_collection(name)

    async def audit(self, kept: list[str], deleted: list[str]) -> list[str]:
        """What is not where it should be: kept gateways Created with every child, each
        Created and owned by its gateway, their domain behind a Ready certificate and an
        ingress; deleted ones archived with nothing left behind. Empty when all is well."""
        problems: list[str] = []
        for name in kept:
            problems += await self._kept_problems(name)
        for name in deleted:
            problems += await self._deleted_problems(name)
        return problems

    async def _kept_problems(self, name: str) -> list[str]:
        """What is wrong with a kept gateway: its phase, children, domain, certificate,
        ingress."""
        doc = await self.db[Gateway.collection].find_one({"name": name})
        if doc is None or doc.get("phase") != "Created":
            return [f"{name}: phase {doc and doc.get('phase')}, expected Created"]
        problems: list[str] = []
        wanted = ("Created", Gateway.collection, doc["_id"])  # each child's phase and owner
        for kind, count in CHILDREN_PER_KIND.items():
            children = [c async for c in self.db[kind].find({"gatewayId": doc["_id"]})]
            if len(children) != count:
                problems.append(f"{name}: {len(children)} {kind}, expected {count}")
            for child in children:
                owner = Owner.read(child.get(OWNER_FIELD)) or Owner("", None, "")
                if (child.get("phase"), owner.collection, owner.id) != wanted:
                    problems.append(
                        f"{name}: {kind} {child['_id']} {child.get('phase')}, owned by {owner}"
                    )
        domain = await self.db[RuntimeDomain.collection].find_one({"gatewayId": doc["_id"]})
        if domain is None or domain.get("phase") != "Created":
            return problems
        custom = domain.get("customDomain")
        cert = await self.db[CERTIFICATES].find_one({"_id": custom}) if custom else None
        if custom and (cert is None or cert.get("status") != "Ready"):
            problems.append(f"{name}: certificate {cert and cert.get('status')}")
        if await self.db[INGRESSES].count_documents({"_id": domain["host"]}) != 1:
            problems.append(f"{name}: no ingress")
        return problems

    async def _deleted_problems(self, name: str) -> list[str]:
        """What a deleted gateway left behind, or that it was not archived."""
        problems: list[str] = []
        if await self.db[Gateway.collection].count_documents({"name": name}):
            problems.append(f"{name}: still in {Gateway.collection}")
        archived = await self.db[ARCHIVE].find_one({"name": name})
        if archived is None:
            return [*problems, f"{name}: not archived"]
        gone = archived["_id"]
        for kind in CREATE_ORDER:
            left = {"$or": [{"gatewayId": gone}, {f"{OWNER_FIELD}.id": gone}]}
            if await self.db[kind].count_documents(left):
                problems.append(f"{name}: {kind} left behind")
        if await self.db[INGRESSES].count_documents({"gatewayId": gone}):
            problems.append(f"{name}: ingress left behind")
        if archived.get("customDomain") and await self.db[CERTIFICATES].count_documents(
            {"_id": archived["customDomain"]}
        ):
            problems.append(f"{name}: certificate left behind")
        return problems

    async def repeats(self) -> int:
        """Side effects that ran more than once: 0 when every step ran exactly once."""
        repeated = self.db[LEDGER].find({"repeats": {"$gt": 0}})
        return sum([d.get("repeats", 0) async for d in repeated])


def register(orch: AsyncOrchestrator, platform: Platform) -> None:
    """The gateway handlers, and those of its children; every replica registers them.

    A deletion goes in two stages, the data last: a function running as its database is
    dropped could write to it again (MongoDB makes a database at its first write). Moved to
    Deleting, where no handler takes it, a database counts as ended, so the first wait ends
    once the others are gone; then it moves on to ``DROPPING``. The others go at once, as a
    cascading delete in Kubernetes does: a trigger calling a function gone first fails,
    harmlessly. A child that fails fails its gateway, whose deletion then starts again.
    """
    register_domains(orch, platform.certs)
    for kind in PARTS:
        _register_part(orch, platform, kind)

    @orch.phase(Gateway, "Creating", to=("Created", "Failed"))
    async def provision(lease: AsyncLease[Gateway]) -> Any:
        gateway = lease.resource
        domain = RuntimeDomain(
            gateway_id=gateway.id,
            gateway_name=gateway.name,
            host=f"{gateway.name}.apps.example.net",
            custom_domain=gateway.custom_domain,
            phase="Creating",
        )
        await lease.create_child(RuntimeDomain, "runtimeDomain", domain)
        for kind in PARTS:
            for n in range(CHILDREN_PER_KIND[kind]):
                name = f"{gateway.name}-{kind}-{n}"
                part = {"gatewayId": gateway.id, "name": name, "replicas": 1, "phase": "Creating"}
                await lease.create_child(kind, f"{kind}-{n}", part)
        return await lease.wait_for_children(then="Created", on_failure="Failed")

    @orch.when(
        Gateway, {"state": "Deleted", "phase": {"$in": ["Created", "Failed"]}}, to="Deleting"
    )
    async def begin_deletion(lease: AsyncLease[Gateway]) -> Any:
        return await lease.advance("Deleting")

    @orch.phase(Gateway, "Deleting", to=("DroppingData", "Failed"))
    async def delete_children(lease: AsyncLease[Gateway]) -> Any:
        await lease.move_children("Deleting")
        return await lease.wait_for_children(then="DroppingData", on_failure="Failed")

    @orch.phase(Gateway, "DroppingData", to=("Deleted", "Failed"))
    async def drop_data(lease: AsyncLease[Gateway]) -> Any:
        await lease.move_children(DROPPING)
        return await lease.wait_for_children(then="Deleted", on_failure="Failed")

    @orch.phase(Gateway, "Deleted")
    async def archive(lease: AsyncLease[Gateway]) -> Any:
        await platform.archive(lease.doc)
        return await lease.remove()

    # One handler for both directions: every handler costs each replica a query per tick.
    @orch.when(Gateway, {"phase": "Created", "$or": [STOP_WANTED, START_WANTED]})
    async def stop_or_start(lease: AsyncLease[Gateway]) -> Any:
        stopping = lease.resource.state == "Stopped"
        await platform.scale(lease.resource, 0 if stopping else 1)
        return await lease.unlock(stopped=stopping)


def _register_part(orch: AsyncOrchestrator, platform: Platform, kind: str) -> None:
    @orch.phase(kind, "Creating", to="Created")
    async def create_part(lease: AsyncLease[Any]) -> Any:
        await platform.call(lease, "create")
        return await lease.advance("Created")

    @orch.phase(kind, DROPPING if kind == DATA else "Deleting")
    async def remove_part(lease: AsyncLease[Any]) -> Any:
        await platform.call(lease, "delete")
        return await lease.remove()


@dataclass(frozen=True)
class Workflow:
    orch: AsyncOrchestrator
    platform: Platform


def build(
    db: AsyncDatabase[dict[str, Any]],
    *,
    cert_delay: float = 5.0,
    faults: Faults | None = None,
    **settings: Any,
) -> Workflow:
    """One replica: an orchestrator with the gateway workflow registered on it."""
    orch = AsyncOrchestrator(db, **settings)
    platform = Platform(db, orch, faults=faults, cert_delay=cert_delay)
    register(orch, platform)
    return Workflow(orch, platform)


def worker() -> AsyncOrchestrator:
    """For ``orchestrator run orchestrator.demo.workflows:worker`` (``examples.gateway:worker``
    in a clone): the replica on ``MONGODB_URI`` (its database, else ``DEFAULT_DATABASE``),
    run by ``asyncio.run``."""
    uri = os.environ.get("MONGODB_URI")
    if uri:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
        db = client.get_default_database(DEFAULT_DATABASE)
    else:
        logger.warning("MONGODB_URI is not set: this worker runs on its own in-memory store")
        db = async_memory_database()
    return build(db).orch
