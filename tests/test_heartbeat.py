"""Steps longer than a lease: extend(), the automatic heartbeat, and the step timeout."""

from __future__ import annotations

import threading
from typing import Any

from pymongo.database import Database

from orchestrator import Lease, LeaseLost
from orchestrator.testing import FakeClock
from tests.conftest import MakeReplica
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
