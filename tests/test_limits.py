"""Cluster-wide limits: ``global_limit=N``, at most N steps of a handler at once across
every replica, and ``rate_limit="N/minute"``, at most N starts per period, kept by
the slots of ``orchestrator.core.limits``. On both engines and every database mode; time
comes from the FakeClock, steps are held with events, never with sleeps.

``-s`` prints the figures of the two fleet tests (the most steps running at once, measured
by the handlers, and the slots recovered after crashes; the starts per period)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.database import Database

from bench.instrument import CountingDatabase, Meter
from orchestrator import ConfigError, Lease, Orchestrator, Settings
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.limits import SLOTS_RECHECK, Limit, LimitKind, Slot, limits_of, parse_rate
from orchestrator.core.names import SLOTS_COLLECTION
from orchestrator.core.queries import limit_slots, replica_records
from orchestrator.core.registry import Handler
from orchestrator.core.replicas import (
    HandlerInfo,
    ReplicaIdentity,
    ReplicaSettings,
    disagreements,
    new_record,
)
from orchestrator.core.resource import EPOCH
from orchestrator.core.scheduler import Claim, Found, Probe, Scheduler
from orchestrator.operations import Operations
from orchestrator.testing import FakeClock, memory_database
from tests.conftest import MakeEither
from tests.engines import Replica, wait

pytestmark = pytest.mark.anyio

KEY = 'jobs {"phase": "Running"}'
UTC_EPOCH = EPOCH.replace(tzinfo=UTC)


class Gauge:
    """Steps running at once, as the handlers measure them (thread-safe: the threaded
    engine's workers and the event loop's tasks enter and leave it). A step of a replica
    the test killed counts as ended from the moment it was killed (``kill``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, str] = {}  # lease token -> replica
        self._dead: set[str] = set()
        self._goals: list[tuple[int, threading.Event]] = []
        self.most = 0
        self.entered = 0

    def enter(self, token: str, replica: str) -> None:
        with self._lock:
            self._running[token] = replica
            self.entered += 1
            self.most = max(self.most, len(self._running))
            for count, reached in self._goals:
                if len(self._running) >= count:
                    reached.set()

    def leave(self, token: str) -> None:
        with self._lock:
            self._running.pop(token, None)

    def reached(self, count: int) -> threading.Event:
        """Set once ``count`` steps run at once."""
        event = threading.Event()
        with self._lock:
            if len(self._running) >= count:
                event.set()
            self._goals.append((count, event))
        return event

    def kill(self) -> list[str]:
        """The replicas running steps now die: their steps end here, as far as anyone can
        tell. Returns those replicas."""
        with self._lock:
            dead = sorted(set(self._running.values()))
            self._dead.update(self._running)
            self._running.clear()
            return dead

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def holders(self) -> set[str]:
        with self._lock:
            return set(self._running.values())


def register(
    pod: Replica, gauge: Gauge, gate: threading.Event | None = None, **limits: Any
) -> None:
    """The limited handler of ``jobs`` in Running on ``pod``: measured by ``gauge``, held
    until ``gate`` is set (if given), then advanced to Done."""

    @pod.phase("jobs", "Running", **limits)
    async def run(lease: Any) -> Any:
        gauge.enter(lease.token, lease.doc["lockedBy"])
        try:
            if gate is not None:
                assert await wait(gate, 30)
        finally:
            gauge.leave(lease.token)
        return await lease.advance("Done")


def ms(moment: datetime) -> datetime:
    """``moment`` as BSON stores it (milliseconds), aware UTC."""
    return as_utc(bson_time(moment))


def slots(db: Database[Any], kind: str = "global") -> list[dict[str, Any]]:
    return list(db[SLOTS_COLLECTION].find({"handler": KEY, "kind": kind}).sort("n", 1))


def held(db: Database[Any], now: datetime) -> list[dict[str, Any]]:
    """The global slots taken at ``now`` (the server's time, as a replica estimates it)."""
    return [s for s in slots(db) if as_utc(s["until"]) > now]


async def drain(pods: list[Replica], db: Database[Any], rounds: int = 20) -> None:
    """Ticks of every replica at once until no job is left to run."""
    for _ in range(rounds):
        if not db.jobs.count_documents({"phase": "Running"}):
            return
        await asyncio.gather(*(pod.run_once() for pod in pods))
    raise AssertionError(f"jobs left: {list(db.jobs.find({'phase': 'Running'}))}")


def ticking(pod: Replica) -> asyncio.Future[dict[str, int]]:
    return asyncio.ensure_future(pod.run_once())


# -- options ---------------------------------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("10/minute", Limit(LimitKind.RATE, 10, "minute")),
        ("1/second", Limit(LimitKind.RATE, 1, "second")),
        ("3/s", Limit(LimitKind.RATE, 3, "second")),
        ("5 / Min", Limit(LimitKind.RATE, 5, "minute")),
        ("7/h", Limit(LimitKind.RATE, 7, "hour")),
        ("10000/hour", Limit(LimitKind.RATE, 10_000, "hour")),
    ],
)
def test_a_rate_limit_is_n_per_second_minute_or_hour(text: str, limit: Limit) -> None:
    assert parse_rate(text) == limit
    assert limit.period == {"second": 1, "minute": 60, "hour": 3600}[limit.unit]
    assert limit.describe() == f"{limit.count}/{limit.unit}" and not limit.follows_lease


@pytest.mark.pure
@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"global_limit": 0}, "global_limit=0: must be >= 1"),
        ({"global_limit": -2}, "global_limit=-2: must be >= 1"),
        ({"global_limit": True}, "global_limit=True: must be a valid integer"),
        ({"global_limit": 1.5}, "global_limit=1.5: must be a valid integer"),
        ({"global_limit": "2"}, "global_limit='2': must be a valid integer"),
        ({"global_limit": 10_001}, "global_limit=10001: must be <= 10000"),
        ({"rate_limit": 10}, "rate_limit=10: must be a valid string"),
        ({"rate_limit": "10/day"}, "rate_limit='10/day': must be N/second, N/minute or N/hour"),
        ({"rate_limit": "10/m"}, "rate_limit='10/m': must be N/second"),
        ({"rate_limit": "0/minute"}, "rate_limit='0/minute': must be N/second"),
        ({"rate_limit": "10001/hour"}, "rate_limit='10001/hour': must be N/second"),
        ({"rate_limit": "-1/s"}, "rate_limit='-1/s': must be N/second"),
        ({"rate_limit": "ten/minute"}, "rate_limit='ten/minute': must be N/second"),
        ({"rate_limit": "10/minute/2"}, "rate_limit='10/minute/2': must be N/second"),
    ],
)
def test_a_bad_limit_is_one_line_naming_the_handler_and_the_option(
    options: dict[str, Any], said: str
) -> None:
    orch = Orchestrator(memory_database())
    with pytest.raises(ConfigError) as caught:
        orch.phase("jobs", "Running", **options)
    text = str(caught.value)
    assert text.startswith(f"invalid handler options of {KEY}: {said}")
    assert "\n" not in text


@pytest.mark.pure
def test_a_handler_s_limits_are_its_rate_then_its_global_limit() -> None:
    orch = Orchestrator(memory_database())

    @orch.phase("jobs", "Running", global_limit=2, rate_limit="10/min")
    def run(lease: Lease[Any]) -> None: ...

    @orch.phase("jobs", "Other")
    def other(lease: Lease[Any]) -> None: ...

    limited, free = orch.handlers
    assert limited.limits == (Limit(LimitKind.RATE, 10, "minute"), Limit(LimitKind.GLOBAL, 2))
    assert free.limits == ()
    assert limits_of(None, None) == ()
    assert Settings().slots_collection == SLOTS_COLLECTION == "orchestrator.slots"
    with pytest.raises(ConfigError, match="slots_collection"):
        Settings.build(slots_collection="system.slots")


@pytest.mark.pure
def test_slot_writes_are_fenced_and_judged_by_the_server_s_time() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rate = Limit(LimitKind.RATE, 3, "minute")
    assert limit_slots.take_slot_filter(KEY, rate, now) == {
        "handler": KEY,
        "kind": "rate",
        "n": {"$lt": 3},
        "until": {"$not": {"$gt": bson_time(now)}},
    }
    assert [d["_id"] for d in limit_slots.slot_documents(KEY, rate)] == [
        f"{KEY}/rate/0",
        f"{KEY}/rate/1",
        f"{KEY}/rate/2",
    ]
    assert limit_slots.slot_fence("s", "t") == {"_id": "s", "token": "t"}
    assert limit_slots.free_slot_update() == {"$set": {"until": EPOCH, "token": None}}
    assert limit_slots.restore_slot_update(None, None) == {"$set": {"until": EPOCH, "token": None}}
    taken = Slot(KEY, Limit(LimitKind.GLOBAL, 1), "s", "t", now, now - timedelta(seconds=1), "old")
    assert taken.recovered, "a global slot left taken by a holder that never freed it"
    assert not Slot(KEY, Limit(LimitKind.GLOBAL, 1), "s", "t", now, UTC_EPOCH, None).recovered
    assert not Slot(KEY, rate, "s", "t", now, now - timedelta(seconds=1), "old").recovered


def _handler(phase: str, limits: tuple[Limit, ...] = ()) -> Handler:
    settings = Settings()
    return Handler(
        func=lambda lease: None,
        collection="jobs",
        match={"phase": phase},
        phase=phase,
        model=None,
        max_attempts=5,
        failed_phase="Failed",
        relock_policy=settings.relock_policy,
        retry_policy=settings.retry_policy,
        key=f"jobs {phase}",
        limits=limits,
    )


@pytest.mark.pure
def test_the_scheduler_carries_no_lease_into_a_limited_handler_and_wakes_it_on_a_freed_slot() -> (
    None
):
    limited, free = _handler("A", (Limit(LimitKind.GLOBAL, 1),)), _handler("B")
    sched = Scheduler([limited, free], max_concurrency=4, budget=100)
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe)
    sched.probed(probe, Found(frozenset({0})))  # work for the limited handler only
    assert not sched.carry(limited, "doc"), "its next step needs a slot: claimed, not carried"
    assert sched.carry(free, "doc")
    claim = sched.next()
    assert isinstance(claim, Claim) and claim.handler is limited
    sched.limited(limited)  # no free slot: the claim comes back empty
    sched.claimed(claim, None)
    assert sched.next() is None and sched.quiet
    assert sched.unlimited(limited), "a slot freed here: it claims again"
    assert not sched.unlimited(limited) and not sched.unlimited(free)
    again = sched.next()
    assert isinstance(again, Claim) and again.handler is limited
    sched.claimed(again, None)  # no document this time: idle, and no slot wakes it
    assert not sched.unlimited(limited) and sched.quiet


@pytest.mark.pure
def test_replicas_that_disagree_on_a_handler_s_limit_are_flagged() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def record(replica: str, *handlers: HandlerInfo) -> Any:
        return new_record(
            ReplicaIdentity(replica, replica, "h", 1, "1", "threaded", now),
            ReplicaSettings(lock_timeout=30, tick=1, max_concurrency=4),
            now=now,
            handlers=handlers,
        )

    def info(global_limit: int | None = None, rate: str | None = None) -> HandlerInfo:
        return HandlerInfo("jobs", "Running", "app:run", KEY, "Failed", (), global_limit, rate)

    other = HandlerInfo("jobs", "Other", "app:other", 'jobs {"phase": "Other"}', "Failed")
    same = [record("a", info(2, "10/minute")), record("b", info(2, "10/minute"), other)]
    assert disagreements(same) == []
    found = disagreements(
        [record("a", info(2)), record("b", info(3, "5/second")), record("c", info(2)), record("d")]
    )
    assert [d.message for d in found] == [
        f"replicas disagree on global_limit of {KEY}: 2 (a, c); 3 (b)",
        f"replicas disagree on rate_limit of {KEY}: none (a, c); 5/second (b)",
    ]
    stored = replica_records.replica_document(record("b", info(3, "5/second")))
    assert stored["handlers"][0]["globalLimit"] == 3
    assert HandlerInfo.read(stored["handlers"][0]) == info(3, "5/second")
    assert HandlerInfo.read({"collection": "jobs"}).global_limit is None  # an older record


# -- global_limit ------------------------------------------------------------------------------


async def test_at_most_global_limit_steps_run_at_once_across_five_replicas(
    replicas: MakeEither, db: Database[Any]
) -> None:
    pods = [await replicas(f"pod-{n}", max_concurrency=2) for n in range(5)]
    gauge, gate = Gauge(), threading.Event()
    for pod in pods:
        register(pod, gauge, gate, global_limit=2)
    for n in range(8):
        await pods[n % 5].submit("jobs", {"phase": "Running", "n": n})
    ticks = [ticking(pod) for pod in pods]
    assert await wait(gauge.reached(2))
    holders = gauge.holders()
    for pod, tick in zip(pods, ticks, strict=True):
        if pod.orch.replica_id not in holders:
            await tick  # found work and no free slot: idle until the next tick
            assert (await pod.run_once()).get("claimed") is None
    assert gauge.running == 2 and gauge.entered == 2
    assert sum(pod.stats().get("limited", 0) for pod in pods) >= 5 - len(holders)
    gate.set()
    await asyncio.gather(*ticks)
    await drain(pods, db)
    assert db.jobs.count_documents({"phase": "Done"}) == 8
    assert gauge.most == 2
    assert held(db, pods[0].clock.now()) == [], "every slot freed when its step ended"
    assert len(slots(db)) == 2


async def test_a_dead_replica_s_slots_come_back_when_its_leases_would_expire(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """global_limit=2 on 5 replicas; the two holding the slots are killed mid-step (their
    leases and slots left to expire): the three others take the slots back once the lock
    timeout has passed, and run every job, their two included."""
    # A dead replica renews nothing: no heartbeat (run_once's own would renew its lease).
    doomed = [await replicas(f"doomed-{n}", heartbeat=False, max_concurrency=1) for n in range(2)]
    living = [await replicas(f"pod-{n}", max_concurrency=2) for n in range(3)]
    gauge, never = Gauge(), threading.Event()
    for pod in doomed:
        register(pod, gauge, never, global_limit=2)
    for pod in living:
        register(pod, gauge, global_limit=2)
    for n in range(6):
        await living[0].submit("jobs", {"phase": "Running", "n": n})
    zombies = [ticking(pod) for pod in doomed]
    assert await wait(gauge.reached(2))
    assert gauge.holders() == {"doomed-0", "doomed-1"}
    for pod in living:
        assert (await pod.run_once()).get("claimed") is None, "both slots are taken"
    assert gauge.kill() == ["doomed-0", "doomed-1"]
    clock.advance(31)
    await drain(living, db)
    assert db.jobs.count_documents({"phase": "Done"}) == 6
    recovered = sum(pod.stats().get("slots_recovered", 0) for pod in living)
    # No step could run until a dead replica's slot was taken back; the second is taken
    # back only if two steps ran at once, which a loaded machine running the replicas'
    # ticks in turn need not do (one slot then serves every job).
    assert 1 <= recovered <= 2
    assert sum(pod.stats().get("taken_over", 0) for pod in living) == 2
    assert gauge.most == 2
    # The dead replicas' steps come back to life: their writes, and the release of their
    # slots, are fenced out.
    never.set()
    await asyncio.gather(*zombies)
    assert [pod.stats().get("lost") for pod in doomed] == [1, 1]
    assert held(db, living[0].clock.now()) == []
    print(
        f"\nglobal_limit=2, 5 replicas, 2 killed mid-step: most steps running at once"
        f" {gauge.most} (of {gauge.entered} steps), slots recovered {recovered}"
    )


async def test_a_stalled_step_that_lost_its_lease_loses_its_slot(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    # Minutes of real time between run_once's own heartbeats: the one below is this test's.
    stalled = await replicas(
        "pod-stalled", lock_timeout=300, tick=300, step_timeout=None, max_concurrency=1
    )
    other = await replicas("pod-other", max_concurrency=1)
    gauge, wake, hold_other = Gauge(), threading.Event(), threading.Event()
    register(stalled, gauge, wake, global_limit=1)
    register(other, gauge, hold_other, global_limit=1)
    await stalled.submit("jobs", {"_id": "a", "phase": "Running"})
    stuck = ticking(stalled)
    assert await wait(gauge.reached(1))
    (slot,) = slots(db)
    first = db.jobs.find_one({"_id": "a"})
    assert first is not None and slot["token"] == first["lockToken"]
    assert as_utc(slot["until"]) == as_utc(first["lockedUntil"]), "the slot lasts as the lease"
    clock.advance(301)  # the stalled step's lease, and its slot, run out
    taking = ticking(other)
    assert await wait(gauge.reached(2))  # the other replica takes both over
    (slot,) = slots(db)
    taker = db.jobs.find_one({"_id": "a"})
    assert taker is not None and taker["lockedBy"] == "pod-other"
    assert slot["token"] == taker["lockToken"]
    assert other.stats().get("slots_recovered") == 1
    # The stalled replica's heartbeat finds its lease expired: lost; the release of its
    # slot, fenced on its token, leaves the other's alone.
    assert await stalled.heartbeat() == 0
    (slot,) = slots(db)
    assert slot["token"] == taker["lockToken"], "a stale holder never frees another's slot"
    wake.set()
    await stuck
    assert stalled.stats().get("lost") == 1
    assert slots(db)[0]["token"] == taker["lockToken"]
    hold_other.set()
    await taking
    assert db.jobs.count_documents({"phase": "Done"}) == 1
    assert held(db, other.clock.now()) == []


async def test_the_heartbeat_renews_the_slot_with_the_lease(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    # Minutes of real time between run_once's own heartbeats: each renewal is this test's.
    holder = await replicas("pod-holder", lock_timeout=300, tick=300, step_timeout=None)
    rival = await replicas("pod-rival", lock_timeout=300, tick=300)
    gauge, gate = Gauge(), threading.Event()
    register(holder, gauge, gate, global_limit=1)
    register(rival, gauge, global_limit=1)
    await holder.submit("jobs", {"_id": "a", "phase": "Running"})
    await holder.submit("jobs", {"_id": "b", "phase": "Running"})
    tick = ticking(holder)
    assert await wait(gauge.reached(1))
    clock.advance(200)
    assert await holder.heartbeat() == 1
    (slot,) = slots(db)
    doc = db.jobs.find_one({"lockedBy": "pod-holder"})
    assert doc is not None and as_utc(slot["until"]) == as_utc(doc["lockedUntil"])
    assert as_utc(slot["until"]) == ms(holder.clock.now() + timedelta(seconds=300))
    clock.advance(200)  # past the first expiry: the renewed slot is still taken
    assert (await rival.run_once()).get("claimed") is None
    assert rival.stats().get("limited", 0) >= 1
    gate.set()
    await tick
    await drain([holder, rival], db)
    assert gauge.most == 1


async def test_step_timeout_takes_the_slot_back_with_the_lease(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    # Minutes of real time between run_once's own heartbeats: the time-out is this test's.
    hung = await replicas(
        "pod-hung", lock_timeout=300, tick=300, step_timeout=600, max_concurrency=1
    )
    gauge, never = Gauge(), threading.Event()
    register(hung, gauge, never, global_limit=1)
    await hung.submit("jobs", {"_id": "a", "phase": "Running"})
    tick = ticking(hung)
    assert await wait(gauge.reached(1))
    (slot,) = slots(db)
    token = slot["token"]
    clock.advance(601)
    await hung.heartbeat()  # takes the step back: its attempt counted, its slot freed
    # (A fresh worker takes the hung one's place and may be claiming with the slot now.)
    assert slots(db)[0]["token"] != token
    never.set()
    await tick
    assert held(db, hung.clock.now()) == []
    assert hung.stats().get("timed_out") == 1


async def test_a_claim_that_finds_nothing_frees_its_global_slot(
    replicas: MakeEither, db: Database[Any]
) -> None:
    pod = await replicas("pod-1")
    gauge = Gauge()
    register(pod, gauge, global_limit=1)
    await pod.submit("jobs", {"phase": "Running"})
    await pod.run_once()  # its step, then one more claim (it had work): nothing, given back
    assert db.jobs.count_documents({"phase": "Done"}) == 1
    assert [(s["until"], s["token"]) for s in slots(db)] == [(EPOCH, None)]


async def test_slots_an_operator_removed_while_replicas_run_are_made_again(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """A replica makes its slots once; if they go (the collection dropped, the documents
    deleted), its next take that finds none counts them and makes them again, so the
    limited handler does not wait forever on slots nobody will make."""
    pod = await replicas("pod-1")
    gauge = Gauge()
    register(pod, gauge, global_limit=2)
    await pod.submit("jobs", {"phase": "Running"})
    await pod.run_once()
    assert len(slots(db)) == 2
    db[SLOTS_COLLECTION].delete_many({})
    clock.advance(SLOTS_RECHECK)
    await pod.submit("jobs", {"phase": "Running"})
    await pod.run_once()
    assert db.jobs.count_documents({"phase": "Done"}) == 2
    assert len(slots(db)) == 2 and held(db, pod.clock.now()) == []


# -- rate_limit --------------------------------------------------------------------------------


async def test_at_most_rate_limit_steps_start_in_any_period_a_burst_of_n_at_once(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    pods = [await replicas(f"pod-{n}") for n in range(3)]
    gauge = Gauge()
    for pod in pods:
        register(pod, gauge, rate_limit="3/minute")
    for n in range(10):
        await pods[n % 3].submit("jobs", {"phase": "Running", "n": n})
    for _ in range(60):  # 5 minutes, a tick of each replica every 5 s
        for pod in pods:
            await pod.run_once()
        clock.advance(5)
    starts = sorted(as_utc(doc["lockedAt"]) for doc in db.jobs.find({"phase": "Done"}))
    assert len(starts) == 10
    window = timedelta(minutes=1)
    most = max(sum(1 for t in starts if s <= t < s + window) for s in starts)
    assert most == 3
    assert starts[0] == starts[1] == starts[2], "a burst of 3 at once"
    per_period = [
        sum(1 for t in starts if starts[0] + k * window <= t < starts[0] + (k + 1) * window)
        for k in range(4)
    ]
    assert per_period == [3, 3, 3, 1]
    assert len(slots(db, "rate")) == 3
    print(f"\nrate_limit=3/minute, 3 replicas, 10 jobs: starts per minute {per_period}")


async def test_a_rate_slot_whose_claim_finds_nothing_is_given_back(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    pod = await replicas("pod-1")
    gauge = Gauge()
    register(pod, gauge, rate_limit="2/minute")
    await pod.submit("jobs", {"_id": "a", "phase": "Running"})
    await pod.run_once()  # a's step; the next claim finds nothing and gives its slot back
    taken = [s for s in slots(db, "rate") if as_utc(s["until"]) > UTC_EPOCH]
    assert len(taken) == 1
    assert as_utc(taken[0]["until"]) == ms(pod.clock.now() + timedelta(minutes=1))
    await pod.submit("jobs", {"_id": "b", "phase": "Running"})
    await pod.submit("jobs", {"_id": "c", "phase": "Running"})
    await pod.run_once()
    assert db.jobs.count_documents({"phase": "Done"}) == 2, "b started; c waits for a minute"
    clock.advance(59)
    await pod.run_once()
    assert db.jobs.count_documents({"phase": "Done"}) == 2
    clock.advance(1)
    await pod.run_once()
    assert db.jobs.count_documents({"phase": "Done"}) == 3


async def test_a_rate_slot_another_replica_gives_back_is_taken_within_the_recheck_not_the_period(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """A replica that found a rate limit full waits for the next slot as it read it (an
    hour away here), but takes again after SLOTS_RECHECK: a slot another replica gave back
    (its claim found nothing) is free at once, and only a take sees it."""
    first, second = await replicas("pod-a"), await replicas("pod-b")
    gauge = Gauge()
    for pod in (first, second):
        register(pod, gauge, rate_limit="1/hour")
    claiming, go = threading.Event(), threading.Event()
    store: Any = second.orch._store
    real_claim = store.claim
    if second.threaded:

        def held_claim(*args: Any, **kwargs: Any) -> Any:
            claiming.set()
            assert go.wait(10)
            return real_claim(*args, **kwargs)

        store.claim = held_claim
    else:

        async def async_held_claim(*args: Any, **kwargs: Any) -> Any:
            claiming.set()
            assert await wait(go)
            return await real_claim(*args, **kwargs)

        store.claim = async_held_claim
    await first.submit("jobs", {"_id": "gone", "phase": "Running"})
    tick = ticking(second)  # takes the hour's one slot, then its claim waits
    assert await wait(claiming)
    assert (await first.run_once()).get("limited") == 1  # full until the hour is over
    db.jobs.delete_one({"_id": "gone"})  # its claim will find nothing: the slot given back
    go.set()
    await tick
    assert [as_utc(s["until"]) for s in slots(db, "rate")] == [UTC_EPOCH]
    await first.submit("jobs", {"_id": "waiting", "phase": "Running"})
    clock.advance(SLOTS_RECHECK)
    await first.run_once()
    assert db.jobs.find_one({"_id": "waiting"}, {"phase": 1}) == {"_id": "waiting", "phase": "Done"}


def test_a_replica_waiting_for_a_rate_slot_takes_again_each_recheck_and_reads_nothing_more() -> (
    None
):
    """Waiting for a 1/hour limit's next slot, with work there, costs a take each
    SLOTS_RECHECK (with the store's recount of the slots) and no read of the next free
    one, which stands; at the other ticks, only the probe."""
    clock = FakeClock()
    meter = Meter()
    db = CountingDatabase(memory_database(clock=clock), meter)
    orch = Orchestrator(db, replica_id="pod", clock=clock, clock_refresh=1e6)  # type: ignore[arg-type]

    @orch.phase("jobs", "A", rate_limit="1/hour")
    def a(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.submit("jobs", {"_id": 1, "phase": "A"})
    orch.submit("jobs", {"_id": 2, "phase": "A"})
    orch.measure_clock()
    orch.run_once()  # 1 starts; 2 finds the hour's slot taken and reads when it frees
    meter.reset()
    ticks = 6 * int(SLOTS_RECHECK)
    for _ in range(ticks):
        clock.advance(1)
        orch.run_once()
    rechecks = ticks // int(SLOTS_RECHECK)
    assert dict(meter.ops) == {
        "aggregate": ticks,  # the probe of each tick
        "find_one_and_update": 2 * rechecks,  # a take, and again after the recount
        "list_indexes": rechecks,
        "count_documents": rechecks,
    }
    assert db.jobs.count_documents({"phase": "Done"}) == 1


# -- the carry, the cost -------------------------------------------------------------------


async def test_no_lease_is_carried_into_a_limited_handler_one_is_carried_out_of_it(
    replicas: MakeEither, db: Database[Any]
) -> None:
    pod = await replicas("pod-1", max_concurrency=1)
    seen: list[tuple[str, int]] = []

    @pod.phase("jobs", "Free")
    async def free(lease: Any) -> Any:
        return await lease.advance("Running")  # into the limited phase: released

    @pod.phase("jobs", "Running", global_limit=1)
    async def limited(lease: Any) -> Any:
        seen.append(("Running", len(held(db, pod.clock.now()))))
        if not lease.doc.get("again"):
            return await lease.unlock(again=True)  # its own next step: released, claimed
        return await lease.advance("After")  # out of it: carried, its slot freed

    @pod.phase("jobs", "After")
    async def after(lease: Any) -> Any:
        seen.append(("After", len(held(db, pod.clock.now()))))
        return await lease.advance("Done")

    await pod.submit("jobs", {"phase": "Free"})
    counts = await pod.run_once()
    assert db.jobs.count_documents({"phase": "Done"}) == 1
    assert seen == [("Running", 1), ("Running", 1), ("After", 0)]
    assert counts.get("carried") == 1  # Running -> After only
    assert counts.get("claimed") == 3  # Free, Running, Running again


def test_a_handler_without_limits_costs_no_extra_command() -> None:
    """The same three-step workflow, counted: unlimited, it sends what it sent before the
    limits existed (a probe, a claim, a carry per later step, the last release, and a
    last claim that finds nothing); a limit on its first step adds the slots' writes."""

    def commands(**options: Any) -> dict[str, int]:
        clock = FakeClock()
        meter = Meter()
        db = CountingDatabase(memory_database(clock=clock), meter)
        orch = Orchestrator(db, replica_id="pod", clock=clock, max_concurrency=1)  # type: ignore[arg-type]

        @orch.phase("jobs", "A", **options)
        def a(lease: Lease[Any]) -> Any:
            return lease.advance("B")

        @orch.phase("jobs", "B")
        def b(lease: Lease[Any]) -> Any:
            return lease.advance("C")

        @orch.phase("jobs", "C")
        def c(lease: Lease[Any]) -> Any:
            return lease.advance("Done")

        orch.submit("jobs", {"phase": "A"})
        orch.measure_clock()
        orch.ensure_indexes()
        meter.reset()
        orch.run_once()
        assert db.jobs.count_documents({"phase": "Done"}) == 1
        return dict(meter.ops)

    # Its last claim (the handler had work: it looks again) finds nothing.
    assert commands() == {"aggregate": 1, "find_one_and_update": 4, "update_one": 1}
    # A slot taken and freed for A's step, and for its last claim.
    assert commands(global_limit=1) == {"aggregate": 1, "find_one_and_update": 6, "update_one": 3}
    # A slot taken for A's step; one for its last claim, given back.
    assert commands(rate_limit="5/minute") == {
        "aggregate": 1,
        "find_one_and_update": 6,
        "update_one": 2,
    }


# -- the slots and the records ---------------------------------------------------------------


async def test_start_makes_each_limit_s_slots_once_and_publishes_the_limits(
    replicas: MakeEither, db: Database[Any]
) -> None:
    pods = [await replicas(f"pod-{n}") for n in range(2)]
    limits = [{"global_limit": 2, "rate_limit": "10/minute"}, {"global_limit": 3}]
    for pod, options in zip(pods, limits, strict=True):

        @pod.phase("jobs", "Running", **options)
        async def run(lease: Any) -> Any:
            return await lease.advance("Done")

        await pod.start()
    assert [s["n"] for s in slots(db)] == [0, 1, 2]  # the larger count's slots too
    assert len(slots(db, "rate")) == 10
    assert all(s["until"] == EPOCH for s in slots(db) + slots(db, "rate"))
    status = Operations(db).status()
    published = {
        r.replica_id: [(h.global_limit, h.rate_limit) for h in r.handlers] for r in status.replicas
    }
    assert published == {"pod-0": [(2, "10/minute")], "pod-1": [(3, None)]}
    assert [d.message for d in status.disagreements] == [
        f"replicas disagree on global_limit of {KEY}: 2 (pod-0); 3 (pod-1)",
        f"replicas disagree on rate_limit of {KEY}: 10/minute (pod-0); none (pod-1)",
    ]
