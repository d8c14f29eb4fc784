"""The core behaviours on both engines: threaded, async, and sync and async replicas mixed
on one database (``async_view``). Time comes from the FakeClock; steps are held with
events, never with sleeps."""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pymongo.database import Database

from orchestrator import (
    EPOCH,
    AsyncLease,
    AsyncOrchestrator,
    BlockingLease,
    ConfigError,
    Lease,
    LeaseLost,
    Orchestrator,
    OrchestratorError,
    ThreadLease,
)
from orchestrator.core.clock import as_utc
from orchestrator.testing import FakeClock, async_view, memory_database
from tests.engines import MODES, Replica, hold, new_replica, wait
from tests.worker_process import python_process, read_until

pytestmark = pytest.mark.anyio

MakeReplica = Callable[..., Replica]


@pytest.fixture
def db(clock: FakeClock) -> Database[Any]:
    return memory_database(clock=clock)


@pytest.fixture(params=MODES)
async def make(
    request: pytest.FixtureRequest, db: Database[Any], clock: FakeClock
) -> AsyncIterator[MakeReplica]:
    """Replicas of the engine under test on ``db`` (mixed: threaded first, then async, in
    turn); each is stopped at the end of the test."""
    made: list[Replica] = []
    adb = async_view(db)

    def factory(replica_id: str = "pod-1", **options: Any) -> Replica:
        replica = new_replica(request.param, len(made), db, adb, clock, replica_id, **options)
        made.append(replica)
        return replica

    yield factory
    for replica in made:
        await replica.stop(timeout=5)


async def test_contending_replicas_run_each_step_exactly_once(
    make: MakeReplica, db: Database[Any]
) -> None:
    replicas = [make(f"pod-{n}", max_concurrency=3) for n in range(4)]
    db.ledger.create_index("step", unique=True)  # a second run of a step cannot be recorded
    for replica in replicas:

        @replica.phase("jobs", "First")
        async def first(lease: Any) -> Any:
            db.ledger.insert_one({"step": f"{lease.id}/first", "by": lease.doc["lockedBy"]})
            return await lease.advance("Second")

        @replica.phase("jobs", "Second")
        async def second(lease: Any) -> Any:
            db.ledger.insert_one({"step": f"{lease.id}/second", "by": lease.doc["lockedBy"]})
            return await lease.advance("Done")

    for n in range(30):
        await replicas[n % 4].submit("jobs", {"phase": "First", "n": n})
    async with anyio.create_task_group() as group:
        for replica in replicas:
            group.start_soon(replica.run_once)
    for replica in replicas:  # whatever one replica's tick left to the others
        await replica.run_once()

    assert db.jobs.count_documents({"phase": "Done"}) == 30
    assert db.jobs.count_documents({"lastError": {"$exists": True}}) == 0
    assert db.ledger.count_documents({}) == 60
    assert sum(r.stats().get("advanced", 0) for r in replicas) == 60


async def test_a_crashed_holder_s_step_is_taken_over_after_the_lock_timeout_and_fenced(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    # A dead replica renews nothing and claims nothing more: one slot, the held step's. With
    # more, an idle worker's claim still on its way when the clock jumps would take the
    # expired document back for the crashed replica itself, before the taker could.
    crashed = make("pod-crashed", heartbeat=False, max_concurrency=1)
    taker = make("pod-taker")
    box = hold(crashed)

    @taker.phase("jobs", "Running")
    async def take_over(lease: Any) -> Any:
        return await lease.advance("TakenOver")

    await crashed.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(crashed.run_once)
        assert await wait(box["claimed"])
        assert await taker.run_once() == {"ticks": 1}, "a live lease is not taken"
        clock.advance(31)
        assert (await taker.run_once()).get("advanced") == 1
        # The stale holder wakes up: its write is fenced out by the taker's token.
        box["go"].set()
    assert isinstance(box.get("lost"), LeaseLost)
    stored = db.jobs.find_one({})
    assert stored is not None
    assert stored["phase"] == "TakenOver" and stored["lockedBy"] == "pod-taker"
    assert crashed.stats().get("lost") == 1


async def test_a_stale_holder_cannot_release_the_lease_another_holder_took(
    make: MakeReplica, db: Database[Any]
) -> None:
    holder = make("pod-holder")
    box = hold(holder, action="unlock")
    await holder.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(holder.run_once)
        assert await wait(box["claimed"])
        db.jobs.update_one({}, {"$set": {"lockToken": "theirs", "lockedBy": "pod-other"}})
        box["go"].set()
    assert isinstance(box.get("lost"), LeaseLost)
    stored = db.jobs.find_one({})
    assert stored is not None
    assert stored["lockToken"] == "theirs" and stored["lockedBy"] == "pod-other"
    assert stored["lockedUntil"] != EPOCH


async def test_a_relock_waits_and_its_wait_grows(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make()
    seen: list[int] = []

    @orch.phase("jobs", "Waiting")
    async def poll(lease: Any) -> Any:
        seen.append(lease.doc.get("relocks", 0))
        return await lease.relock()

    await orch.submit("jobs", {"phase": "Waiting"})
    waits = []
    for _ in range(4):
        clock.advance(20)
        assert (await orch.run_once()).get("relocked") == 1
        stored = db.jobs.find_one({})
        assert stored is not None
        waits.append((as_utc(stored["lockedUntil"]) - clock.now()).total_seconds())
        assert (await orch.run_once()).get("claimed") is None, "not before its wait"
    assert seen == [0, 1, 2, 3]
    assert waits == sorted(waits) and waits[-1] > waits[0]


async def test_errors_are_retried_then_the_document_moves_to_the_failed_phase(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(max_attempts=2)

    @orch.phase("jobs", "Running")
    async def broken(lease: Any) -> Any:
        raise RuntimeError("the SDK said no")

    await orch.submit("jobs", {"phase": "Running"})
    assert (await orch.run_once()).get("retrying") == 1
    stored = db.jobs.find_one({})
    assert stored is not None
    assert stored["phase"] == "Running" and stored["attempts"] == 1
    assert stored["lastError"]["type"] == "RuntimeError"
    clock.advance(orch.orch.settings.max_wait + 1)
    assert (await orch.run_once()).get("failed") == 1
    stored = db.jobs.find_one({})
    assert stored is not None
    assert stored["phase"] == "Failed" and stored["attempts"] == 2
    assert stored["failedBy"] == 'jobs {"phase": "Running"}'
    assert stored["lastError"]["message"] == "the SDK said no"


async def test_the_heartbeat_extends_a_long_step_s_lease(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    # Minutes: run_once's own heartbeat, every lock_timeout/6 of real time (50 s), never
    # runs during the test, so each extension below is this test's heartbeat call.
    worker = make("pod-worker", lock_timeout=300, tick=300, step_timeout=None)
    other = make("pod-other")
    box = hold(worker)
    stolen: list[int] = []

    @other.phase("jobs", "Running")
    async def steal(lease: Any) -> Any:
        stolen.append(1)
        return await lease.advance("Stolen")

    await worker.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run_once)
        assert await wait(box["claimed"])
        clock.advance(100)
        assert await worker.heartbeat() == 0, "not yet half the lock timeout"
        for _ in range(4):  # 700 s in all, far past the 300 s lock timeout
            clock.advance(150)
            assert await worker.heartbeat() == 1
            await other.run_once()
        box["go"].set()
    assert stolen == []
    assert "lost" not in box
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]
    assert worker.stats()["extended"] == 4


async def test_a_step_past_step_timeout_is_counted_failed_and_its_slot_freed(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    worker = make("pod-worker", step_timeout=60, max_attempts=1, tick=30, max_concurrency=1)
    box = hold(worker)
    done: list[str] = []

    @worker.phase("jobs", "Next")
    async def next_step(lease: Any) -> Any:
        done.append(lease.doc["name"])
        return await lease.advance("Done")

    await worker.submit("jobs", {"name": "stuck", "phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run_once)
        assert await wait(box["claimed"])
        for _ in range(3):
            clock.advance(20)
            await worker.heartbeat()
    # run_once returned: the tick no longer waits for the step it gave up on.
    stuck = db.jobs.find_one({"name": "stuck"})
    assert stuck is not None
    assert stuck["phase"] == "Failed" and stuck["lastError"]["type"] == "StepTimeout"
    assert worker.stats()["timed_out"] == 1
    assert box["lease"].held is False

    # Its only slot is free again: the next document runs while the stuck step is out.
    await worker.submit("jobs", {"name": "next", "phase": "Next"})
    assert (await worker.run_once()).get("advanced") == 1
    assert done == ["next"]

    box["go"].set()
    if worker.threaded:  # the thread step returns at last: its late write is fenced out
        assert await wait(box["returned"])
        assert isinstance(box.get("lost"), LeaseLost)
    else:  # the async step was cancelled
        assert box.get("cancelled") is True
    assert db.jobs.find_one({"name": "stuck"})["phase"] == "Failed"  # type: ignore[index]


async def test_a_step_that_hangs_after_releasing_its_lease_still_frees_its_slot(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    worker = make("pod-worker", step_timeout=60, tick=30, max_concurrency=1)
    released = threading.Event()
    go = threading.Event()

    @worker.phase("jobs", "Running")
    async def advance_then_hang(lease: Any) -> Any:
        outcome = await lease.advance("Parked", note="released")
        released.set()
        await wait(go)  # then never returns (until the test lets it)
        return outcome

    @worker.phase("jobs", "Next")
    async def next_step(lease: Any) -> Any:
        return await lease.advance("Done")

    await worker.submit("jobs", {"name": "hangs", "phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run_once)
        assert await wait(released)
        for _ in range(3):
            clock.advance(25)
            await worker.heartbeat()
    assert worker.stats()["timed_out"] == 1
    # The document it released is left as released: no attempt, no error written over it.
    hung = db.jobs.find_one({"name": "hangs"})
    assert hung is not None
    assert hung["phase"] == "Parked" and hung["note"] == "released"
    assert hung.get("attempts", 0) == 0
    assert "lastError" not in hung

    # Its only slot is free again.
    await worker.submit("jobs", {"name": "next", "phase": "Next"})
    assert (await worker.run_once()).get("advanced") == 1
    go.set()


async def test_stop_hands_back_claimed_but_unstarted_leases(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make(max_concurrency=2)
    box = hold(orch)
    for name in ("first", "second"):
        await orch.submit("jobs", {"name": name, "phase": "Running"})

    # The stop is asked while the second claim's round trip is under way.
    store = orch.orch._store
    real_claim = store.claim
    claims: list[int] = []
    second_claimed = threading.Event()

    def stop_on_second(result: Any) -> Any:
        claims.append(1)
        if len(claims) == 2:
            orch.request_stop()
            second_claimed.set()
        return result

    if orch.threaded:
        store.claim = lambda *a, **k: stop_on_second(real_claim(*a, **k))
    else:

        async def claim(*a: Any, **k: Any) -> Any:
            return stop_on_second(await real_claim(*a, **k))

        store.claim = claim

    async with anyio.create_task_group() as group:
        group.start_soon(orch.run_once)
        assert await wait(box["claimed"])
        assert await wait(second_claimed)
        box["go"].set()
        report = await orch.stop(timeout=5)

    second = db.jobs.find_one({"name": "second"})
    assert second is not None
    assert report.released == [f"jobs/{second['_id']}"]
    assert report.still_running == []
    assert second["lockedUntil"] == EPOCH and "lockToken" not in second
    assert db.jobs.find_one({"name": "first"})["phase"] == "Done"  # type: ignore[index]


async def test_start_and_stop_serve_in_the_background_and_refuse_a_second_start(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()
    finished = threading.Event()

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        outcome = await lease.advance("Done")
        finished.set()
        return outcome

    for _ in range(3):
        await orch.start()
        with pytest.raises(Exception, match="already started"):
            await orch.start()
        await orch.stop(timeout=5)
    await orch.start()
    await orch.submit("jobs", {"phase": "Running"})  # a local submit wakes a worker at once
    assert await wait(finished)
    await orch.stop(timeout=5)
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]
    assert orch.orch._books.workers <= orch.orch.settings.max_concurrency


# -- the async engine only -----------------------------------------------------------------


@pytest.fixture
def aorch(db: Database[Any], clock: FakeClock) -> AsyncOrchestrator:
    return AsyncOrchestrator(async_view(db), replica_id="pod-a", clock=clock, clock_refresh=1e6)


async def test_a_plain_def_handler_runs_in_a_thread_with_a_blocking_lease(
    aorch: AsyncOrchestrator, db: Database[Any]
) -> None:
    threads: list[str] = []

    @aorch.phase("jobs", "Running")
    def blocking(lease: Lease[Any]) -> Any:
        threads.append(threading.current_thread().name)
        db.side.insert_one({"for": lease.id})  # a blocking SDK call
        return lease.advance("Done", by="thread")

    loop_thread = threading.current_thread().name
    await aorch.submit("jobs", {"phase": "Running"})
    assert (await aorch.run_once()).get("advanced") == 1
    assert threads and threads[0] != loop_thread
    stored = db.jobs.find_one({})
    assert stored is not None and stored["phase"] == "Done" and stored["by"] == "thread"
    await aorch.stop()


async def test_an_async_handler_awaits_the_application_s_own_coroutines(
    aorch: AsyncOrchestrator, db: Database[Any]
) -> None:
    answered = anyio.Event()

    async def remove_triggers(name: str) -> int:  # the app's own async service
        await answered.wait()
        return len(name)

    @aorch.phase("jobs", "Deleting")
    async def delete(lease: AsyncLease[Any]) -> Any:
        removed = await remove_triggers(lease.doc["name"])
        return await lease.advance("Deleted", removed=removed)

    await aorch.submit("jobs", {"name": "gw", "phase": "Deleting"})
    async with anyio.create_task_group() as group:
        group.start_soon(aorch.run_once)
        answered.set()
    stored = db.jobs.find_one({})
    assert stored is not None and stored["phase"] == "Deleted" and stored["removed"] == 2
    await aorch.stop()


async def test_run_once_from_inside_a_step_is_refused(aorch: AsyncOrchestrator) -> None:
    refused: list[Exception] = []

    @aorch.phase("jobs", "Running")
    async def reentrant(lease: AsyncLease[Any]) -> Any:
        try:
            await aorch.run_once()
        except OrchestratorError as exc:
            refused.append(exc)
        return await lease.advance("Done")

    await aorch.submit("jobs", {"phase": "Running"})
    assert (await aorch.run_once()).get("advanced") == 1
    assert "inside a step" in str(refused[0])
    await aorch.stop()


async def test_stopping_and_starting_again_leaves_one_set_of_workers(
    aorch: AsyncOrchestrator,
) -> None:
    @aorch.phase("jobs", "Running")
    async def step(lease: AsyncLease[Any]) -> Any:
        return await lease.advance("Done")

    for _ in range(5):
        await aorch.start()
        await aorch.stop(timeout=5)
    await aorch.start()
    workers = [t for t in asyncio.all_tasks() if t.get_name() == "orchestrator-pod-a"]
    assert len(workers) == aorch.settings.max_concurrency
    await aorch.stop(timeout=5)


async def test_a_timed_out_async_step_that_swallows_its_cancellation_leaves_its_worker(
    db: Database[Any], clock: FakeClock
) -> None:
    """The async engine awaits a step in its worker's own task, and step_timeout cancels
    that task: the worker must outlive the cancellation, even when the step swallows it
    and returns, and carry no cancellation over into its next step (one left pending
    would turn a later timeout inside the driver into a CancelledError)."""
    orch = AsyncOrchestrator(
        async_view(db),
        replica_id="pod-a",
        clock=clock,
        clock_refresh=1e6,
        step_timeout=60,
        max_attempts=1,
        tick=30,
        max_concurrency=1,
    )
    claimed, swallowed, ran = asyncio.Event(), asyncio.Event(), asyncio.Event()
    pending: list[int] = []

    @orch.phase("jobs", "Running")
    async def stubborn(lease: AsyncLease[Any]) -> Any:
        claimed.set()
        try:
            await asyncio.Event().wait()  # never set: only the time-out ends it
        except asyncio.CancelledError:
            swallowed.set()
        return None

    @orch.phase("jobs", "Next")
    async def next_step(lease: AsyncLease[Any]) -> Any:
        task = asyncio.current_task()
        pending.append(task.cancelling() if task is not None else -1)
        ran.set()
        return await lease.advance("Done")

    await orch.start()
    await orch.submit("jobs", {"name": "stuck", "phase": "Running"})
    await asyncio.wait_for(claimed.wait(), 10)
    clock.advance(61)
    await orch.heartbeat()
    await asyncio.wait_for(swallowed.wait(), 10)
    await orch.submit("jobs", {"name": "next", "phase": "Next"})
    await asyncio.wait_for(ran.wait(), 10)
    report = await orch.stop(timeout=5)

    stuck = db.jobs.find_one({"name": "stuck"})
    assert stuck is not None and stuck["lastError"]["type"] == "StepTimeout"
    assert orch.stats()["timed_out"] == 1
    # The only worker ran the next step (no tick came to replace it), with nothing pending.
    assert pending == [0]
    assert report.still_running == []


async def test_the_threaded_engine_refuses_an_async_handler(db: Database[Any]) -> None:
    orch = Orchestrator(db)
    with pytest.raises(ConfigError, match="AsyncOrchestrator"):

        @orch.phase("jobs", "Running")
        async def step(lease: Any) -> Any:
            return None


async def test_run_once_from_inside_a_def_step_is_a_clear_recorded_error(
    aorch: AsyncOrchestrator, db: Database[Any]
) -> None:
    """A plain ``def`` step runs in a thread; its context goes with it, so a run_once it
    asks the loop for is refused instead of waiting for the step that asked."""
    loop = asyncio.get_running_loop()

    @aorch.phase("jobs", "Running")
    def reentrant(lease: Lease[Any]) -> Any:
        # The timeout bounds a hang (the defect); it measures nothing.
        asyncio.run_coroutine_threadsafe(aorch.run_once(), loop).result(timeout=10)
        return lease.advance("Done")

    await aorch.submit("jobs", {"phase": "Running"})
    assert (await aorch.run_once()).get("retrying") == 1
    stored = db.jobs.find_one({})
    assert stored is not None and stored["phase"] == "Running" and stored["attempts"] == 1
    assert stored["lastError"]["type"] == "OrchestratorError"
    assert "inside a step" in stored["lastError"]["message"]
    await aorch.stop()


async def test_stop_returns_when_an_async_step_ignores_cancellation(
    aorch: AsyncOrchestrator, db: Database[Any]
) -> None:
    """stop(timeout) hands back what it could and reports the stubborn step as left to
    expire: it does not wait for a step that swallows its cancellation."""
    started, release = anyio.Event(), anyio.Event()

    @aorch.phase("jobs", "Running")
    async def stubborn(lease: AsyncLease[Any]) -> Any:
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # ignores every cancellation
        return None

    doc = await aorch.submit("jobs", {"phase": "Running"})
    await aorch.start()
    await started.wait()
    with anyio.fail_after(30):  # a bound on a hang, not a measured time
        report = await aorch.stop(timeout=0.1)
    assert report.still_running == [f"jobs/{doc['_id']}"]
    stored = db.jobs.find_one({})
    assert stored is not None and stored["lockToken"] and stored["lockedBy"] == "pod-a"
    release.set()  # the test's own clean-up: the step may end now


STUCK_ASYNC_WORKER = """
import asyncio
import logging
import signal
import sys
import threading

from orchestrator import AsyncOrchestrator
from orchestrator.testing import async_memory_database

logging.basicConfig(level=logging.WARNING)  # the stop report's warning, on stderr


async def main() -> int:
    orch = AsyncOrchestrator(
        async_memory_database(), replica_id="stuck-a", tick=0.05, lock_timeout=30
    )

    @orch.phase("jobs", "Pending")
    def never_returns(lease):
        print("step started", flush=True)
        threading.Event().wait()

    terminated = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminated.set)
    await orch.submit("jobs", {"phase": "Pending"})
    await orch.start()
    await terminated.wait()
    report = await orch.stop(timeout=1)
    print(f"{len(report.still_running)} step(s) still running", flush=True)
    return 1 if report.still_running else 0


sys.exit(asyncio.run(main()))
"""


def test_sigterm_with_a_def_step_that_never_returns_exits_within_the_stop_timeout(
    tmp_path: Path,
) -> None:
    """A plain ``def`` step's thread does not keep the interpreter from exiting: the
    step's lease is left to expire and the program's exit status says so."""
    with python_process(tmp_path, "stuckasync", STUCK_ASYNC_WORKER) as proc:
        read_until(proc, "step started")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)  # a bound on a hang, not a measured time
    assert proc.returncode == 1, err
    assert "1 step(s) still running" in out
    assert "left to expire" in err
    assert "Traceback" not in err


async def test_a_def_step_past_step_timeout_does_not_hold_up_the_next_def_step(
    db: Database[Any], clock: FakeClock
) -> None:
    """The abandoned step keeps its thread until it returns; the next step gets another
    one rather than queueing behind it (a pool of max_concurrency threads would wait)."""
    aorch = AsyncOrchestrator(
        async_view(db),
        replica_id="pod-a",
        clock=clock,
        clock_refresh=1e6,
        tick=30,
        step_timeout=60,
        max_attempts=1,
        max_concurrency=1,
    )
    claimed, go = threading.Event(), threading.Event()
    done: list[str] = []

    @aorch.phase("jobs", "Stuck")
    def stuck(lease: Lease[Any]) -> Any:
        claimed.set()
        go.wait(30)
        return None

    @aorch.phase("jobs", "Next")
    def next_step(lease: Lease[Any]) -> Any:
        done.append(lease.doc["name"])
        return lease.advance("Done")

    await aorch.submit("jobs", {"name": "stuck", "phase": "Stuck"})
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(aorch.run_once)
            assert await wait(claimed)
            for _ in range(3):
                clock.advance(20)
                await aorch.heartbeat()
        assert aorch.stats()["timed_out"] == 1
        await aorch.submit("jobs", {"name": "next", "phase": "Next"})
        with anyio.fail_after(10):  # a bound on a hang, not a measured time
            assert (await aorch.run_once()).get("advanced") == 1
        assert done == ["next"]
    finally:
        go.set()
        await aorch.stop()


RUNNER_ONLY = {
    # The engine's side of waits and children (a handler's are wait_for, create_child...).
    "wait_on",
    "outside_change",
    "end_wait",
    "waiting",
    "made",
    "family",
    "record_error",
    "release",
    "throttled",
    "taken_from",
    "carrier",
    "carried",
    "slots",
    "holds_slots",
    "free_slots",
}  # what the runner calls or sets, not a handler


async def test_a_thread_lease_is_not_a_lease_but_both_are_the_blocking_lease_a_handler_uses(
    aorch: AsyncOrchestrator, db: Database[Any], clock: FakeClock
) -> None:
    """A ``ThreadLease`` is a view on the step's ``AsyncLease``, not a ``Lease`` (it has
    no sync store to write through); everything a handler uses of a ``Lease`` is there,
    with the same signature, and reads the ``AsyncLease``'s state. Both are the one type
    a ``def`` handler annotates, ``BlockingLease``, which names all of it."""
    seen: dict[str, Any] = {}
    threaded = Orchestrator(db, replica_id="pod-t", clock=clock, clock_refresh=1e6)

    @threaded.phase("jobs", "Sync")
    def sync_step(lease: Lease[Any]) -> Any:
        seen["lease"] = lease
        return lease.advance("Done")

    @aorch.phase("jobs", "Thread")
    def thread_step(lease: ThreadLease[Any]) -> Any:
        seen["thread"] = lease
        seen["inside"] = {name: getattr(lease, name) for name in ("held", "lost", "locked_at")}
        return lease.advance("Done")

    await aorch.submit("jobs", {"phase": "Thread"})
    await aorch.run_once()
    await anyio.to_thread.run_sync(threaded.submit, "jobs", {"phase": "Sync"})
    await anyio.to_thread.run_sync(threaded.run_once)
    lease, thread_lease = seen["lease"], seen["thread"]
    assert isinstance(thread_lease, ThreadLease) and not isinstance(thread_lease, Lease)
    assert seen["inside"]["held"] is True and seen["inside"]["lost"] is False
    public = {n for n in [*dir(lease), *vars(lease)] if not n.startswith("_")} - RUNNER_ONLY
    missing = sorted(n for n in public if not hasattr(thread_lease, n))
    assert missing == []
    assert isinstance(lease, BlockingLease) and isinstance(thread_lease, BlockingLease)
    assert sorted(n for n in public if not hasattr(BlockingLease, n)) == []
    for name in sorted(public):
        ours = getattr(thread_lease, name)
        if callable(ours):
            assert inspect.signature(ours) == inspect.signature(getattr(lease, name)), name
        else:
            assert ours == getattr(thread_lease._lease, name), name
    await aorch.stop()
