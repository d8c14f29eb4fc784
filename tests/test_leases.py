"""Claims under contention, crashes, fencing, clock skew, and continuing at once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

from orchestrator import Lease, LeaseLost
from orchestrator.testing import FakeClock, memory_database
from tests.conftest import MakeEither, MakeReplica
from tests.engines import wait
from tests.holding import hold_step

STEPS = ["A", "B", "C"]


def test_eight_replicas_run_each_step_of_500_documents_exactly_once(
    make: MakeReplica, db: Database[Any]
) -> None:
    db.effects.create_index([("doc", 1), ("step", 1)], unique=True)
    replicas = [make(f"pod-{n}", max_concurrency=2) for n in range(8)]
    for orch in replicas:
        for step, nxt in zip(STEPS, [*STEPS[1:], "Done"], strict=True):

            def handler(
                lease: Lease[Any], step: str = step, nxt: str = nxt, who: str = orch.replica_id
            ) -> Any:
                # A second run of a step would raise DuplicateKeyError and be recorded.
                db.effects.insert_one({"doc": lease.id, "step": step, "by": who})
                return lease.advance(nxt)

            orch.phase("items", step)(handler)
    for n in range(500):
        replicas[0].submit("items", {"n": n, "phase": "A"})

    barrier = threading.Barrier(len(replicas))
    errors: list[BaseException] = []

    def run(orch: Any) -> None:
        barrier.wait()
        try:
            orch.run_once()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(o,)) for o in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert db.items.count_documents({"phase": "Done"}) == 500
    assert db.effects.count_documents({}) == 1500
    assert db.items.count_documents({"lastError": {"$exists": True}}) == 0
    steps = sum(o.stats().get("advanced", 0) for o in replicas)
    assert steps == 1500
    busy = [o for o in replicas if o.stats().get("advanced", 0) > 0]
    assert len(busy) > 1, "the work should be shared between replicas"
    by_replica = {e["by"] for e in db.effects.find({}, {"by": 1})}
    assert by_replica == {o.replica_id for o in busy}


def test_a_five_step_cascade_takes_one_tick_not_five(make: MakeReplica, db: Database[Any]) -> None:
    orch = make(max_concurrency=1)
    done: list[int] = []

    @orch.phase("gateways", "Deleting")
    def delete_children(lease: Lease[Any]) -> Any:
        left = lease.doc.get("children", 0)
        if left:
            done.append(left)
            return lease.unlock(children=left - 1)
        return lease.advance("Deleted")

    orch.submit("gateways", {"phase": "Deleting", "children": 5})
    counts = orch.run_once()
    assert done == [5, 4, 3, 2, 1]
    # One claim; each unlock carries the lease on into the next step: no claim between.
    assert counts == {"claimed": 1, "carried": 5, "unlocked": 5, "advanced": 1, "ticks": 1}
    assert db.gateways.find_one({})["phase"] == "Deleted"  # type: ignore[index]


class Crash(BaseException):
    """The replica dies mid-step: nothing after this line runs, no lease is released."""


def test_a_crashed_replicas_lease_is_taken_over_only_after_the_lock_timeout(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    dying, survivor = make("pod-dying"), make("pod-survivor")
    ran: list[str] = []

    @dying.phase("jobs", "Running")
    def die(lease: Lease[Any]) -> Any:
        ran.append("dying")
        raise Crash

    @survivor.phase("jobs", "Running")
    def finish(lease: Lease[Any]) -> Any:
        ran.append("survivor")
        return lease.advance("Done")

    survivor.submit("jobs", {"phase": "Running"})
    dying.run_once()
    assert ran == ["dying"]
    held = db.jobs.find_one({})
    assert held is not None and held["lockedBy"] == "pod-dying" and held["lockToken"]

    clock.advance(29.9)
    survivor.run_once()
    assert ran == ["dying"], "nobody may claim before the lock timeout"

    clock.advance(0.2)
    survivor.run_once()
    assert ran == ["dying", "survivor"]
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


@pytest.mark.parametrize("action", ["unlock", "advance", "relock", "extend"])
def test_a_stale_holder_cannot_overwrite_the_new_holders_lease(
    make: MakeReplica, db: Database[Any], clock: FakeClock, action: str
) -> None:
    # Frozen (a GC pause, a stalled VM): it cannot heartbeat while it stalls, and with
    # one slot it cannot claim its own expired document again either.
    stale = make("pod-stale", heartbeat=False, max_concurrency=1)
    fresh = make("pod-fresh")
    old = hold_step(stale, action)
    new = hold_step(fresh, "advance")
    stale.submit("jobs", {"phase": "Running"})

    t_stale = threading.Thread(target=stale.run_once)
    t_stale.start()
    assert old["claimed"].wait(5)

    clock.advance(31)  # the stale holder stalls past its lease
    t_fresh = threading.Thread(target=fresh.run_once)
    t_fresh.start()
    assert new["claimed"].wait(5)
    taken = db.jobs.find_one({})
    assert taken is not None and taken["lockedBy"] == "pod-fresh"

    old["go"].set()  # the stale one wakes up and tries to write
    t_stale.join()
    assert isinstance(old.get("lost"), LeaseLost)
    now_held = db.jobs.find_one({})
    assert now_held == taken, "the new holder's lease must be intact"
    assert stale.stats().get("lost") == 1

    new["go"].set()
    t_fresh.join()
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


def test_a_handler_that_unlocks_without_progress_cannot_spin_the_database(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(max_unlocks_per_tick=20, max_concurrency=1)
    calls: list[int] = []

    @orch.phase("jobs", "Stuck")
    def no_progress(lease: Lease[Any]) -> Any:
        calls.append(1)
        return lease.unlock()

    orch.submit("jobs", {"phase": "Stuck"})
    orch.run_once()
    assert len(calls) == 21  # 20 at once, then the 21st unlock waits a tick
    clock.advance(1.01)
    orch.run_once()
    assert len(calls) == 42


def test_a_replica_whose_clock_is_20s_ahead_steals_no_live_lease(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    honest = make("pod-honest", heartbeat=False, max_concurrency=1)
    ahead = make("pod-ahead", clock=clock.skewed(+20))
    behind = make("pod-behind", clock=clock.skewed(-20))
    held = hold_step(honest, "unlock")
    taken: list[str] = []
    for orch in (ahead, behind):

        @orch.phase("jobs", "Running")
        def take(lease: Lease[Any], who: str = orch.replica_id) -> Any:
            taken.append(who)
            return lease.advance("Done")

    honest.submit("jobs", {"phase": "Running"})
    t = threading.Thread(target=honest.run_once)
    t.start()
    assert held["claimed"].wait(5)

    clock.advance(15)  # by its own clock, pod-ahead sees the lease 35 s old
    ahead.run_once()
    behind.run_once()
    assert taken == []

    clock.advance(16)  # 31 s by the server: the lease has really expired
    ahead.run_once()
    assert taken == ["pod-ahead"]
    held["go"].set()
    t.join()
    assert isinstance(held.get("lost"), LeaseLost)


def test_handlers_share_a_tick_fairly(make: MakeReplica, db: Database[Any]) -> None:
    orch = make(max_concurrency=1)
    order: list[str] = []
    for kind in ("a", "b", "c"):

        @orch.phase(kind, "Todo")
        def step(lease: Lease[Any], kind: str = kind) -> Any:
            order.append(kind)
            return lease.advance("Done")

        for _ in range(3):
            orch.submit(kind, {"phase": "Todo"})
    orch.run_once()
    assert sorted(order) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert order[:3] in (["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"])


def test_steps_run_concurrently_up_to_max_concurrency(make: MakeReplica) -> None:
    orch = make(max_concurrency=3)
    arrived = threading.Barrier(3, timeout=5)
    peak: list[int] = []
    lock = threading.Lock()
    running = [0]

    @orch.phase("jobs", "Todo")
    def step(lease: Lease[Any]) -> Any:
        with lock:
            running[0] += 1
            peak.append(running[0])
        if len(peak) <= 3:
            arrived.wait()  # three steps are in flight at once, or this times out
        with lock:
            running[0] -= 1
        return lease.advance("Done")

    for _ in range(7):
        orch.submit("jobs", {"phase": "Todo"})
    orch.run_once()
    assert max(peak) == 3
    assert orch.stats()["advanced"] == 7


def test_side_effect_collection_rejects_a_second_run() -> None:
    """The contention test counts on this: a repeated step would fail loudly."""
    db = memory_database()
    db.effects.create_index([("doc", 1), ("step", 1)], unique=True)
    db.effects.insert_one({"doc": 1, "step": "A"})
    with pytest.raises(DuplicateKeyError):
        db.effects.insert_one({"doc": 1, "step": "A"})


@pytest.mark.anyio
@pytest.mark.parametrize("tail", [0.9, 1.2])
async def test_a_step_carried_on_after_a_long_tail_runs_once(
    replicas: MakeEither, db: Database[Any], clock: FakeClock, tail: float
) -> None:
    # A's handler advances (the lease is carried on into B's step at once), then keeps
    # working for most of a lock timeout (0.9) or longer (1.2) before it returns. B must run
    # once: on a lease renewed when it starts (0.9), or on the other replica that took the
    # carried lease over when it expired, the worker handing it back (1.2).
    # step_timeout as short as allowed: B's own clock starts when B starts, not at the carry.
    worker = await replicas("pod-worker", max_concurrency=1, step_timeout=30)
    other = await replicas("pod-other")
    runs: list[str] = []
    advanced, tail_over = threading.Event(), threading.Event()
    b_started, b_go = threading.Event(), threading.Event()

    @worker.phase("jobs", "A")
    async def advance_then_work_on(lease: Any) -> Any:
        outcome = await lease.advance("B")
        advanced.set()
        await wait(tail_over)  # cleanup, a notification: work after the outcome
        return outcome

    @worker.phase("jobs", "B")
    async def b_held(lease: Any) -> Any:
        runs.append("pod-worker")
        b_started.set()
        await wait(b_go)
        return await lease.advance("Done")

    @other.phase("jobs", "B")
    async def b_other(lease: Any) -> Any:
        runs.append("pod-other")
        return await lease.advance("Done")

    await worker.submit("jobs", {"phase": "A"})
    # The tick beats not on its own: a beat of real time after the clock's advance would
    # extend the carried lease (or time A out), so what expires is this test's to say.
    tick = asyncio.create_task(worker.run_once(heartbeat=False))
    lock_timeout = worker.settings.lock_timeout
    assert await wait(advanced)
    clock.advance(lock_timeout * tail)
    took = await other.run_once()
    tail_over.set()
    if tail > 1:
        assert took.get("taken_over") == 1, took
    else:
        assert runs == [], "the carried lease holds while the step before it works on"
        assert await wait(b_started)
        clock.advance(lock_timeout * 0.3)  # past the carried lease's first expiry
        await other.run_once()
        await worker.heartbeat()  # 1.2 lock timeouts after the carry, 0.3 after B started
        b_go.set()
    await tick
    assert runs == (["pod-worker"] if tail < 1 else ["pod-other"])
    assert "timed_out" not in worker.stats()
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]
