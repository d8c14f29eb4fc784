"""Cancellations in and around a step.

A ``CancelledError`` the handler raises is its error: recorded, counted, its lease released.
The engine's own cancellations leave the books straight: step_timeout's (the slot comes
back even from a step that swallows the cancellation) and the event loop's end (the step
leaves the books, its lease is left to expire). An ``AsyncOrchestrator`` moves to a new
loop once its first one is over, or refuses clearly; a ``ThreadLease`` never waits for a
loop that no longer runs; a stopped replica runs a tick by hand.

Time comes from the FakeClock. ``HANG_GUARD`` bounds what would hang without the fixes, so
a regression fails instead of hanging the suite: it measures nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator import (
    AsyncLease,
    AsyncOrchestrator,
    LeaseLost,
    Listener,
    Orchestrator,
    OrchestratorError,
    StepFinishedEvent,
    ThreadLease,
)
from orchestrator.core.names import SLOTS_COLLECTION
from orchestrator.core.queries import limit_slots
from orchestrator.core.resource import EPOCH
from orchestrator.testing import FakeClock, async_view, memory_database
from tests.conftest import MakeEither
from tests.engines import Replica, wait

HANG_GUARD = 30.0
"""Seconds a call may take before the test calls it hung (a bound, not a timing)."""


class Finished(Listener):
    """The ``StepFinishedEvent`` outcomes, in order (called from worker threads too)."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self._lock = threading.Lock()

    def step_finished(self, event: StepFinishedEvent) -> None:
        with self._lock:
            self.outcomes.append(event.outcome)


async def workers_ended(replica: Replica) -> None:
    """Until the replica's workers have ended (after run_once, only a worker whose step
    step_timeout abandoned is left, and it ends when its step returns)."""
    name = f"orchestrator-{replica.settings.replica_id}"
    if replica.threaded:
        for thread in [t for t in threading.enumerate() if t.name == name]:
            await anyio.to_thread.run_sync(thread.join, HANG_GUARD)
            assert not thread.is_alive()
    else:
        tasks = [t for t in asyncio.all_tasks() if t.get_name() == name]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=HANG_GUARD)
            assert not pending


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close ``loop`` as ``asyncio.run`` does: its tasks cancelled and finished first."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def async_replica(clock: FakeClock, **options: Any) -> tuple[Database[Any], AsyncOrchestrator]:
    """An in-memory database and an AsyncOrchestrator on it (no loop bound yet)."""
    db = memory_database(clock=clock)
    options.setdefault("tick", 30)
    orch = AsyncOrchestrator(
        async_view(db), replica_id="pod-a", clock=clock, clock_refresh=1e6, **options
    )
    return db, orch


# -- a CancelledError the handler raises is its error ----------------------------------------


@pytest.mark.anyio
async def test_a_cancelled_error_the_handler_raises_is_recorded_and_its_slot_freed(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """An ``async def`` handler awaiting a future another task cancelled (the threaded
    engine's def step raises the same CancelledError out of its ``asyncio.run``)."""
    replica = await replicas(max_concurrency=1)

    @replica.phase("jobs", "Running")
    async def awaits_a_cancelled_future(lease: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    @replica.phase("jobs", "Next")
    async def next_step(lease: Any) -> Any:
        return await lease.advance("Done")

    await replica.submit("jobs", {"name": "cancelled", "phase": "Running"})
    with anyio.fail_after(HANG_GUARD):
        counts = await replica.run_once()
    assert counts.get("retrying") == 1 and "interrupted" not in counts
    stored = db.jobs.find_one({"name": "cancelled"})
    assert stored is not None and stored["attempts"] == 1 and "lockToken" not in stored
    assert stored["lastError"]["type"] == "CancelledError"

    # Its only slot is free and a worker takes the next step.
    await replica.submit("jobs", {"name": "next", "phase": "Next"})
    with anyio.fail_after(HANG_GUARD):
        assert (await replica.run_once()).get("advanced") == 1


@pytest.mark.anyio
@pytest.mark.parametrize("error", [asyncio.CancelledError, concurrent.futures.CancelledError])
@pytest.mark.parametrize("engine", ["threaded", "async"])
async def test_a_def_handler_s_cancelled_error_is_its_recorded_error(
    engine: str,
    error: type[BaseException],
    db: Database[Any],
    adb: AsyncDatabase[Any],
    clock: FakeClock,
) -> None:
    """A blocking call that raises a CancelledError of either kind (the async engine's
    thread bridge must not turn concurrent.futures' into its worker's cancellation)."""
    options: dict[str, Any] = {"replica_id": "pod-1", "clock": clock, "clock_refresh": 1e6}
    orch = (
        Orchestrator(db, max_concurrency=1, **options)
        if engine == "threaded"
        else AsyncOrchestrator(adb, max_concurrency=1, **options)
    )

    @orch.phase("jobs", "Running")
    def blocking(lease: Any) -> Any:
        raise error("the SDK's call was cancelled")

    replica = Replica(orch)
    await replica.measure_clock()
    await replica.submit("jobs", {"phase": "Running"})
    try:
        with anyio.fail_after(HANG_GUARD):
            counts = await replica.run_once()
        assert counts.get("retrying") == 1
        stored = db.jobs.find_one({})
        assert stored is not None and stored["attempts"] == 1 and "lockToken" not in stored
        assert stored["lastError"]["type"] == "CancelledError"
        assert stored["lastError"]["message"] == "the SDK's call was cancelled"
    finally:
        await replica.stop()


# -- step_timeout's cancellation ------------------------------------------------------------


@pytest.mark.anyio
async def test_a_step_that_swallows_step_timeout_s_cancellation_gives_its_slot_back(
    replicas: MakeEither, db: Database[Any], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The async engine puts a fresh worker in the stuck one's place, as the threaded one
    does; the stuck step, when it returns at last, writes nothing and counts nothing."""
    finished = Finished()
    worker = await replicas(
        "pod-worker",
        step_timeout=60,
        max_attempts=1,
        tick=30,
        max_concurrency=1,
        listeners=[finished],
    )
    claimed, go, returned = threading.Event(), threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    @worker.phase("jobs", "Running")
    async def stubborn(lease: Any) -> Any:
        claimed.set()
        while not go.is_set():
            try:
                await wait(go)
            except asyncio.CancelledError:
                box["swallowed"] = True  # and waits on
        try:
            return await lease.advance("Done")
        except LeaseLost as exc:
            box["lost"] = exc
            raise
        finally:
            returned.set()

    @worker.phase("jobs", "Next")
    async def next_step(lease: Any) -> Any:
        return await lease.advance("Done")

    await worker.submit("jobs", {"name": "stuck", "phase": "Running"})
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_once)
            assert await wait(claimed)
            for _ in range(3):
                clock.advance(20)
                await worker.heartbeat()
        assert worker.stats()["timed_out"] == 1
        await worker.submit("jobs", {"name": "next", "phase": "Next"})
        assert (await worker.run_once()).get("advanced") == 1

    caplog.clear()  # the time-out's own line said before: what the late return says
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        go.set()
        assert await wait(returned)
        await workers_ended(worker)
    assert isinstance(box.get("lost"), LeaseLost)
    assert ("swallowed" in box) is not worker.threaded  # a thread step is never cancelled
    stuck = db.jobs.find_one({"name": "stuck"})
    assert stuck is not None and stuck["phase"] == "Failed"
    assert stuck["lastError"]["type"] == "StepTimeout" and stuck["attempts"] == 1
    stats = worker.stats()
    assert (stats["claimed"], stats["timed_out"], stats["advanced"]) == (2, 1, 1)
    assert "lost" not in stats and "done" not in stats, "the late return is not counted"
    assert finished.outcomes == ["timed_out", "advanced"], "one per claim"
    # One line says it, on either engine: not also a "lease lost" line giving the lease's
    # reason for the refused write (an outcome already recorded: the time-out's).
    late = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [getattr(r, "outcome", None) for r in late] == ["abandoned"]
    said = late[0].getMessage()
    assert "returned after step_timeout (60s)" in said
    assert "its outcome was dropped" in said and "already counted (timed out)" in said


# -- the event loop's end, and the next loop --------------------------------------------------


def register_held_then_advancing(
    orch: AsyncOrchestrator, kind: str, claimed: threading.Event, go: threading.Event
) -> dict[str, Any]:
    """A "Running" handler whose first call holds (an async one until its loop ends, a def
    one until ``go``, then tries to advance), and whose later calls advance."""
    box: dict[str, Any] = {"calls": 0, "returned": threading.Event()}

    if kind == "async":

        @orch.phase("jobs", "Running")
        async def held(lease: AsyncLease[Any]) -> Any:
            box["calls"] += 1
            if box["calls"] == 1:
                claimed.set()
                await asyncio.Event().wait()  # only the loop's end ends it
            return await lease.advance("Done")

    else:

        @orch.phase("jobs", "Running")
        def held_def(lease: ThreadLease[Any]) -> Any:
            box["calls"] += 1
            if box["calls"] == 1:
                claimed.set()
                go.wait(HANG_GUARD)
                try:
                    return lease.advance("Done")
                except LeaseLost as exc:
                    box["lost"] = exc
                    raise
                finally:
                    box["returned"].set()
            return lease.advance("Done")

    return box


@pytest.mark.parametrize("kind", ["async", "def"])
def test_a_step_cancelled_with_its_event_loop_leaves_the_books_and_the_next_loop_runs_on(
    kind: str, clock: FakeClock
) -> None:
    """``asyncio.run`` ends with a tick's step running: it cancels the worker, whose step
    leaves the books (not running, not extended, slot free) with its lease left to expire;
    the same replica then runs on the next loop."""
    db, orch = async_replica(clock, max_concurrency=1)
    claimed, go = threading.Event(), threading.Event()
    box = register_held_then_advancing(orch, kind, claimed, go)
    ticks: list[asyncio.Task[Any]] = []

    async def first_loop() -> None:
        await orch.measure_clock()
        await orch.submit("jobs", {"phase": "Running"})
        ticks.append(asyncio.get_running_loop().create_task(orch.run_once()))
        assert await asyncio.to_thread(claimed.wait, HANG_GUARD)
        # The loop ends here, under the tick and its step.

    asyncio.run(first_loop())
    assert orch.stats().get("interrupted") == 1
    stored = db.jobs.find_one({})
    assert stored is not None and stored["lockToken"] and stored["lockedBy"] == "pod-a"
    assert stored.get("attempts", 0) == 0, "left to expire, not recorded or handed back"
    if kind == "def":  # its thread returns: its loop is closed, so LeaseLost at once
        go.set()
        assert box["returned"].wait(HANG_GUARD)
        assert "event loop" in str(box["lost"])

    async def next_loop() -> None:
        async with asyncio.timeout(HANG_GUARD):
            clock.advance(20)
            assert await orch.heartbeat() == 0, "no step of the dead loop is kept alive"
            assert await orch.run_once() == {"ticks": 1}, "its lease is not yet expired"
            clock.advance(11)
            assert (await orch.run_once()).get("advanced") == 1

    asyncio.run(next_loop())
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]
    assert box["calls"] == 2


@pytest.mark.parametrize("stop_first", [True, False], ids=["stop-then-start", "start"])
def test_a_replica_started_on_a_loop_that_ended_without_stop_serves_on_the_next(
    stop_first: bool, clock: FakeClock
) -> None:
    db, orch = async_replica(clock)
    done: list[asyncio.Event] = []

    @orch.phase("jobs", "Running")
    async def step(lease: AsyncLease[Any]) -> Any:
        outcome = await lease.advance("Done")
        done[0].set()
        return outcome

    async def started() -> None:
        await orch.start()

    async def next_loop() -> None:
        done.append(asyncio.Event())
        async with asyncio.timeout(HANG_GUARD):
            if stop_first:
                report = await orch.stop()
                assert report.still_running == [] and report.released == []
            await orch.start()
            await orch.submit("jobs", {"phase": "Running"})
            await done[0].wait()
            await orch.stop()

    asyncio.run(started())
    asyncio.run(next_loop())
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


def stall_writes(monkeypatch: pytest.MonkeyPatch, writing: threading.Event) -> None:
    """AsyncLease.advance, once under way, waits for good: a write in flight."""

    async def stalled(self: AsyncLease[Any], phase: str, **fields: Any) -> Any:
        writing.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(AsyncLease, "advance", stalled)


@pytest.mark.parametrize("end", ["stopped", "ended"])
def test_a_thread_lease_waiting_for_a_loop_that_stops_or_ends_raises_lease_lost(
    end: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A def step's write is in flight when its loop stops (``run_until_complete``
    returns) or ends (``asyncio.run`` cancels the write): the handler's wait ends."""
    _, orch = async_replica(clock, max_concurrency=1)
    claimed, go, writing = threading.Event(), threading.Event(), threading.Event()
    box = register_held_then_advancing(orch, "def", claimed, go)
    stall_writes(monkeypatch, writing)

    async def until_the_write_is_under_way() -> asyncio.Task[Any]:
        await orch.submit("jobs", {"phase": "Running"})
        tick = asyncio.get_running_loop().create_task(orch.run_once())
        assert await asyncio.to_thread(claimed.wait, HANG_GUARD)
        go.set()
        assert await asyncio.to_thread(writing.wait, HANG_GUARD)
        return tick

    if end == "ended":
        asyncio.run(until_the_write_is_under_way())
        assert box["returned"].wait(HANG_GUARD)
        assert "cancelled the write" in str(box["lost"])
        return
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(until_the_write_is_under_way())
        assert box["returned"].wait(HANG_GUARD)
        assert "stopped while the write waited" in str(box["lost"])
    finally:
        close_loop(loop)


def test_a_thread_lease_on_a_stopped_loop_raises_lease_lost_and_another_loop_is_refused(
    clock: FakeClock,
) -> None:
    """``run_until_complete`` returned while a def step runs: the loop is stopped, open,
    with the tick on it. The step's write raises LeaseLost at once (nothing would run it);
    another loop is refused until that one has finished its work, then taken."""
    db, orch = async_replica(clock, max_concurrency=1)
    claimed, go = threading.Event(), threading.Event()
    box = register_held_then_advancing(orch, "def", claimed, go)

    async def until_claimed() -> asyncio.Task[Any]:
        await orch.submit("jobs", {"phase": "Running"})
        tick = asyncio.get_running_loop().create_task(orch.run_once())
        assert await asyncio.to_thread(claimed.wait, HANG_GUARD)
        return tick

    loop = asyncio.new_event_loop()
    try:
        tick = loop.run_until_complete(until_claimed())
        go.set()
        assert box["returned"].wait(HANG_GUARD)
        assert "not running" in str(box["lost"])
        with pytest.raises(OrchestratorError, match="stopped but not closed"):
            asyncio.run(orch.run_once())
        # Its own loop finishes the tick: the LeaseLost is the step's recorded error.
        assert loop.run_until_complete(tick).get("retrying") == 1
    finally:
        close_loop(loop)
    stored = db.jobs.find_one({})
    assert stored is not None and stored["lastError"]["type"] == "LeaseLost"
    assert asyncio.run(orch.run_once()) == {"ticks": 1}  # that loop is done: this one runs


def test_a_loop_running_in_another_thread_is_not_shared(clock: FakeClock) -> None:
    _, orch = async_replica(clock)
    running, leave = threading.Event(), threading.Event()

    async def first() -> None:
        await orch.measure_clock()
        running.set()
        await asyncio.to_thread(leave.wait, HANG_GUARD)

    thread = threading.Thread(target=asyncio.run, args=(first(),))
    thread.start()
    try:
        assert running.wait(HANG_GUARD)
        with pytest.raises(OrchestratorError, match="still running"):
            asyncio.run(orch.run_once())
    finally:
        leave.set()
        thread.join(HANG_GUARD)


def test_a_loop_closed_with_the_replica_s_work_on_it_is_refused_clearly(
    clock: FakeClock,
) -> None:
    """``loop.close()`` does not cancel what runs on it, unlike ``asyncio.run``: a replica
    started there keeps workers that will never run again, and says so rather than hang."""
    _, orch = async_replica(clock, max_concurrency=1)

    @orch.phase("jobs", "Running")
    async def step(lease: AsyncLease[Any]) -> Any:
        return await lease.advance("Done")

    loop = asyncio.new_event_loop()
    loop.run_until_complete(orch.start())
    stranded = asyncio.all_tasks(loop)
    loop.close()
    try:
        assert stranded, "its idle worker is left on the closed loop"
        with pytest.raises(OrchestratorError, match="make a new AsyncOrchestrator"):
            asyncio.run(orch.run_once())
    finally:
        # What the collector would do at some later moment, in another test even, done
        # here: the idle workers' coroutines closed (asyncio logs their tasks as
        # destroyed while pending, as they are).
        for task in stranded:
            task.get_coro().close()
        del stranded, orch
        gc.collect()


# -- a stopped replica ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_run_once_after_stop_runs_a_tick(replicas: MakeEither, db: Database[Any]) -> None:
    """As on a replica never started: stop() ends the background loop, not run_once."""
    replica = await replicas()

    @replica.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        return await lease.advance("Done")

    await replica.start()
    await replica.stop()
    await replica.submit("jobs", {"phase": "Running"})
    with anyio.fail_after(HANG_GUARD):
        assert (await replica.run_once()).get("advanced") == 1
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


# -- cancelled outside the handler: the books and the slots stay right -----------------------


class Gate:
    """Holds the first operation ``match`` accepts (its name, its collection, its arguments)
    for good: before it is sent, or (``applied``) after it applied, as a reply that never
    comes. ``reached`` is set then; the test ends the loop under it."""

    def __init__(self, match: Callable[[str, str, tuple[Any, ...]], bool], applied: bool) -> None:
        self.match = match
        self.applied = applied
        self.armed = True
        self.reached = threading.Event()

    async def hold(self) -> None:
        self.reached.set()
        await asyncio.Event().wait()  # until the task is cancelled


class GatedDatabase:
    """An async database whose collections pass each operation through ``gate``."""

    def __init__(self, db: Any, gate: Gate) -> None:
        self._db = db
        self._gate = gate

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> GatedCollection:
        return GatedCollection(self._db.get_collection(name, *args, **kwargs), self._gate)

    def __getitem__(self, name: str) -> GatedCollection:
        return self.get_collection(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class GatedCollection:
    def __init__(self, collection: Any, gate: Gate) -> None:
        self._collection = collection
        self._gate = gate

    def with_options(self, *args: Any, **kwargs: Any) -> GatedCollection:
        return GatedCollection(self._collection.with_options(*args, **kwargs), self._gate)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._collection, name)
        gate, collection = self._gate, self._collection.name
        if not callable(method):
            return method

        async def gated(*args: Any, **kwargs: Any) -> Any:
            held = gate.armed and gate.match(name, collection, args)
            if held:
                gate.armed = False
                if not gate.applied:
                    await gate.hold()
            result = await method(*args, **kwargs)
            if held:
                await gate.hold()
            return result

        return gated


def limited_replica(clock: FakeClock, gate: Gate) -> tuple[Database[Any], AsyncOrchestrator]:
    """An AsyncOrchestrator whose ``jobs`` handler in Running has a global_limit of 1, on a
    database gated by ``gate``."""
    db = memory_database(clock=clock)
    orch = AsyncOrchestrator(
        GatedDatabase(async_view(db), gate),  # type: ignore[arg-type]
        replica_id="pod-a",
        clock=clock,
        clock_refresh=1e6,
        tick=30,
        max_concurrency=1,
    )

    @orch.phase("jobs", "Running", global_limit=1)
    async def run(lease: AsyncLease[Any]) -> Any:
        return await lease.advance("Done")

    return db, orch


def end_loop_at_gate(orch: AsyncOrchestrator, gate: Gate) -> None:
    """Submit a job and run a tick until ``gate`` holds an operation, then end the loop
    there, as ``asyncio.run`` does: every task cancelled where it waits."""

    async def first_loop() -> None:
        await orch.measure_clock()
        await orch.submit("jobs", {"phase": "Running"})
        asyncio.get_running_loop().create_task(orch.run_once())
        assert await asyncio.to_thread(gate.reached.wait, HANG_GUARD)

    asyncio.run(first_loop())


def slot_states(db: Database[Any]) -> list[tuple[Any, Any]]:
    return [(s["until"], s["token"]) for s in db[SLOTS_COLLECTION].find({"kind": "global"})]


def test_a_worker_cancelled_while_it_frees_a_finished_step_s_slot_leaves_the_books_right(
    clock: FakeClock,
) -> None:
    """The step's outcome landed; its worker is cancelled while it frees the global slot.
    The step leaves the books as finished (it once stayed running: run_once never
    returned, stop() listed it, the next loop was refused), and the slot is freed."""
    gate = Gate(
        lambda op, coll, args: (
            op == "update_one"
            and coll == SLOTS_COLLECTION
            and args[1] == limit_slots.free_slot_update()
        ),
        applied=False,
    )
    db, orch = limited_replica(clock, gate)
    end_loop_at_gate(orch, gate)
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]
    assert orch.stats().get("advanced") == 1
    assert slot_states(db) == [(EPOCH, None)], "the slot is freed, not left to its lease time"

    async def next_loop() -> None:
        async with asyncio.timeout(HANG_GUARD):
            await orch.submit("jobs", {"phase": "Running"})
            assert (await orch.run_once()).get("advanced") == 1
            report = await orch.stop()
            assert report.still_running == []

    asyncio.run(next_loop())


@pytest.mark.parametrize(
    ("where", "applied"),
    [("take", True), ("claim", False), ("claim", True)],
    ids=["take-applied", "claim-unsent", "claim-applied"],
)
def test_a_claim_cancelled_after_its_slot_was_taken_gives_the_slot_back(
    clock: FakeClock, where: str, applied: bool
) -> None:
    """Cancelled while the slot's take (applied, its answer never read) or the claim after
    it was under way: no step holds the slot, so it is given back at once (it was once
    held until its lease time passed: an hour with lock_timeout=3600)."""

    def match(op: str, coll: str, args: tuple[Any, ...]) -> bool:
        if op != "find_one_and_update":
            return False
        return coll == SLOTS_COLLECTION if where == "take" else coll == "jobs"

    gate = Gate(match, applied=applied)
    db, orch = limited_replica(clock, gate)
    end_loop_at_gate(orch, gate)
    assert slot_states(db) == [(EPOCH, None)]

    async def next_loop() -> None:
        async with asyncio.timeout(HANG_GUARD):
            if applied and where == "claim":
                clock.advance(31)  # the claim landed: its lease expires unused
            assert (await orch.run_once()).get("advanced") == 1

    asyncio.run(next_loop())
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]
