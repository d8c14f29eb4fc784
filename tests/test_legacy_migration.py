"""A rolling migration from the in-house pattern (``Settings.legacy_lock_timeout``).

The old pods (``tests.legacy_pod``: the article's code, ported unchanged in meaning) and
library replicas share one database; each judges the other's leases as its own, so every
step of every document runs once, whichever kind of pod takes it. The fleet test deploys
as operators would: old pods only, then both, then replicas only, and then replicas
without the setting (the next deploy).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator import (
    AsyncOrchestrator,
    ConfigError,
    Lease,
    LeaseLost,
    Orchestrator,
    Outcome,
    Settings,
    StoreError,
)
from orchestrator.cli import connecting
from orchestrator.core import sharding
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.errors import LeaseHeld
from orchestrator.core.in_house import IN_HOUSE_HOLDER, IN_HOUSE_INDEX, InHouse
from orchestrator.core.queries import claims, lease_writes, operators, replica_records, submissions
from orchestrator.core.replicas import (
    ReplicaIdentity,
    ReplicaRecord,
    ReplicaSettings,
    disagreements,
    new_record,
)
from orchestrator.core.resource import EPOCH
from orchestrator.mongo import Store
from orchestrator.operations import Operations, live_lease
from orchestrator.operations.filters import Filter, LeaseState, Row, judge
from orchestrator.testing import FakeClock, memory_database
from orchestrator.testing.faults import Faults
from tests.cli_kit import URI, publish, run
from tests.conftest import MakeReplica
from tests.engines import Replica
from tests.legacy_pod import (
    KINDS,
    TASK_LOCK_INIT_TIME,
    Gateway,
    LegacyPod,
    Platform,
    js_now,
)

LEGACY = 30.0
"""The old pods' ``lockTimeout``, and so the replicas' ``legacy_lock_timeout``."""
MS = timedelta(milliseconds=1)


# -- the replicas' side of the workflow ----------------------------------------------------


@dataclass
class World:
    """One database, one fake clock, the outside ``platform``, the old ``pods`` and the
    replicas, advanced a second at a time. The old pods' second comes while a replica's
    step runs, when one runs (``meanwhile``): their claims meet the replicas' leases in
    the middle of a step, as they would in a fleet."""

    clock: FakeClock
    db: Database[Any]
    platform: Platform
    rng: random.Random
    pods: list[LegacyPod] = field(default_factory=list)
    replicas: list[Orchestrator] = field(default_factory=list)
    gateways: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    """Every gateway submitted, and the steps its workflow takes (``Platform.expected``)."""
    submitted: set[str] = field(default_factory=set)
    """The gateways a replica submitted (the others the application inserted)."""
    seconds: int = 0
    _pods_ticked: bool = False

    def meanwhile(self) -> None:
        """The old pods' cron second, if it has not come yet this second."""
        if not self._pods_ticked:
            self._pods_ticked = True
            for pod in self.pods:
                pod.tick()

    def second(self) -> None:
        for pod in self.pods:
            pod.resume()
        self._pods_ticked = False
        for orch in self.rng.sample(self.replicas, len(self.replicas)):
            orch.run_once()
        self.meanwhile()
        self.request_deletions()
        self.clock.advance(1.0)
        self.seconds += 1

    def request_deletions(self) -> None:
        """The application asks for every created gateway to be deleted, as the article's
        API does: it sets the phase, and leaves the lease fields alone."""
        now = js_now(self.clock.now())
        self.db.gateways.update_many(
            {"phase": "Created"}, {"$set": {"phase": "Deleting", "updatedAt": now}}
        )

    def provision(self, gid: str) -> bool:
        custom_domain = self.rng.random() < 0.6
        self.platform.provision(
            gid,
            Gateway(
                triggers=self.rng.choice([0, 1, 3]),
                functions=self.rng.choice([0, 2]),
                stages=self.rng.choice([1, 2]),
                cert_delay=self.rng.uniform(2, 25),
            ),
        )
        self.gateways[gid] = self.platform.expected(gid, custom_domain)
        return custom_domain

    def insert_as_before(self, gid: str) -> None:
        """A gateway as the application created them before the migration: unlocked by
        ``lockedAt`` at the epoch (the article's ``insertOne``)."""
        now = js_now(self.clock.now())
        custom_domain = self.provision(gid)
        self.db.gateways.insert_one(
            {
                "gatewayId": gid,
                "state": "Running",
                "phase": "Creating",
                "customDomain": custom_domain,
                "lockedAt": TASK_LOCK_INIT_TIME,
                "createdAt": now,
                "updatedAt": now,
            }
        )

    def submit(self, orch: Orchestrator, gid: str) -> None:
        custom_domain = self.provision(gid)
        doc = {"gatewayId": gid, "state": "Running", "phase": "Creating"}
        orch.submit("gateways", {**doc, "customDomain": custom_domain}, unique="gatewayId")
        self.submitted.add(gid)

    def replica(self, name: str, legacy: float | None) -> Orchestrator:
        """A replica running the workflow's two handlers, as the old pods run them."""
        orch = Orchestrator(
            self.db,
            replica_id=name,
            clock=self.clock,
            lock_timeout=30,
            tick=1.0,
            clock_refresh=1e6,
            max_concurrency=1,
            legacy_lock_timeout=legacy,
        )
        orch.measure_clock()
        workflow(orch, self, name)
        self.replicas.append(orch)
        return orch

    def pod(self, name: str) -> LegacyPod:
        calls = [1.0, 2.0, 3.0, 4.0]  # seconds an outside call takes
        pod = LegacyPod(
            name, self.db, self.clock.now, self.platform, lambda: self.rng.choice(calls)
        )
        self.pods.append(pod)
        return pod


def workflow(orch: Orchestrator, world: World, name: str) -> None:
    """The old pods' two handlers, as library handlers: the same steps, each ended by the
    lease (unlock, relock, advance)."""
    platform = world.platform

    @orch.phase("gateways", "Creating")
    def creating(lease: Lease[Any]) -> Outcome:
        world.meanwhile()  # the old pods' second, while this replica holds the document
        gid = lease.doc["gatewayId"]
        if lease.doc.get("customDomain"):
            # relock() waits by ProgressiveBackoff: the article's backoff, a tenth of the
            # time in the phase (two minutes on, a lock timeout).
            cert = platform.certificate(gid)
            if cert is None:
                platform.create_certificate(gid, by=name)
                return lease.relock()
            if cert != "Ready":
                return lease.relock()
        if not platform.has_ingress(gid):
            platform.create_ingress(gid, by=name)
        outcome = lease.advance("Created")
        platform.record(gid, "Creating", "created", name)
        return outcome

    @orch.phase("gateways", "Deleting")
    def deleting(lease: Lease[Any]) -> Outcome:
        world.meanwhile()
        gid = lease.doc["gatewayId"]
        for kind in KINDS:
            if platform.count(kind, gid) > 0:
                platform.remove_all(kind, gid, by=name)
                return lease.unlock()
        outcome = lease.advance("Deleted")
        platform.record(gid, "Deleting", "deleted", name)
        return outcome


@pytest.fixture
def make_world() -> Iterator[Callable[[int], World]]:
    made: list[World] = []

    def factory(seed: int) -> World:
        clock = FakeClock()
        world = World(clock, memory_database(clock=clock), Platform(clock.now), random.Random(seed))
        made.append(world)
        return world

    yield factory
    for world in made:
        for orch in world.replicas:
            orch.stop(timeout=5)


# -- the rolling deploy --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_a_rolling_deploy_from_the_in_house_pattern_runs_every_step_once(  # noqa: PLR0912  one stage of the deploy after another
    make_world: Callable[[int], World], seed: int, record_property: Callable[[str, Any], None]
) -> None:
    """Old pods only; then two replicas beside them (the setting on); then the old pods
    drained and stopped; then the replicas replaced by ones without the setting. Gateways
    arrive throughout, the old way and then through ``submit``; each is created (with a
    certificate wait for a custom domain), then deleted a kind of resource per step."""
    world = make_world(seed)
    for n in range(3):
        world.pod(f"old-{n}")
    for second in range(40):  # 1. old pods only
        if second % 2 == 0:
            world.insert_as_before(f"gw-{len(world.gateways):03d}")
        world.second()
    for name in ("new-a", "new-b"):  # 2. the first replicas start, old pods still running
        world.replica(name, LEGACY)
    for second in range(80):
        if second % 2 == 0:
            world.submit(world.replicas[second % 4 // 2], f"gw-{len(world.gateways):03d}")
        world.second()
    for pod in world.pods:  # 3. the last old pod stops: it finishes what it runs first
        pod.stop()
    while any(pod.busy for pod in world.pods):
        world.second()
    for second in range(30):
        if second % 3 == 0:
            world.submit(world.replicas[0], f"gw-{len(world.gateways):03d}")
        world.second()
    for orch in list(world.replicas):  # 4. the next deploy: without the setting
        orch.stop(timeout=5)
        world.replicas.remove(orch)
    world.pods.clear()
    world.replica("next-a", None)
    world.replica("next-b", None)
    for second in range(20):
        if second % 4 == 0:
            world.submit(world.replicas[1], f"gw-{len(world.gateways):03d}")
        world.second()
    for _ in range(120):  # until every gateway is deleted
        if world.db.gateways.count_documents({"phase": {"$ne": "Deleted"}}) == 0:
            break
        world.second()

    phases = Counter(doc["phase"] for doc in world.db.gateways.find())
    assert phases == {"Deleted": len(world.gateways)}, "every gateway finishes"
    expected = [step for steps in world.gateways.values() for step in steps]
    ran = world.platform.steps
    assert [s for s in expected if len(ran.get(s, [])) != 1] == [], "each step once"
    assert set(ran) == set(expected), "no step the workflow does not take"
    by = Counter(_kind(who[0]) for who in ran.values())
    # Who took each next step of a gateway after whom: both ways, old pods included in
    # gateways a replica submitted.
    handoffs = Counter(
        (_kind(ran[a][0]), _kind(ran[b][0]))
        for steps in world.gateways.values()
        for a, b in itertools.pairwise(steps)
        if _kind(ran[a][0]) != _kind(ran[b][0])
    )
    old_worked = {gid for (gid, _, _), who in ran.items() if _kind(who[0]) == "old"}
    figures = {
        "seed": seed,
        "documents": len(world.gateways),
        "steps": len(expected),
        "steps by old pods": by["old"],
        "steps by new replicas (with the setting)": by["new"],
        "steps by next replicas (without it)": by["next"],
        "old -> new handoffs": handoffs["old", "new"],
        "new -> old handoffs": handoffs["new", "old"],
        "submitted gateways old pods worked on": len(old_worked & world.submitted),
        "certificate polls": world.platform.polls,
        "seconds": world.seconds,
    }
    print(f"\nmixed fleet: {figures}")
    record_property("figures", figures)
    assert by["old"] > 0 and by["new"] > 0 and by["next"] > 0, "every kind of pod worked"
    assert handoffs["old", "new"] > 0 and handoffs["new", "old"] > 0
    assert old_worked & world.submitted, "old pods took documents submit made"


def _kind(who: str) -> str:
    """old (an old pod), new (a replica with the setting), next (one without)."""
    return who.split("-", maxsplit=1)[0]


# -- one lease, judged alike by both kinds -------------------------------------------------


def _gateway(db: Database[Any], platform: Platform, now: datetime, **fields: Any) -> None:
    """A gateway to delete, as the old pods left it (unless ``fields`` say otherwise)."""
    platform.provision("gw", Gateway(triggers=2, functions=1, stages=1, cert_delay=0))
    doc = {"gatewayId": "gw", "phase": "Deleting", "lockedAt": TASK_LOCK_INIT_TIME}
    db.gateways.insert_one({**doc, "updatedAt": js_now(now), **fields})


def _taking(orch: Orchestrator, phase: str = "Deleting") -> list[datetime]:
    """Registers a handler of ``phase`` that notes when it claimed, and unlocks."""
    claimed: list[datetime] = []

    @orch.phase("gateways", phase)
    def step(lease: Lease[Any]) -> Outcome:
        claimed.append(lease.claimed_at)
        return lease.relock(wait=600)

    return claimed


def test_an_old_pods_live_lease_is_not_taken_by_a_replica(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """The old pod's outside call outlasts its lease: the replica waits the whole lease
    out (the pattern's own timeout), and then takes the document over."""
    orch = make(legacy_lock_timeout=LEGACY)
    claimed = _taking(orch)
    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    pod = LegacyPod("old-0", db, orch.clock.now, platform, latency=lambda: 45.0)
    pod.tick()
    taken_at = db.gateways.find_one()["lockedAt"]
    for seconds in (1, 9, 19):  # 1, 10 and 29 s after the old pod's claim
        clock.advance(seconds)
        orch.run_once()
        assert claimed == []
    clock.advance(2)  # 31 s after it: its lease ran out
    orch.run_once()
    assert len(claimed) == 1
    assert claimed[0] - taken_at.replace(tzinfo=UTC) >= timedelta(seconds=LEGACY)


def test_without_the_setting_a_replica_takes_an_old_pods_live_lease(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """What the setting prevents (and what the fleet test would see as steps run twice):
    a replica reads no lockedUntil, so it takes the old pod's document a second later."""
    orch = make()
    claimed = _taking(orch)
    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    LegacyPod("old-0", db, orch.clock.now, platform, latency=lambda: 45.0).tick()
    clock.advance(1)
    orch.run_once()
    assert len(claimed) == 1


def test_a_replicas_relock_is_claimable_by_an_old_pod_exactly_when_its_wait_ends(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(legacy_lock_timeout=LEGACY)
    relocked: list[datetime] = []

    @orch.phase("gateways", "Deleting")
    def wait_outside(lease: Lease[Any]) -> Outcome:
        relocked.append(orch.clock.now())
        return lease.relock(wait=7)

    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    orch.run_once()
    assert len(relocked) == 1
    pod = LegacyPod("old-0", db, orch.clock.now, platform)
    clock.advance(7 - 0.001)  # a millisecond before the wait ends
    pod.tick()
    assert not pod.busy and platform.steps == {}
    clock.advance(0.001)
    pod.tick()  # the wait has ended: the old pod takes the next step
    assert pod.busy
    clock.advance(1)
    pod.resume()
    assert platform.steps == {("gw", "Deleting", "triggers"): ["old-0"]}
    assert len(relocked) == 1


def test_a_document_a_replica_submits_is_claimable_by_an_old_pod(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(legacy_lock_timeout=LEGACY)
    platform = Platform(orch.clock.now)
    platform.provision("gw", Gateway(triggers=0, functions=0, stages=1, cert_delay=0))
    stored = orch.submit("gateways", {"gatewayId": "gw", "phase": "Creating"}, unique="gatewayId")
    assert stored["lockedAt"].replace(tzinfo=None) == EPOCH
    pod = LegacyPod("old-0", db, orch.clock.now, platform)
    pod.tick()
    clock.advance(1)
    pod.resume()
    assert platform.steps == {
        ("gw", "Creating", "ingress"): ["old-0"],
        ("gw", "Creating", "created"): ["old-0"],
    }


def test_an_old_pods_relock_holds_until_its_wait_ends_for_a_replica(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """An old pod's relock (lockedAt set back by less than its lock timeout) holds the
    document for the replica as for the old pods, to the millisecond: their ``$lt`` is
    strict, so a 9 s wait ends a millisecond after 9 s."""
    orch = make(legacy_lock_timeout=LEGACY)
    claimed = _taking(orch)
    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    pod = LegacyPod("old-0", db, orch.clock.now, platform)
    pod.relock("gw", waiting_time=90_000)  # 90 s in the phase: wait 9 s
    clock.advance(9)
    orch.run_once()
    pod.tick()
    assert claimed == [] and not pod.busy
    clock.advance(0.001)
    orch.run_once()
    assert len(claimed) == 1


# -- the moment a lease runs out, to the millisecond ---------------------------------------


T = datetime(2026, 3, 1, 12, 0, 0, 500_000, tzinfo=UTC)


def _old_pods_take(db: Database[Any], at: datetime) -> bool:
    """The old pods' claim filter, asked (not claimed) at ``at``."""
    return (
        db.gateways.count_documents(
            {"phase": "Deleting", "lockedAt": {"$lt": js_now(at) - timedelta(seconds=LEGACY)}}
        )
        == 1
    )


def _replicas_take(db: Database[Any], at: datetime) -> bool:
    match = {"phase": "Deleting"}
    query = claims.claim_filter(match, at, Settings().horizon, None, InHouse(LEGACY))
    return db.gateways.count_documents(query) == 1


@pytest.mark.parametrize(
    ("fields", "free_at"),
    [
        ({"lockedAt": T}, T + timedelta(seconds=LEGACY) + MS),  # an old pod's claim
        (  # an old pod's relock: 4 s to wait
            {"lockedAt": T - timedelta(seconds=LEGACY) + timedelta(seconds=4)},
            T + timedelta(seconds=4) + MS,
        ),
        (  # a replica's lease, wait or backoff, written with its lockedAt
            InHouse(LEGACY).stamped({"lockedUntil": bson_time(T)}),
            T,
        ),
        (InHouse(LEGACY).stamped({"lockedUntil": EPOCH}), EPOCH.replace(tzinfo=UTC)),
    ],
    ids=["old-claim", "old-relock", "replica-lease", "replica-unlock"],
)
def test_both_kinds_take_a_document_from_the_same_millisecond(
    db: Database[Any], fields: dict[str, Any], free_at: datetime
) -> None:
    db.gateways.insert_one({"phase": "Deleting", **fields})
    # Released at the epoch: free whenever asked (now, here).
    moments = (free_at - MS, free_at, free_at + MS) if free_at.year > 2000 else (T,)
    for at in moments:
        assert _old_pods_take(db, at) == _replicas_take(db, at) == (at >= free_at), at


# -- every lease a replica writes ----------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize("micros", [0, 1, 499, 500, 501, 999])
def test_a_lease_s_fence_names_the_lockedAt_its_write_stored_whatever_the_setting_s_digits(
    micros: int,
) -> None:
    """The store stamps ``lockedAt`` from the ``lockedUntil`` it writes (to the
    millisecond); the lease's fence from its own expiry (to the microsecond): one stamp,
    even for a setting finer than a millisecond (which settings now refuse)."""
    until = T.replace(microsecond=123_000 + micros)
    for legacy in (LEGACY, LEGACY + 0.0005, LEGACY + 0.0009):
        stored = InHouse(legacy).update(lease_writes.extend_update(T, until))["$set"]
        fence = InHouse(legacy).fence({"_id": 1}, [until])
        assert fence["lockedAt"] == stored["lockedAt"], legacy


@pytest.mark.anyio
@pytest.mark.parametrize("engine", ["threaded", "async"])
async def test_every_outcome_lands_with_a_setting_finer_than_a_millisecond(
    engine: str, db: Database[Any], adb: AsyncDatabase[Any], clock: FakeClock
) -> None:
    """A replica whose setting has sub-millisecond digits (as one built before settings
    refused them): each step's outcome lands, whatever the sub-millisecond digits of its
    lease's expiry (ten steps, each a tick and a tenth of a millisecond after the last,
    cover them all). Its fence once named a ``lockedAt`` a millisecond off the stored one
    for half of them: the outcome refused as a lost lease, the step run again at each
    expiry, for ever."""
    built = Settings(replica_id="new-a", clock_refresh=1e6)
    settings = built.model_copy(update={"legacy_lock_timeout": LEGACY + 0.0005})
    orch = (
        Orchestrator(db, settings, clock=clock)
        if engine == "threaded"
        else AsyncOrchestrator(adb, settings, clock=clock)
    )
    replica = Replica(orch)
    await replica.measure_clock()

    @replica.phase("gateways", "Deleting")
    async def delete(lease: Any) -> Any:
        return await lease.relock(wait=1, steps=lease.doc.get("steps", 0) + 1)

    try:
        await replica.submit("gateways", {"phase": "Deleting"})
        for n in range(10):
            counts = await replica.run_once()
            assert counts.get("relocked") == 1 and "lost" not in counts, (n, counts)
            clock.advance(1.0001)
    finally:
        await replica.stop(timeout=5)
    doc = db.gateways.find_one()
    assert doc is not None and doc["steps"] == 10


def _told_alike(doc: dict[str, Any]) -> None:
    """``doc``'s lockedAt tells an old pod what its lockedUntil tells a replica."""
    until, at = doc["lockedUntil"], doc["lockedAt"]
    assert as_utc(at) == as_utc(InHouse(LEGACY).stamp(until)), doc


def test_every_lease_a_replica_writes_tells_old_pods_the_same(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """Submit, claim, carry, extension, unlock, relock, retry backoff, advance, failure,
    and an operator's unlock, retry and cancel: each leaves the lockedAt an old pod
    judges as the replica judges lockedUntil."""
    orch = make(legacy_lock_timeout=LEGACY, max_attempts=5)
    script = iter(["extend-unlock", "carried-relock", "raise", "advance", "fail"])
    held: list[dict[str, Any]] = []

    def step(lease: Lease[Any]) -> Outcome:
        held.append(db.gateways.find_one({"_id": lease.id}))  # as claimed or carried
        action = next(script)
        if action == "extend-unlock":
            clock.advance(20)
            lease.extend()
            held.append(db.gateways.find_one({"_id": lease.id}))
            return lease.unlock()
        if action == "carried-relock":
            return lease.relock(wait=5)
        if action == "raise":
            raise RuntimeError("the outside failed")
        if action == "advance":
            return lease.advance("Two")
        return lease.fail("given up")

    orch.phase("gateways", "One")(step)
    orch.phase("gateways", "Two")(step)
    stored = orch.submit("gateways", {"phase": "One", "n": 1})
    _told_alike(stored)
    for _ in range(3):  # relocked; retrying after a backoff; advanced (carried on), failed
        orch.run_once()
        doc = db.gateways.find_one()
        _told_alike(doc)
        clock.advance(max((as_utc(doc["lockedUntil"]) - orch.clock.now()).total_seconds(), 0))
    assert doc["phase"] == "Failed"
    _told_alike(doc)
    assert len(held) == 6
    for seen in held:
        _told_alike(seen)
        assert as_utc(seen["lockedUntil"]) > orch.clock.now()

    # The operators' tools learn the setting from the live replicas' records.
    Store(db).record_replica(_record(orch.clock.now(), LEGACY))
    operations = Operations(db)
    moved = operations.retry("gateways", doc, "One", any_phase=True).document
    _told_alike(moved)
    db.gateways.update_one({"_id": doc["_id"]}, {"$set": {"lockedAt": js_now(orch.clock.now())}})
    unlocked = operations.unlock("gateways", db.gateways.find_one())
    _told_alike(unlocked)
    cancelled = operations.cancel("gateways", unlocked).document
    _told_alike(cancelled)


@pytest.mark.parametrize("action", ["unlock", "retry", "cancel"])
def test_an_operators_change_frees_a_document_for_old_pods_though_no_replica_is_live(
    action: str, make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """The operators' tools learn the setting from the live replicas' records, and while
    old pods run none may be live: an operator's unlock, retry or cancel still writes the
    epoch ``lockedAt`` with the epoch ``lockedUntil``. Written only with the setting, the
    ``lockedAt`` of a replica's relock (ahead of now) stayed, and held the document for the
    old pods (and for replicas honouring them) until the relock's wait ended."""
    orch = make(legacy_lock_timeout=LEGACY)
    claimed = _taking(orch)  # relocks for 600 s
    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    orch.run_once()
    assert len(claimed) == 1
    seen = db.gateways.find_one()
    assert as_utc(seen["lockedAt"]) > orch.clock.now()  # the relock's stamp
    operations = Operations(db)
    assert operations.replicas() == []
    if action == "unlock":
        after = operations.unlock("gateways", seen)
    elif action == "retry":
        after = operations.retry("gateways", seen, "Deleting", any_phase=True).document
    else:
        after = operations.cancel("gateways", seen, to="Deleting", any_phase=True).document
    assert as_utc(after["lockedAt"]) == as_utc(TASK_LOCK_INIT_TIME)
    _told_alike(after)
    pod = LegacyPod("old-0", db, orch.clock.now, platform)
    clock.advance(1)
    pod.tick()
    assert pod.busy  # the old pod takes it at once


def _record(now: datetime, legacy: float | None, replica_id: str = "new-a") -> ReplicaRecord:
    return new_record(
        ReplicaIdentity(replica_id, "i", "h", 1, "1", "threaded", now),
        ReplicaSettings(lock_timeout=30, tick=1, max_concurrency=4, legacy_lock_timeout=legacy),
        now=now,
    )


@pytest.mark.pure
@pytest.mark.parametrize(
    "update",
    [
        claims.claim_update(T, T + timedelta(seconds=30), "t", "r"),
        lease_writes.extend_update(T, T + timedelta(seconds=30)),
        lease_writes.carry_update(
            lease_writes.unlock_update({}), T, T + timedelta(seconds=30), "t", "r"
        ),
        lease_writes.unlock_update({"x": 1}),
        lease_writes.unlock_update({}, T + timedelta(seconds=1)),
        lease_writes.release_update(),
        lease_writes.relock_update(T + timedelta(seconds=7), {}),
        lease_writes.advance_update("Next", T, {}),
        lease_writes.retry_update(2, {"type": "E"}, T + timedelta(seconds=4)),
        lease_writes.fail_update("Failed", 5, {"type": "E"}, T, "key"),
        operators.operator_unlock_update(),
        operators.operator_move_update("Again", T),
    ],
    ids=lambda u: ",".join(sorted(u["$set"])),
)
def test_every_update_that_sets_lockedUntil_sets_lockedAt_with_it(
    update: dict[str, Any],
) -> None:
    stamped = InHouse(LEGACY).update(update)
    until = update["$set"]["lockedUntil"]
    assert stamped["$set"]["lockedAt"] == InHouse(LEGACY).stamp(until)
    assert {k: v for k, v in stamped["$set"].items() if k != "lockedAt"} == {
        k: v for k, v in update["$set"].items() if k != "lockedAt"
    }
    assert {k: v for k, v in stamped.items() if k != "$set"} == {
        k: v for k, v in update.items() if k != "$set"
    }
    assert InHouse(None).update(update) is update  # without the setting: untouched


@pytest.mark.pure
def test_a_release_at_once_writes_the_epoch_as_the_old_pods_unlock_does() -> None:
    assert InHouse(LEGACY).stamp(EPOCH) == TASK_LOCK_INIT_TIME
    assert (
        InHouse(LEGACY).stamped(submissions.new_document({"phase": "A"}, T))["lockedAt"]
        == TASK_LOCK_INIT_TIME
    )
    assert "lockedAt" not in InHouse(LEGACY).stamped({"lockedUntil": "soon"})


# -- what is not a date --------------------------------------------------------------------


@pytest.mark.parametrize(
    "locked_at",
    ["yesterday", 0, None, "missing", {"at": 1}, datetime(2100, 1, 1), datetime(1, 1, 1)],
    ids=["string", "number", "null", "missing", "document", "far-future", "year-1"],
)
def test_a_malformed_lockedAt_never_keeps_a_document_from_being_claimed(
    make: MakeReplica, db: Database[Any], clock: FakeClock, locked_at: Any
) -> None:
    """Whatever is no date an in-house lease could hold (and a date past the horizon, as
    for lockedUntil) is free: claimed at once, and the claim writes a date over it that
    the old pods honour. The operators' views read it without failing (as for a
    lockedUntil, they judge a far-future date held: the old pods never take it)."""
    orch = make(legacy_lock_timeout=LEGACY)
    claimed = _taking(orch)
    doc: dict[str, Any] = {"gatewayId": "gw", "phase": "Deleting", "lockedAt": locked_at}
    if locked_at == "missing":
        del doc["lockedAt"]
    db.gateways.insert_one(doc)
    Store(db).record_replica(_record(orch.clock.now(), LEGACY))
    operations = Operations(db)
    assert operations.status(["gateways"]).phases[0].count == 1
    assert len(operations.browse(Filter("gateways")).rows) == 1
    orch.run_once()
    assert len(claimed) == 1
    stored = db.gateways.find_one()
    assert isinstance(stored["lockedAt"], datetime)
    _told_alike(stored)


# -- the probe, the peek and the operators' views ------------------------------------------


def test_the_probe_sees_an_in_house_lease_and_when_it_runs_out(db: Database[Any]) -> None:
    """No handler has work while an old pod holds the only document; the probe's due time
    is when its lease runs out, so an idle replica wakes then, not a tick later. Without
    the setting, the same document is work at once."""
    db.gateways.insert_one({"gatewayId": "gw", "phase": "Deleting", "lockedAt": js_now(T)})
    groups = [("gateways", [({"phase": "Deleting"}, None)])]
    horizon = Settings().horizon
    at = T + timedelta(seconds=12)
    store = Store(db, legacy_lock_timeout=LEGACY)
    found = store.probe(groups, at, horizon)
    assert found.ready == frozenset()
    assert found.next_due == js_now(T) + timedelta(seconds=LEGACY) + MS
    assert store.probe(groups, found.next_due, horizon).ready == frozenset({0})
    assert Store(db).probe(groups, at, horizon).ready == frozenset({0})
    peek = sharding.ClaimPlan(strategy="peek")
    update = claims.claim_update(at, at + timedelta(seconds=30), "t", "r")
    match = {"phase": "Deleting"}
    assert (
        store.claim("gateways", claims.ClaimRequest(match, at, horizon, update, plan=peek)) is None
    )
    assert store.claim("gateways", claims.ClaimRequest(match, at, horizon, update)) is None
    later = found.next_due
    update = claims.claim_update(later, later + timedelta(seconds=30), "t", "r")
    taken = store.claim("gateways", claims.ClaimRequest(match, later, horizon, update, plan=peek))
    assert taken is not None
    _told_alike(db.gateways.find_one())


def test_a_replica_with_the_setting_makes_the_index_of_the_in_house_query(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make(legacy_lock_timeout=LEGACY)
    _taking(orch)
    orch.ensure_indexes()
    keys = [list(info["key"].items()) for info in db.gateways.list_indexes()]
    assert [(k, int(v)) for k, v in IN_HOUSE_INDEX] in [
        [(k, int(v)) for k, v in key] for key in keys
    ]


def test_the_operators_tools_judge_an_in_house_lease_held(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """With a live replica honouring in-house leases: the status counts it leased, a list
    shows it held by an in-house pod until its lease runs out, a retry is refused as for
    any live lease, and an unlock frees it for the old pods at once."""
    orch = make(legacy_lock_timeout=LEGACY)
    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    LegacyPod("old-0", db, orch.clock.now, platform, latency=lambda: 45.0).tick()
    taken_at = as_utc(db.gateways.find_one()["lockedAt"])
    clock.advance(5)
    Store(db).record_replica(_record(orch.clock.now(), LEGACY))
    operations = Operations(db)
    [count] = operations.status(["gateways"]).phases
    assert (count.leased, count.overdue, count.waiting) == (1, 0, 0)
    [row] = operations.browse(Filter("gateways", state=LeaseState.LEASED)).rows
    assert row.holder == IN_HOUSE_HOLDER
    assert row.until == taken_at + timedelta(seconds=LEGACY) + MS
    assert operations.browse(Filter("gateways", state=LeaseState.FREE)).rows == []
    doc = db.gateways.find_one()
    with pytest.raises(LeaseHeld) as refused:
        operations.retry("gateways", doc, "Deleting", any_phase=True)
    assert refused.value.holder == IN_HOUSE_HOLDER
    operations.unlock("gateways", doc)
    pod = LegacyPod("old-1", db, orch.clock.now, platform)
    pod.tick()
    assert pod.busy  # free for the old pods at once


@pytest.mark.pure
def test_a_document_held_by_an_in_house_lease_is_judged_leased_and_nothing_else() -> None:
    now = T + timedelta(seconds=10)
    old = {"phase": "P", "lockedAt": T}
    assert judge(old, now) is LeaseState.FREE  # without the setting: free
    assert judge(old, now, InHouse(LEGACY)) is LeaseState.LEASED
    assert live_lease(old, now, InHouse(LEGACY)) and not live_lease(old, now)
    expired = T + timedelta(seconds=LEGACY) + MS
    assert judge(old, expired, InHouse(LEGACY)) is LeaseState.FREE
    # A replica's own wait is still a wait: its lockedAt says the same as its lockedUntil.
    waiting = InHouse(30).stamped({"phase": "P", "lockedUntil": T + timedelta(seconds=20)})
    assert judge(waiting, now, InHouse(LEGACY)) is LeaseState.WAITING
    assert not live_lease(waiting, now, InHouse(LEGACY))
    # A replica's expired lease that an old pod took since: held by the old pod.
    taken = {"phase": "P", "lockToken": "t", "lockedBy": "dead", "lockedUntil": T, "lockedAt": T}
    assert judge(taken, now, InHouse(LEGACY)) is LeaseState.LEASED
    assert Row.read(taken, now, in_house=InHouse(LEGACY)).holder == IN_HOUSE_HOLDER
    assert judge(taken, now) is LeaseState.OVERDUE


@pytest.mark.pure
def test_claim_latency_counts_from_when_an_in_house_lease_ran_out() -> None:
    entered = T - timedelta(minutes=5)
    relocked = {"lockedAt": T, "lockedUntil": EPOCH, "updatedAt": entered, "lockedBy": "x"}
    assert claims.due_since(relocked, InHouse(LEGACY)) == T + timedelta(seconds=LEGACY) + MS
    own = InHouse(30).stamped({"lockedUntil": T, "updatedAt": entered, "lockedBy": "x"})
    assert claims.due_since(own, InHouse(LEGACY)) == T == claims.due_since(own)
    submitted = InHouse(LEGACY).stamped({"lockedUntil": EPOCH, "updatedAt": entered})
    assert claims.due_since(submitted, InHouse(LEGACY)) == entered
    # Released at once after a replica's claim: an unlock within the phase or an advance
    # into it, which the epoch no longer tells apart: not known, rather than wrong.
    assert claims.due_since({**submitted, "lockedBy": "x"}, InHouse(LEGACY)) is None
    assert claims.due_since({**relocked, "lockedUntil": "soon"}, InHouse(LEGACY)) is None


# -- the setting ---------------------------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize("value", [0, -30, math.inf, math.nan, 86_401, "thirty"])
def test_a_legacy_lock_timeout_out_of_bounds_is_refused_in_one_line(value: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.build(legacy_lock_timeout=value)
    message = str(refused.value)
    assert "legacy_lock_timeout" in message and "\n" not in message


@pytest.mark.pure
def test_a_legacy_lock_timeout_finer_than_a_millisecond_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.build(legacy_lock_timeout=30.0005)
    message = str(refused.value)
    assert "legacy_lock_timeout" in message and "millisecond" in message and "\n" not in message
    assert Settings.build(legacy_lock_timeout=30.001).legacy_lock_timeout == 30.001


@pytest.mark.pure
def test_the_setting_is_off_unless_given_and_bounded_like_the_lock_timeout() -> None:
    assert Settings().legacy_lock_timeout is None
    assert Settings.build(legacy_lock_timeout=30).legacy_lock_timeout == 30.0
    assert Settings.build(legacy_lock_timeout=86_400).legacy_lock_timeout == 86_400.0


@pytest.mark.pure
def test_replicas_that_disagree_on_it_are_flagged_like_a_lock_timeout() -> None:
    records = [_record(T, LEGACY, "new-a"), _record(T, LEGACY, "new-b"), _record(T, None, "x")]
    stored = replica_records.replica_document(records[0])
    assert stored["legacyLockTimeout"] == LEGACY
    assert ReplicaRecord.from_document(stored) == records[0]
    assert ReplicaRecord.from_document({**stored, "legacyLockTimeout": "30"}) is None
    [found] = disagreements(records)
    assert found.setting == "legacy_lock_timeout"
    assert (
        found.message == "replicas disagree on legacy_lock_timeout: 30s (new-a, new-b); unset (x)"
    )
    assert disagreements([_record(T, None, "a"), _record(T, None, "b")]) == []
    assert records[0].to_dict()["legacy_lock_timeout"] == LEGACY


def test_status_names_the_replicas_that_disagree_on_it(db: Database[Any]) -> None:
    now = Store(db).server_time() or T
    for record in (_record(now, LEGACY, "new-a"), _record(now, None, "next-a")):
        Store(db).record_replica(record)
    [found] = Operations(db).status().disagreements
    assert found.values == (("30s", ("new-a",)), ("unset", ("next-a",)))


def test_orchestrator_status_shows_the_setting_and_warns_of_a_disagreement(
    make: MakeReplica,
    db: Database[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    publish(db, make("new-a", legacy_lock_timeout=LEGACY))
    publish(db, make("next-a"))
    code, out, _ = run(["status", "--uri", URI], capsys)
    assert code == 0
    assert "30s (in-house 30s)" in out  # the lock timeout's cell, whole at any width
    flat = " ".join(out.split())
    assert "replicas disagree on legacy_lock_timeout: 30s (new-a); unset (next-a)" in flat
    code, out, _ = run(["status", "--uri", URI, "--json"], capsys)
    shown = {r["replica_id"]: r["legacy_lock_timeout"] for r in json.loads(out)["replicas"]}
    assert shown == {"new-a": LEGACY, "next-a": None}


def test_a_replica_s_late_write_after_an_old_pod_took_its_expired_lease_is_refused(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """A replica's step stalls past its lease; an old pod then claims the document (it
    writes only ``lockedAt``, leaving the replica's ``lockToken`` as it was). The stalled
    step's late write must not land on the old pod's work: its fence names the lease's
    ``lockedAt`` too while the setting is on, and the old pod's claim changed it. One
    worker: another of this replica's would take the expired lease over itself once the
    clock jumps (as it may: it has run out), so the old pod would find it taken."""
    orch = make(legacy_lock_timeout=LEGACY, lock_timeout=LEGACY, heartbeat=False, max_concurrency=1)
    claimed, go = threading.Event(), threading.Event()
    lost: list[BaseException] = []

    @orch.phase("gateways", "Deleting")
    def stall(lease: Lease[Any]) -> Outcome:
        claimed.set()
        assert go.wait(10)
        try:
            return lease.advance("Deleted")
        except LeaseLost as exc:
            lost.append(exc)
            raise

    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    tick = threading.Thread(target=orch.run_once, kwargs={"heartbeat": False})
    tick.start()
    assert claimed.wait(5)
    clock.advance(LEGACY + 1)  # the replica's lease ran out; an old pod takes the gateway
    pod = LegacyPod("old-0", db, orch.clock.now, platform, latency=lambda: 5.0)
    pod.tick()
    assert pod.busy
    go.set()
    tick.join(5)
    assert not tick.is_alive()
    assert len(lost) == 1
    assert db.gateways.find_one()["phase"] == "Deleting"  # the old pod's step goes on


def test_a_step_goes_on_after_an_extension_whose_reply_was_lost(
    db: Database[Any], clock: FakeClock
) -> None:
    """The heartbeat's extension lands but its reply is lost, with time left: the step's
    next write must land, though the ``lockedAt`` it now names may be either expiry's."""
    faults = Faults(clock=clock)
    orch = Orchestrator(
        faults.wrap(db),
        replica_id="new-a",
        clock=clock,
        lock_timeout=LEGACY,
        legacy_lock_timeout=LEGACY,
        clock_refresh=1e6,
    )
    orch.measure_clock()
    errors: list[BaseException] = []

    @orch.phase("gateways", "Deleting")
    def step(lease: Lease[Any]) -> Outcome:
        clock.advance(5)
        faults.fail_next("update_one", applied=True)
        try:
            lease.extend()
        except StoreError as exc:
            errors.append(exc)
        return lease.advance("Deleted")

    platform = Platform(orch.clock.now)
    _gateway(db, platform, orch.clock.now())
    counts = orch.run_once(heartbeat=False)
    assert len(errors) == 1 and counts.get("advanced") == 1, counts
    doc = db.gateways.find_one()
    assert doc is not None and doc["phase"] == "Deleted"
