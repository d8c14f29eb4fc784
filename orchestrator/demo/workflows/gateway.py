"""The API gateway lifecycle of a cloud-function platform, on the orchestrator.

A gateway has a desired ``state`` (Running, Stopped, Deleted) that users set, and an
observed ``phase`` (Creating, Created, Deleting, Deleted) that only handlers move.
Creating provisions its children one kind per step (a runtime domain, a database, stages,
cloud functions, cron triggers), then waits for the runtime domain's certificate.
Deleting removes them one kind per step in the opposite order, so a deletion that fails
half way resumes at the kind it stopped at. A deleted gateway is archived and removed.

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

from pydantic import Field
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from orchestrator import DEFAULT_DATABASE, AsyncLease, AsyncOrchestrator, ConfigError, Resource
from orchestrator.demo.workflows.certificates import (
    CERTIFICATES,
    INGRESSES,
    CertManager,
    RuntimeDomain,
    register_domains,
)
from orchestrator.testing import async_memory_database

logger = logging.getLogger("orchestrator.demo.workflows.gateway")

CREATE_ORDER = ("runtimeDomains", "databases", "stages", "cloudFunctions", "cronTriggers")
"""The runtime domain first: its certificate takes longest, so it starts earliest."""

DELETE_ORDER = ("cronTriggers", "cloudFunctions", "stages", "runtimeDomains", "databases")
"""What calls a function goes before the function; the data goes last."""

CHILDREN_PER_KIND = {"cronTriggers": 2, "cloudFunctions": 3, "stages": 2, "databases": 1}

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
    provisioned: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
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
        self.certs = CertManager(
            db, now=self.now, delay=cert_delay, faults=self.faults, record=self.record
        )

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

    async def create(self, gateway: Gateway, kind: str) -> None:
        self.faults.check(gateway.name, f"create:{kind}", gateway.attempts)
        if kind == "runtimeDomains":
            domain = RuntimeDomain(
                gateway_id=gateway.id,
                gateway_name=gateway.name,
                host=f"{gateway.name}.apps.example.net",
                custom_domain=gateway.custom_domain,
                phase="Creating",
            )
            await self.orch.submit(RuntimeDomain, domain, unique="gateway_id")
        else:
            children = self.db[kind]
            for n in range(CHILDREN_PER_KIND[kind]):
                name = f"{gateway.name}-{kind}-{n}"
                await children.update_one(
                    {"gatewayId": gateway.id, "name": name},
                    {"$setOnInsert": {"replicas": 1}},
                    upsert=True,
                )
        await self.record(gateway.id, f"create:{kind}")

    async def domain_phase(self, gateway: Gateway) -> str | None:
        doc = await self.db[RuntimeDomain.collection].find_one(
            {"gatewayId": gateway.id}, {"phase": 1}
        )
        return None if doc is None else str(doc.get("phase"))

    async def remove(self, gateway: Gateway, kind: str) -> None:
        self.faults.check(gateway.name, f"delete:{kind}", gateway.attempts)
        if kind == "runtimeDomains":
            async for domain in self.db[kind].find({"gatewayId": gateway.id}):
                await self.certs.remove_ingress(domain["host"])
                if domain.get("customDomain"):
                    await self.certs.discard(domain["customDomain"])
        await self.db[kind].delete_many({"gatewayId": gateway.id})
        await self.record(gateway.id, f"delete:{kind}")

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
        """What is not where it should be: kept gateways Created with every child, their
        domain Created behind a Ready certificate and an ingress; deleted ones archived
        with nothing left behind. Empty when all is well."""
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
        for kind, count in CHILDREN_PER_KIND.items():
            found = await self.db[kind].count_documents({"gatewayId": doc["_id"]})
            if found != count:
                problems.append(f"{name}: {found} {kind}, expected {count}")
        domain = await self.db[RuntimeDomain.collection].find_one({"gatewayId": doc["_id"]})
        if domain is None or domain.get("phase") != "Created":
            return [*problems, f"{name}: runtime domain {domain and domain.get('phase')}"]
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
        for kind in CREATE_ORDER:
            if await self.db[kind].count_documents({"gatewayId": archived["_id"]}):
                problems.append(f"{name}: {kind} left behind")
        if await self.db[INGRESSES].count_documents({"gatewayId": archived["_id"]}):
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
    """The gateway handlers, and those of its runtime domain; every replica registers them."""
    register_domains(orch, platform.certs)

    @orch.phase(Gateway, "Creating", to="Created")
    async def provision(lease: AsyncLease[Gateway]) -> Any:
        gateway = lease.resource
        for kind in CREATE_ORDER:
            if kind not in gateway.provisioned:
                await platform.create(gateway, kind)
                return await lease.unlock(provisioned=[*gateway.provisioned, kind])
        domain = await platform.domain_phase(gateway)
        if domain == "Created":
            return await lease.advance("Created")
        if domain == orch.settings.failed_phase:
            return await lease.fail(f"runtime domain of {gateway.name} failed")
        return await lease.relock()

    @orch.when(
        Gateway, {"state": "Deleted", "phase": {"$in": ["Created", "Failed"]}}, to="Deleting"
    )
    async def begin_deletion(lease: AsyncLease[Gateway]) -> Any:
        return await lease.advance("Deleting")

    @orch.phase(Gateway, "Deleting", to="Deleted")
    async def delete_children(lease: AsyncLease[Gateway]) -> Any:
        gateway = lease.resource
        for kind in DELETE_ORDER:
            if kind not in gateway.removed:
                await platform.remove(gateway, kind)
                return await lease.unlock(removed=[*gateway.removed, kind])
        return await lease.advance("Deleted")

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
