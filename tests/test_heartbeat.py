"""Steps longer than a lease: extend(), the automatic heartbeat, and the step timeout."""

from __future__ import annotations

import asyncio
import inspect
import threading
from functools import partial
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from pymongo.database import Database

from orchestrator import Lease, LeaseLost
from orchestrator.runners._sync import engine
from orchestrator.testing import FakeClock
from orchestrator.testing.faults import Faults
from tests.conftest import MakeReplica
from tests.engines import hold, new_replica, wait
from tests.holding import hold_step


def test_the_heartbeat_keeps_a_long_step_s_lease_alive(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    # Minutes: run_once's own heartbeat, every lock_timeout/6 of real time (50 s), never
    # runs during the test, so each extension below is this test's heartbeat call.
    worker = make("pod-worker", lock_timeout=300, tick=300, step_timeout=None)
    other = make("pod-other")
    box = hold_step(worker)
    stolen: list[int] = []

    @other.phase("jobs", "Running")
    def steal(lease: Lease[Any]) -> Any:
        stolen.append(1)
        return lease.advance("Stolen")

    worker.submit("jobs", {"phase": "Running"})
    tick = threading.Thread(target=worker.run_once)
    tick.start()
    assert box["claimed"].wait(5)

    clock.advance(100)
    assert worker.heartbeat() == 0, "not yet half the lock timeout"
    for _ in range(4):  # 700 s in all, far past the 300 s lock timeout
        clock.advance(150)
        assert worker.heartbeat() == 1
        other.run_once()
    assert stolen == []
    box["go"].set()
    tick.join()
    assert "lost" not in box
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


def test_extend_by_hand_renews_the_lease(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(heartbeat=False)

    @orch.phase("jobs", "Running")
    def chunks(lease: Lease[Any]) -> Any:
        for _ in range(3):
            clock.advance(20)  # a chunk of work
            lease.extend()
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


def test_a_step_that_never_returns_is_timed_out_and_counted_failed(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    worker = make("pod-worker", step_timeout=60, max_attempts=1)
    box = hold_step(worker)
    worker.submit("jobs", {"phase": "Running"})
    tick = threading.Thread(target=worker.run_once)
    tick.start()
    assert box["claimed"].wait(5)

    for _ in range(3):
        clock.advance(20)
        worker.heartbeat()
    # 60 s: the heartbeat stops renewing and takes the lease back as a failed attempt.
    tick.join(5)
    assert not tick.is_alive(), "the tick must not wait for a step it gave up on"
    stored = db.jobs.find_one({})
    assert stored is not None
    assert stored["phase"] == "Failed"
    assert stored["lastError"]["type"] == "StepTimeout"
    assert worker.stats()["timed_out"] == 1

    box["go"].set()  # it finally returns: its late write is fenced out
    assert box["lease"].held is False
    assert box["returned"].wait(5)
    assert isinstance(box.get("lost"), LeaseLost)
    assert db.jobs.find_one({})["phase"] == "Failed"  # type: ignore[index]


def test_the_heartbeat_stops_once_the_lease_is_lost(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    # One slot: another worker's claim still on its way when the clock passes the lease's
    # expiry would take the document back from the other replica.
    worker = make("pod-worker", max_concurrency=1)
    box = hold_step(worker)
    worker.submit("jobs", {"phase": "Running"})
    tick = threading.Thread(target=worker.run_once)
    tick.start()
    assert box["claimed"].wait(5)

    # Another replica took the document over (the worker was cut off for a while).
    db.jobs.update_one({}, {"$set": {"lockToken": "pod-other", "lockedBy": "pod-other"}})
    clock.advance(16)
    assert worker.heartbeat() == 0
    assert box["lease"].held is False
    taken = db.jobs.find_one({})
    clock.advance(16)
    assert worker.heartbeat() == 0, "a lost lease is never extended again"
    assert db.jobs.find_one({}) == taken

    box["go"].set()
    tick.join()
    assert isinstance(box.get("lost"), LeaseLost)


# -- extensions never queue behind each other -----------------------------------------------


class _Rendezvous:
    """A database whose lease extensions (``extend_update``'s shape) each wait until
    ``count`` of them are in flight at once: a heartbeat that sends them one at a time
    never gets there (the hang guard then breaks it)."""

    EXTEND = frozenset({"lockedAt", "lockedUntil"})

    def __init__(self, count: int) -> None:
        self.count = count
        self._barrier = threading.Barrier(count, timeout=10)  # a hang guard, not a measure
        self._arrived = 0
        self._all_in: asyncio.Event | None = None

    def is_extension(self, update: Any) -> bool:
        return isinstance(update, dict) and set(update.get("$set", {})) == self.EXTEND

    def wrap(self, db: Any) -> Any:
        rendezvous = self

        class Collection:
            def __init__(self, inner: Any) -> None:
                self._inner = inner

            def __getattr__(self, name: str) -> Any:
                return getattr(self._inner, name)

            def update_one(self, query: Any, update: Any, *args: Any, **kwargs: Any) -> Any:
                if not rendezvous.is_extension(update):
                    return self._inner.update_one(query, update, *args, **kwargs)
                if inspect.iscoroutinefunction(self._inner.update_one):
                    return rendezvous._async_meet(self._inner.update_one(query, update))
                rendezvous._barrier.wait()
                return self._inner.update_one(query, update, *args, **kwargs)

        class Database:
            def __init__(self, inner: Any) -> None:
                self._inner = inner

            def __getattr__(self, name: str) -> Any:
                return getattr(self._inner, name)

            def get_collection(self, name: str, *args: Any, **kwargs: Any) -> Any:
                return Collection(self._inner.get_collection(name, *args, **kwargs))

        return Database(db)

    async def _async_meet(self, write: Any) -> Any:
        if self._all_in is None:
            self._all_in = asyncio.Event()
        self._arrived += 1
        if self._arrived == self.count:
            self._all_in.set()
        async with asyncio.timeout(10):  # a hang guard, not a measure
            await self._all_in.wait()
        return await write


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["threaded", "async"])
async def test_the_heartbeat_sends_every_extension_at_once(
    mode: str, db: Database[Any], adb: Any, clock: FakeClock
) -> None:
    """Four long steps, writes slow enough that four in a row outlast a lease: every
    extension must be in flight together. Before the fix the heartbeat sent them one
    after another, so the first waited for the others forever (here: the hang guard
    broke it) and, under real slow writes, the last leases expired unextended."""
    rendezvous = _Rendezvous(4)
    replica = new_replica(
        mode, 0, rendezvous.wrap(db), rendezvous.wrap(adb), clock, "pod-1", max_concurrency=4
    )
    await replica.measure_clock()
    started, go = threading.Semaphore(0), threading.Event()

    @replica.phase("jobs", "Running")
    async def long_step(lease: Any) -> Any:
        started.release()
        await wait(go)
        return await lease.advance("Done")

    for _ in range(4):
        await replica.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        # The tick beats not on its own: a beat of real time between the advance and this
        # test's heartbeat would extend the four leases first, and leave it none to extend.
        group.start_soon(partial(replica.run_once, heartbeat=False))
        for _ in range(4):
            assert await anyio.to_thread.run_sync(started.acquire, True, 10)
        clock.advance(16)  # past half the 30 s lock timeout
        try:
            assert await replica.heartbeat() == 4
        finally:
            go.set()
    assert db.jobs.count_documents({"phase": "Done"}) == 4


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["threaded", "async"])
async def test_an_extension_confirmed_only_after_the_lease_expired_leaves_it_lost(
    mode: str, db: Database[Any], adb: Any, clock: FakeClock
) -> None:
    """The extension applies, but its reply takes 20 s: the lease expired meanwhile, and
    another replica could have claimed the document. Before the fix the holder counted
    the lease as extended and its step's advance landed."""
    faults = Faults(delay=clock.advance, clock=clock)
    replica = new_replica(mode, 0, faults.wrap(db), faults.wrap(adb), clock, "pod-1")
    await replica.measure_clock()
    box = hold(replica)
    await replica.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        # The tick beats not on its own: every extension is this test's heartbeat call (a
        # beat of real time between the advance and the delay would extend at once).
        group.start_soon(partial(replica.run_once, heartbeat=False))
        assert await wait(box["claimed"])
        clock.advance(16)
        faults.delay_next("update_one", 20)  # confirmed 36 s into a 30 s lease
        try:
            assert await replica.heartbeat() == 0
        finally:
            box["go"].set()
    assert isinstance(box["lost"], LeaseLost)
    assert box["lease"].lost
    assert replica.stats().get("lost") == 1


def test_run_once_without_its_heartbeat_leaves_it_to_the_caller(
    make: MakeReplica, db: Database[Any], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_once(heartbeat=False)`` never beats on its own, however long it waits (here
    every wait would be past a beat: the engine's monotonic clock leaps): a harness on a
    fake clock calls ``heartbeat()`` itself. With the default a beat comes at once."""
    leaps = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(engine, "time", SimpleNamespace(monotonic=lambda: float(next(leaps))))
    worker = make("pod-worker", step_timeout=None)
    beat = threading.Event()
    beats: list[int] = []
    claimed, go = threading.Event(), threading.Event()

    def spy() -> None:
        beats.append(1)
        beat.set()

    monkeypatch.setattr(worker, "_safe_heartbeat", spy)

    @worker.phase("jobs", "Running")
    def hold(lease: Lease[Any]) -> Any:
        claimed.set()
        assert go.wait(10)
        return lease.advance("Done")

    for heartbeat in (False, True):
        claimed.clear()
        go.clear()
        worker.submit("jobs", {"phase": "Running"})
        tick = threading.Thread(target=worker.run_once, kwargs={"heartbeat": heartbeat})
        tick.start()
        assert claimed.wait(5)
        if heartbeat:
            assert beat.wait(5)  # the default: it beats while the step runs
        go.set()
        tick.join(5)
        assert not tick.is_alive()
        if not heartbeat:
            assert beats == []  # the whole tick, and no beat of its own
    assert db.jobs.count_documents({"phase": "Done"}) == 2
