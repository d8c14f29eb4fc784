"""The first outcome a step gives stands: nothing written after it (an error raised after
it, a time-out racing it, a stale record) moves the document on, and a failed attempt is
recorded once, only on the state the step itself left. And outside writers win against
``remove()`` as against ``advance()``."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
from pymongo.database import Database

from orchestrator import EPOCH, Lease, LeaseLost, Orchestrator
from orchestrator.mongo import Store
from orchestrator.testing import FakeClock
from orchestrator.testing.faults import Faults
from tests.conftest import MakeEither, MakeReplica
from tests.engines import hold, wait


def _doc(db: Database[Any]) -> dict[str, Any]:
    doc = db.jobs.find_one({})
    assert doc is not None, "the document is gone"
    return doc


# -- remove() is fenced on the phase too ---------------------------------------------------


@pytest.mark.anyio
async def test_remove_keeps_a_document_whose_phase_the_api_changed_meanwhile(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """Before the fix the deletion step's ``remove()`` deleted a document the API had
    moved to ``Cancelled`` while the step ran (``_doc`` found nothing)."""
    orch = await replicas()
    box = hold(orch, action="remove", phase="Deleting")
    await orch.submit("jobs", {"phase": "Deleting"})
    async with anyio.create_task_group() as group:
        group.start_soon(orch.run_once)
        assert await wait(box["claimed"])
        db.jobs.update_one({}, {"$set": {"phase": "Cancelled"}})
        box["go"].set()
    doc = _doc(db)
    assert doc["phase"] == "Cancelled"
    assert isinstance(box["lost"], LeaseLost)
    assert "lockToken" not in doc, "released at once, not held until it expires"


@pytest.mark.anyio
async def test_remove_still_deletes_a_document_left_in_its_phase(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas()

    @orch.phase("jobs", "Deleting")
    async def delete(lease: Any) -> Any:
        return await lease.remove()

    await orch.submit("jobs", {"phase": "Deleting"})
    assert (await orch.run_once()).get("removed") == 1
    assert db.jobs.count_documents({}) == 0


# -- an error after the step's own outcome ---------------------------------------------------


@pytest.mark.anyio
async def test_an_error_after_an_advance_on_the_last_attempt_leaves_the_new_phase(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """``advance("Deleted")``, then a notification fails, on the last attempt. Before the
    fix the error record moved the document from Deleted to Failed (``failedBy`` set) and
    the tick counted "failed"."""
    orch = await replicas(max_attempts=1)

    @orch.phase("jobs", "Deleting")
    async def delete(lease: Any) -> Any:
        await lease.advance("Deleted")
        raise RuntimeError("the notification service is down")

    await orch.submit("jobs", {"phase": "Deleting"})
    counts = await orch.run_once()
    doc = _doc(db)
    assert doc["phase"] == "Deleted" and "failedBy" not in doc
    assert counts.get("advanced") == 1 and "failed" not in counts
    # Noted for operators, with the phase it was raised in; the new phase's attempts are
    # its own, and it is claimable at once.
    assert doc["lastError"]["type"] == "RuntimeError"
    assert doc["lastError"]["phase"] == "Deleting"
    assert doc["attempts"] == 0 and "lockToken" not in doc


@pytest.mark.anyio
async def test_an_error_after_a_remove_writes_nothing_and_the_removal_stands(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(max_attempts=1)

    @orch.phase("jobs", "Deleting")
    async def delete(lease: Any) -> Any:
        await lease.remove()
        raise RuntimeError("the audit log is down")

    await orch.submit("jobs", {"phase": "Deleting"})
    counts = await orch.run_once()
    assert db.jobs.count_documents({}) == 0
    assert counts.get("removed") == 1 and "failed" not in counts


@pytest.mark.anyio
async def test_an_unlock_then_raise_with_another_replica_s_whole_step_between_is_not_recorded(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """Replica A unlocks, B claims and unlocks (the document is free again, exactly as A
    left it but for B's token), then A's handler raises. Before the fix A's stale record
    landed on B's state (``attempts`` 1, ``lastError`` set).

    A runs one worker: with more, the threaded engine may have another claim of A's under
    way (sent when A's claim came back with a document), which ``request_stop`` cannot
    call back; it could take what the unlock frees before B looks, and hand it back only
    after B found nothing (the next test stages that)."""
    first = await replicas("first", max_concurrency=1)
    second = await replicas("second")
    unlocked, raise_now = threading.Event(), threading.Event()
    ran: list[str] = []

    @first.phase("jobs", "Running")
    async def unlock_then_raise(lease: Any) -> Any:
        first.request_stop()  # its one worker claims nothing after this step
        await lease.unlock()
        unlocked.set()
        await wait(raise_now)
        raise RuntimeError("after its unlock")

    @second.phase("jobs", "Running")
    async def whole_step(lease: Any) -> Any:
        ran.append("second")
        second.request_stop()  # one step, then this replica claims nothing more
        return await lease.unlock()

    await first.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(first.run_once)
        assert await wait(unlocked)
        await second.run_once()
        assert ran == ["second"]
        raise_now.set()
    doc = _doc(db)
    assert doc["attempts"] == 0 and "lastError" not in doc
    assert first.stats().get("lost") == 1


def test_an_unlock_then_raise_with_the_replica_s_own_claim_between_is_not_recorded(
    make: MakeReplica, db: Database[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker of the replica sent a claim while the step ran (the handler's claim
    had found a document); it lands after the step asked to stop and unlocked, and takes
    the document. The replica hands that lease back unstarted; the step's error, raised
    after, is not recorded on it, and another replica claims the document at once. (How
    ``test_an_unlock_then_raise_with_another_replica_s_whole_step_between_is_not_recorded``
    once failed under load, when its first replica ran four workers: its second replica
    looked while the document was held so, and found nothing.)"""
    first = make("first", max_concurrency=2)  # the step's worker, and one more
    second = make("second")
    in_flight, unlocked, taken = threading.Event(), threading.Event(), threading.Event()
    real_claim = Store.claim
    claims: list[str] = []

    def claim(self: Store, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name != "orchestrator-first":
            return real_claim(self, *args, **kwargs)
        claims.append("first")
        if len(claims) == 1:
            return real_claim(self, *args, **kwargs)
        in_flight.set()  # sent while the step runs; it reaches the server after the unlock
        assert unlocked.wait(10), "hang guard"
        doc = real_claim(self, *args, **kwargs)
        if doc is not None:
            taken.set()
        return doc

    monkeypatch.setattr(Store, "claim", claim)

    @first.phase("jobs", "Running")
    def unlock_then_raise(lease: Lease[Any]) -> Any:
        assert in_flight.wait(10), "hang guard"
        first.request_stop()
        lease.unlock()
        unlocked.set()
        assert taken.wait(10), "hang guard"
        raise RuntimeError("after its unlock")

    ran: list[str] = []

    @second.phase("jobs", "Running")
    def whole_step(lease: Lease[Any]) -> Any:
        ran.append("second")
        return lease.advance("Done")

    first.submit("jobs", {"phase": "Running"})
    counts = first.run_once()
    assert counts.get("claimed") == 2 and counts.get("released") == 1
    assert counts.get("lost") == 1 and "retrying" not in counts
    doc = _doc(db)
    assert doc["attempts"] == 0 and "lastError" not in doc
    assert doc["lockedUntil"] == EPOCH and "lockToken" not in doc, "handed back at once"
    second.run_once()
    assert ran == ["second"] and _doc(db)["phase"] == "Done"


@pytest.mark.anyio
async def test_an_unlock_then_raise_still_counts_a_failed_attempt_of_its_phase(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """An outcome that kept the phase is part of the phase's streak: the error after it
    counts (so a handler that always unlocks then raises reaches the failed phase instead
    of repeating forever)."""
    orch = await replicas(max_attempts=5)

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        await lease.unlock()
        raise RuntimeError("after its unlock")

    await orch.submit("jobs", {"phase": "Running"})
    await orch.run_once()
    doc = _doc(db)
    assert doc["attempts"] == 1 and doc["lastError"]["type"] == "RuntimeError"
    assert doc["phase"] == "Running"


# -- a time-out racing the step's own outcome or record ---------------------------------------


class _Witness:
    """Wraps a lease's lock to tell when a second writer waits for it: how a test stages a
    step-timeout that decided to record while the step's own write was in flight."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.waiting = threading.Event()

    def __enter__(self) -> _Witness:
        if not self._lock.acquire(blocking=False):
            self.waiting.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _racing_time_out(
    db: Database[Any], clock: FakeClock, body: Any, *, max_attempts: int
) -> dict[str, int]:
    """Run ``body`` as the step; its first ``update_one`` applies, then its reply waits
    until the heartbeat has timed the step out and waits for the lease's lock; then the
    reply arrives. Returns the tick's counts."""
    in_flight, reply = threading.Event(), threading.Event()

    def stall(_seconds: float) -> None:
        in_flight.set()
        assert reply.wait(10), "hang guard"

    faults = Faults(delay=stall, clock=clock)
    orch = Orchestrator(
        faults.wrap(db),
        replica_id="pod-1",
        clock=clock,
        lock_timeout=30,
        clock_refresh=1e6,
        step_timeout=60,
        max_attempts=max_attempts,
    )
    orch.measure_clock()
    witness: list[_Witness] = []

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        orch.request_stop()  # this one step: a retry that falls due is not run here
        witness.append(_Witness(lease._lock))
        lease._lock = witness[0]  # type: ignore[assignment]
        return body(lease)

    orch.submit("jobs", {"phase": "Running"})
    faults.delay_next("update_one", 1)
    counts: dict[str, int] = {}
    tick = threading.Thread(target=lambda: counts.update(orch.run_once()))
    tick.start()
    try:
        assert in_flight.wait(10), "hang guard"
        clock.advance(61)  # past step_timeout: the heartbeat times the step out
        beat = threading.Thread(target=orch.heartbeat)
        beat.start()
        assert witness[0].waiting.wait(10), "hang guard"
    finally:
        reply.set()
    beat.join()
    tick.join()
    return counts


def test_a_time_out_racing_the_step_s_own_advance_does_not_move_the_document_on(
    db: Database[Any], clock: FakeClock
) -> None:
    """Before the fix the time-out's record landed after the step's advance and moved
    the document from Done to Failed, while the tick counted "advanced"."""

    def advance(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    counts = _racing_time_out(db, clock, advance, max_attempts=1)
    doc = _doc(db)
    assert doc["phase"] == "Done" and "lastError" not in doc and "failedBy" not in doc
    # Counted once, as what landed, whichever of the worker and the heartbeat comes first.
    assert counts.get("advanced") == 1 and "failed" not in counts and "timed_out" not in counts


def test_a_time_out_racing_the_handler_s_own_error_counts_the_attempt_once(
    db: Database[Any], clock: FakeClock
) -> None:
    """The handler raised; its error record is in flight when the time-out decides to
    record too. Before the fix both landed: ``attempts`` 2 for one attempt."""

    def fail(lease: Lease[Any]) -> Any:
        raise RuntimeError("the provider said no")

    counts = _racing_time_out(db, clock, fail, max_attempts=5)
    doc = _doc(db)
    assert doc["attempts"] == 1 and doc["lastError"]["type"] == "RuntimeError"
    assert counts.get("retrying") == 1 and "timed_out" not in counts
