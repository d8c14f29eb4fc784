"""Log records carry the replica, collection, document, phase and outcome as fields."""

from __future__ import annotations

import logging
import threading
from datetime import UTC
from typing import Any

import pytest
from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, InvalidOperation, ServerSelectionTimeoutError

from orchestrator import Lease
from orchestrator.core.errors import StoreError
from orchestrator.core.outages import Back, DatabaseWatch, Unreachable
from orchestrator.mongo.driver_errors import driver_errors
from orchestrator.runners.books import Books
from orchestrator.runners.workers import TIMER_DEFAULTS, AsyncWorkers, Workers
from orchestrator.testing import FakeClock
from orchestrator.testing.faults import Faults
from tests.conftest import MakeReplica
from tests.engines import new_replica, wait


def test_step_records_carry_structured_fields(
    make: MakeReplica, caplog: pytest.LogCaptureFixture
) -> None:
    orch = make("pod-7", max_attempts=1)

    @orch.phase("jobs", "Running")
    def broken(lease: Lease[Any]) -> Any:
        raise ValueError("bad input from upstream")

    doc = orch.submit("jobs", {"phase": "Running"})
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        orch.run_once()
    failed = [r for r in caplog.records if getattr(r, "outcome", None) == "failed"]
    assert len(failed) == 1
    record: Any = failed[0]
    assert record.levelno == logging.ERROR
    assert record.replica == "pod-7"
    assert record.collection == "jobs"
    assert record.doc_id == str(doc["_id"])
    assert record.phase == "Running"
    assert record.handler.endswith("broken")
    assert "bad input from upstream" in record.getMessage()
    # Plain strings, as a JSON formatter serialises them: no enum member leaks into a field.
    assert all(type(getattr(r, "outcome", "")) is str for r in caplog.records)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["threaded", "async"])
async def test_a_database_outage_is_said_once_as_it_begins_and_once_as_it_ends(
    mode: str,
    db: Database[Any],
    adb: Any,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two minutes of ticks and heartbeats against a database that does not answer: one
    line says it is unreachable (what failed, since when), one that it is back (after how
    long); the failures in between are DEBUG. Before, every tick said "claim failed" and
    nothing said when the outage began or ended."""
    faults = Faults(clock=clock)
    replica = new_replica(mode, 0, faults.wrap(db), faults.wrap(adb), clock, "pod-7")
    await replica.measure_clock()
    ran: list[str] = []

    @replica.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        ran.append("ran")
        return await lease.advance("Done")

    began = clock.now()
    faults.cut_off(120)
    with caplog.at_level(logging.DEBUG):
        for _ in range(24):
            assert await replica.run_once() == {"claim_errors": 1, "ticks": 1}
            await replica.heartbeat()
            clock.advance(5)
        clock.advance(5)
        await replica.submit("jobs", {"phase": "Running"})
        await replica.run_once()
    assert ran == ["ran"]
    said: list[Any] = [
        r
        for r in caplog.records
        if r.name.startswith("orchestrator") and r.levelno >= logging.WARNING
    ]
    assert [r.outcome for r in said] == ["database-unreachable", "database-back"]
    down, back = said
    assert down.replica == back.replica == "pod-7"
    assert down.since == back.since == began.isoformat()
    assert down.failed and down.failed in down.error and "unreachable" in down.getMessage()
    assert back.down_for == 125.0 and "after 125.0s" in back.getMessage()
    assert not [r for r in caplog.records if "maximum number of running" in r.getMessage()]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["threaded", "async"])
async def test_a_replicas_timer_logs_no_skipped_heartbeat_and_other_schedulers_still_do(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A heartbeat slower than its interval (the database unreachable) is skipped on
    purpose: APScheduler's "maximum number of running instances reached", every
    interval, drowned the replica's own lines. An application's own scheduler keeps it."""
    threaded = mode == "threaded"
    go = threading.Event()

    def blocked() -> None:
        go.wait(10)  # a hang guard, not a measure

    async def blocked_async() -> None:
        await wait(go)

    async def no_work() -> None:
        return None

    ours = Workers.timer() if threaded else AsyncWorkers(Books(1, 1), no_work, "pod-1").timer()
    theirs = (
        BackgroundScheduler(timezone=UTC, job_defaults=TIMER_DEFAULTS)
        if threaded
        else AsyncIOScheduler(timezone=UTC, job_defaults=TIMER_DEFAULTS)
    )

    async def skips_logged(timer: Any) -> bool:
        skipped = threading.Event()
        timer.add_listener(lambda _: skipped.set(), EVENT_JOB_MAX_INSTANCES)
        timer.add_job(blocked if threaded else blocked_async, "interval", seconds=0.01)
        caplog.clear()
        timer.start()
        try:
            assert await wait(skipped)
        finally:
            go.set()
            timer.shutdown(wait=False)
        go.clear()
        return any("maximum number of running" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.DEBUG):
        assert not await skips_logged(ours)
        assert await skips_logged(theirs)


@pytest.mark.pure
def test_a_server_s_refusal_ends_an_outage_as_an_answer_does() -> None:
    """Back from an outage, the first reply may be a refusal (a duplicate key): the server
    answered, so the outage is over; a client-side error proves nothing either way."""
    clock = FakeClock()
    told: list[Any] = []
    watch = DatabaseWatch(clock, told.append)
    with pytest.raises(StoreError), driver_errors("claim on jobs", watch=watch):
        raise ServerSelectionTimeoutError("no primary")
    assert [type(c) for c in told] == [Unreachable]
    with pytest.raises(StoreError), driver_errors("write to jobs/1", watch=watch):
        raise InvalidOperation("the client refused it")  # no reply: still down
    assert watch.down
    clock.advance(30)
    with pytest.raises(StoreError), driver_errors("submit to jobs", watch=watch):
        raise DuplicateKeyError("E11000 duplicate key")
    assert [type(c) for c in told] == [Unreachable, Back] and not watch.down
    assert told[1].down_for == 30
