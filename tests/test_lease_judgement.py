"""A lease lasts what its holder's settings say, judged by the server's time carried forward
by each replica's monotonic clock: not by the reader's settings, not by a wall clock that
an NTP correction steps, and safely even when the server reports no time at all."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest
from pymongo.database import Database

from orchestrator import ConfigError, Lease, Orchestrator, Settings
from orchestrator.core.clock import ServerClock
from orchestrator.testing import FakeClock, memory_database
from tests.conftest import MakeEither
from tests.engines import MODES, Replica, hold, wait
from tests.holding import hold_step


def _recorder(orch: Orchestrator, collection: str = "jobs", phase: str = "Running") -> list[Any]:
    ran: list[Any] = []

    @orch.phase(collection, phase)
    def record(lease: Lease[Any]) -> Any:
        ran.append(lease.id)
        return lease.advance("Done")

    return ran


def _hold(orch: Orchestrator) -> tuple[dict[str, Any], threading.Thread]:
    """``orch`` holds one step until told; give it one slot, or its other workers would
    take its own expired document back when the clock moves."""
    box = hold_step(orch)
    tick = threading.Thread(target=orch.run_once)
    tick.start()
    assert box["claimed"].wait(10)
    return box, tick


def _finish(box: dict[str, Any], tick: threading.Thread) -> None:
    box["go"].set()
    tick.join(10)
    assert not tick.is_alive()


def _arecorder(replica: Replica, phase: str = "Running") -> list[Any]:
    """``_recorder`` on a replica of either engine."""
    ran: list[Any] = []

    @replica.phase("jobs", phase)
    async def record(lease: Any) -> Any:
        ran.append(lease.id)
        return await lease.advance("Done")

    return ran


@asynccontextmanager
async def _holding(replica: Replica) -> AsyncIterator[dict[str, Any]]:
    """``replica`` holds one step (give it one slot, or its other workers would take its
    own expired document back when the clock moves) until the block ends."""
    box = hold(replica)
    async with anyio.create_task_group() as group:
        group.start_soon(replica.run_once)
        assert await wait(box["claimed"])
        try:
            yield box
        finally:
            box["go"].set()


# -- mixed lock timeouts, on both engines and mixed -------------------------------------

ENGINES = pytest.mark.parametrize("replicas", MODES, indirect=True)


@pytest.mark.anyio
@ENGINES
async def test_a_short_timeout_reader_does_not_steal_a_long_timeout_lease(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    long = await replicas("long", lock_timeout=300, heartbeat=False, max_concurrency=1)
    short = await replicas("short", lock_timeout=30)
    ran = _arecorder(short)
    doc = await long.submit("jobs", {"phase": "Running"})
    async with _holding(long):
        clock.advance(31)
        await short.run_once()
        clock.advance(268)  # 299 s into a 300 s lease
        await short.run_once()
        assert ran == []
    assert db.jobs.find_one({"_id": doc["_id"]})["phase"] == "Done"  # type: ignore[index]


@pytest.mark.anyio
@ENGINES
async def test_a_long_timeout_reader_takes_a_short_lease_when_it_expires(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    short = await replicas("short", lock_timeout=30, heartbeat=False, max_concurrency=1)
    long = await replicas("long", lock_timeout=300)
    ran = _arecorder(long)
    await short.submit("jobs", {"phase": "Running"})
    async with _holding(short) as box:
        clock.advance(31)
        await long.run_once()
        assert len(ran) == 1  # not 300 s later: the holder said 30
    assert isinstance(box["lost"], Exception)  # the stale holder's advance is fenced out


@pytest.mark.anyio
@ENGINES
async def test_a_relock_is_honoured_exactly_by_a_replica_with_another_lock_timeout(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    writer = await replicas("writer", lock_timeout=300)
    reader = await replicas("reader", lock_timeout=30)

    @writer.phase("jobs", "Polling")
    async def poll(lease: Any) -> Any:
        return await lease.relock(wait=10)

    ran = _arecorder(reader, phase="Polling")
    await writer.submit("jobs", {"phase": "Polling"})
    await writer.run_once()
    clock.advance(9.9)
    await reader.run_once()
    assert ran == []
    clock.advance(0.2)
    await reader.run_once()
    assert len(ran) == 1


# -- wall-clock steps, and a server without time -----------------------------------------


@pytest.mark.anyio
async def test_an_ntp_step_between_measurements_does_not_steal_a_live_lease(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    holder = await replicas("holder", heartbeat=False, max_concurrency=1)
    view = clock.skewed(0)
    reader = await replicas("reader", clock=view, clock_refresh=3600)
    ran = _arecorder(reader)
    await holder.submit("jobs", {"phase": "Running"})
    await reader.measure_clock()  # the reader's estimate is anchored now
    async with _holding(holder):
        clock.advance(1)
        view.step_wall(40)  # the reader's wall clock jumps 40 s ahead
        await reader.run_once()
        assert ran == []
        clock.advance(30)  # the lease really expires: monotonic time moved on
        await reader.run_once()
        assert len(ran) == 1


def test_the_estimate_is_re_anchored_at_the_next_measurement(clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    view = clock.skewed(0)
    orch = Orchestrator(db, replica_id="r", clock=view, clock_refresh=60)
    orch.measure_clock()
    start = orch.clock.now()
    view.step_wall(40)
    orch.measure_clock()  # not due: nothing measured
    assert orch.clock.now() == start  # the step alone moves nothing
    clock.advance(61)
    orch.measure_clock()
    assert orch.clock.now() == start + timedelta(seconds=61)  # re-measured: the server's time
    assert orch.clock.offset == timedelta(seconds=-40)


@pytest.fixture
def timeless(clock: FakeClock) -> Database[Any]:
    """A server whose hello carries no localTime."""
    return memory_database(clock=clock, server_time=False)


def test_a_server_without_time_is_said_loudly_once(
    timeless: Database[Any], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="orchestrator")
    orch = Orchestrator(timeless, replica_id="r", clock=clock, clock_refresh=1)
    _recorder(orch)
    for _ in range(3):
        orch.run_once()
        clock.advance(2)
    warnings = [r for r in caplog.records if getattr(r, "outcome", "") == "clock-fallback"]
    assert len(warnings) == 1
    assert "skew_tolerance" in warnings[0].getMessage()
    assert orch.stats()["clock_fallback"] == 1
    assert orch.clock.server_time is False and orch.clock.uncertainty == 60


def test_without_server_time_a_replica_40s_ahead_does_not_steal_a_live_lease(
    timeless: Database[Any], clock: FakeClock
) -> None:
    holder = Orchestrator(
        timeless, replica_id="holder", clock=clock, heartbeat=False, max_concurrency=1
    )
    ahead = Orchestrator(timeless, replica_id="ahead", clock=clock.skewed(40))
    ran = _recorder(ahead)
    holder.submit("jobs", {"phase": "Running"})
    box, tick = _hold(holder)
    try:
        clock.advance(1)
        ahead.run_once()
        clock.advance(48)  # 49 s: 30 s lease + 60 s tolerance - 40 s skew = 50 s
        ahead.run_once()
        assert ran == []
        clock.advance(2)
        ahead.run_once()
        assert len(ran) == 1
    finally:
        _finish(box, tick)
        holder.stop(timeout=5)
        ahead.stop(timeout=5)


# -- durations that would overflow date arithmetic ---------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    "values",
    [
        {"max_wait": 1e12},
        {"lock_timeout": 1e11, "step_timeout": None},
        {"lock_timeout": 86_401, "step_timeout": None},
        {"step_timeout": 1e10},
        {"min_relock": 1e12},
        {"min_relock": 7200, "max_wait": 3600},
        {"clock_refresh": 1e12},
        {"skew_tolerance": 1e9},
        {"max_unlocks_per_tick": 10**9},
    ],
    ids=str,
)
def test_durations_out_of_date_range_are_refused_at_construction(values: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Settings.build(**values)


@pytest.mark.anyio
async def test_the_longest_allowed_durations_run_a_tick_without_overflow(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(
        lock_timeout=86_400, max_wait=30 * 86_400, step_timeout=None, min_relock=86_400
    )

    @orch.phase("jobs", "Running")
    async def wait_long(lease: Any) -> Any:
        return await lease.relock(wait=30 * 86_400)

    await orch.submit("jobs", {"phase": "Running"})
    assert await orch.run_once() == {"claimed": 1, "relocked": 1, "ticks": 1}
    clock.advance(30 * 86_400 - 1)
    assert await orch.run_once() == {"ticks": 1}


@pytest.mark.pure
def test_the_estimate_never_runs_backwards_when_a_measurement_comes_out_earlier(
    clock: FakeClock,
) -> None:
    """An asymmetric round trip (or a server stepping its own clock back) makes a new
    measurement earlier than what this replica already judged by: time holds until it
    catches up, rather than running back and re-opening decisions already made."""
    server = ServerClock(clock, refresh=10)
    server.record(clock.now(), clock.monotonic(), clock.monotonic(), clock.now())
    first = server.now()
    clock.advance(9.99)
    before = server.now()
    clock.advance(0.01)
    assert server.due
    answer = clock.now() + timedelta(seconds=-3)  # the server says 3 s less than the estimate
    server.record(answer, clock.monotonic(), clock.monotonic(), clock.now())
    held = server.now()
    assert before > first and held == before
    clock.advance(3.5)  # the new anchor (10 - 3 s) plus 3.5 s is past the held value
    assert server.now() == first + timedelta(seconds=10.5)


@pytest.mark.anyio
async def test_a_long_wait_is_honoured_by_a_replica_with_a_shorter_max_wait(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """A 10-day relock written by a replica with ``max_wait`` of 30 days. Before the fix
    a replica with the default ``max_wait`` took any ``lockedUntil`` past its own
    ``max(max_wait, 1 day)`` for corrupt, and ran the step 5 s later."""
    patient = await replicas("patient", max_wait=30 * 86_400)
    hasty = await replicas("hasty")
    ran: list[str] = []
    ten_days = 10 * 86_400

    @patient.phase("jobs", "Waiting")
    async def wait_long(lease: Any) -> Any:
        ran.append("patient")
        return await lease.relock(wait=ten_days)

    @hasty.phase("jobs", "Waiting")
    async def wait_short(lease: Any) -> Any:
        ran.append("hasty")
        return await lease.relock()

    await patient.submit("jobs", {"phase": "Waiting"})
    await patient.run_once()
    clock.advance(5)
    await hasty.run_once()
    clock.advance(ten_days - 10)
    await hasty.run_once()
    assert ran == ["patient"]
    clock.advance(10)
    await hasty.run_once()
    assert ran == ["patient", "hasty"]
