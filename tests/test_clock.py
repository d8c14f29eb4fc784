"""The server clock estimate: offset from hello, refresh, fallback, failed probes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from bson import ObjectId
from pymongo.database import Database
from pymongo.hello import Hello
from pymongo.server_description import ServerDescription

from orchestrator import Orchestrator, OrchestratorError, StoreError
from orchestrator.core.clock import ServerClock, as_utc
from orchestrator.testing import FakeClock, memory_database


def _hello_time(db: Database[Any]) -> datetime:
    return as_utc(db.command("hello")["localTime"])


def test_the_estimate_is_the_servers_own_clock_and_moves_with_the_local_one(
    db: Database[Any], clock: FakeClock
) -> None:
    """On purpose, the real offset: a replica on a fake clock reads the server's time
    (months away from 2026-01-01 on a real server), then carries it forward by its own
    clock. Every other test compares times through this estimate."""
    orch = Orchestrator(db, clock=clock, clock_refresh=1e6)
    before = _hello_time(db)
    orch.measure_clock()
    after = _hello_time(db)
    estimate = orch.clock.now()
    ms = timedelta(milliseconds=1)  # hello's localTime is a BSON date: milliseconds
    assert before - ms <= estimate <= after + ms
    assert abs(orch.clock.offset - (estimate - clock.now())) <= ms
    clock.advance(90)
    assert orch.clock.now() - estimate == timedelta(seconds=90)


def test_a_skewed_replica_sees_the_servers_time() -> None:
    server = FakeClock()
    db = memory_database(clock=server)
    ahead = Orchestrator(db, clock=server.skewed(+20))
    behind = Orchestrator(db, clock=server.skewed(-45))
    for orch in (ahead, behind):
        orch.measure_clock()
        assert orch.clock.now() == server.now()
    server.advance(7)
    assert ahead.clock.now() == server.now()
    assert ahead.clock.offset == timedelta(seconds=-20)


def test_without_local_time_in_hello_the_local_clock_is_used() -> None:
    server = FakeClock()
    local = server.skewed(+5)
    orch = Orchestrator(memory_database(clock=server, server_time=False), clock=local)
    orch.measure_clock()
    assert orch.clock.now() == local.now()


def _probing(
    local: FakeClock, probe: Callable[[], datetime | None]
) -> Callable[[ServerClock], None]:
    """What the runners do when a measurement is due: probe, and record the answer."""

    def measure_if_due(clock: ServerClock) -> None:
        if not clock.due:
            return
        started = local.monotonic()
        try:
            server = probe()
        except StoreError:
            clock.failed(started)
            if not clock.measured:
                raise
            return
        clock.record(server, started, local.monotonic(), local.now())

    return measure_if_due


@pytest.mark.pure
def test_the_offset_is_refreshed_and_a_failed_probe_keeps_the_last_estimate() -> None:
    local = FakeClock()
    answers: list[datetime | Exception | None] = [
        local.now() + timedelta(seconds=3),
        StoreError("unreachable"),
        local.now() + timedelta(seconds=70 + 9),
    ]
    probes: list[int] = []

    def probe() -> datetime | None:
        probes.append(1)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = ServerClock(local, refresh=30)
    measure = _probing(local, probe)
    assert clock.due
    measure(clock)
    assert clock.now() - local.now() == timedelta(seconds=3)
    measure(clock)
    assert len(probes) == 1, "cached until the refresh is due"
    local.advance(35)
    assert clock.due
    measure(clock)
    assert clock.now() - local.now() == timedelta(seconds=3), "failed probe: last estimate"
    assert len(probes) == 2
    assert not clock.due, "a failed probe is retried at the next refresh, not at once"
    local.advance(35)
    measure(clock)
    assert clock.now() - local.now() == timedelta(seconds=9)
    assert len(probes) == 3


@pytest.mark.pure
def test_with_no_estimate_yet_a_failed_probe_raises() -> None:
    def down() -> datetime | None:
        raise StoreError("unreachable")

    local = FakeClock()
    clock = ServerClock(local, refresh=30)
    measure = _probing(local, down)
    with pytest.raises(StoreError):
        measure(clock)
    assert clock.due, "it keeps trying rather than falling back to the local clock"
    with pytest.raises(StoreError):
        measure(clock)
    with pytest.raises(OrchestratorError, match="not been measured"):
        clock.now()  # never an answer from an unmeasured clock


@pytest.mark.pure
def test_reading_the_time_does_no_io() -> None:
    local = FakeClock()
    clock = ServerClock(local, refresh=30)
    clock.record(local.now() + timedelta(seconds=10), 0.0, 2.0, local.now())
    first = clock.now()
    local.advance(100)
    assert clock.due, "a measurement is due..."
    assert clock.now() == first + timedelta(seconds=100), "...and now() answers without one"


# -- a failover to a node whose clock differs -----------------------------------------------


class _Topology:
    """What the driver knows of a replica set (``client.topology_description``), with a
    primary the test elects; a database proxy that reports it."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._primary: ServerDescription | None = None

    def elect(self, host: str) -> None:
        hello = Hello(
            {
                "ok": 1,
                "isWritablePrimary": True,
                "setName": "rs0",
                "electionId": ObjectId(),
                "setVersion": 1,
                "maxWireVersion": 21,
            }
        )
        self._primary = ServerDescription((host, 27017), hello)

    def server_descriptions(self) -> dict[Any, ServerDescription]:
        return {} if self._primary is None else {self._primary.address: self._primary}

    @property
    def topology_description(self) -> _Topology:
        return self

    @property
    def client(self) -> _Topology:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_new_primary_is_measured_at_the_next_tick_not_a_refresh_later() -> None:
    """The primary fails over to a node whose clock is 40 s ahead. Before the fix the
    replica kept its old estimate until ``clock_refresh`` (here: never), disagreeing with
    replicas that measured the new primary; now the next tick measures it."""
    local, server = FakeClock(), FakeClock()
    topology = _Topology(memory_database(clock=server))
    topology.elect("node-a")
    orch = Orchestrator(topology, clock=local, clock_refresh=1e6)  # type: ignore[arg-type]
    orch.measure_clock()
    orch.run_once()
    before = orch.clock.offset
    orch.run_once()  # the same primary: nothing to re-measure
    assert orch.clock.offset == before
    server.advance(40)  # the next primary's clock
    topology.elect("node-b")
    orch.run_once()
    orch.measure_clock()  # what every action does first: due now, not a refresh later
    assert orch.clock.offset - before == timedelta(seconds=40)


@pytest.mark.pure
def test_a_measurement_stands_for_the_middle_of_its_round_trip() -> None:
    local = FakeClock()
    measured: list[tuple[ServerClock, float]] = []
    clock = ServerClock(local, refresh=30, on_measured=lambda c, rtt: measured.append((c, rtt)))
    started = local.monotonic()
    local.advance(2)  # the probe's round trip: the reply stands for one second ago
    clock.record(local.now() + timedelta(seconds=99), started, local.monotonic(), local.now())
    assert clock.offset == timedelta(seconds=100)
    assert clock.now() == local.now() + timedelta(seconds=100)
    assert clock.server_time and clock.uncertainty == 0.0 and clock.measured
    assert measured == [(clock, 2.0)]
    local.advance(27.9)
    assert not clock.due, "due a refresh after the probe started"
    local.advance(0.1)
    assert clock.due


@pytest.mark.pure
def test_without_server_time_the_local_clock_stands_in_with_its_tolerance() -> None:
    local = FakeClock()
    fallbacks: list[int] = []
    clock = ServerClock(local, tolerance=5, on_fallback=lambda: fallbacks.append(1))
    started = local.monotonic()
    local.advance(2)
    clock.record(None, started, local.monotonic(), local.now())
    assert clock.offset == timedelta(0) and not clock.server_time
    assert clock.uncertainty == 5.0
    assert clock.now() == local.now()
    clock.record(None, local.monotonic(), local.monotonic(), local.now())
    assert fallbacks == [1], "said once, not at every measurement"
    clock.record(local.now(), local.monotonic(), local.monotonic(), local.now())
    assert clock.server_time and clock.uncertainty == 0.0
    clock.record(None, local.monotonic(), local.monotonic(), local.now())
    assert fallbacks == [1, 1], "said again after the server gave its time meanwhile"


@pytest.mark.pure
def test_by_default_a_measurement_is_due_every_minute_and_the_tolerance_is_a_minute() -> None:
    local = FakeClock()
    clock = ServerClock(local)
    assert clock.due and not clock.measured and clock.server_time
    clock.record(None, local.monotonic(), local.monotonic(), local.now())
    assert clock.uncertainty == 60.0
    local.advance(59.9)
    assert not clock.due
    local.advance(0.1)
    assert clock.due


@pytest.mark.pure
def test_a_new_server_makes_a_measurement_due_at_once() -> None:
    local = FakeClock()
    clock = ServerClock(local)
    clock.watch("a")
    clock.record(local.now(), local.monotonic(), local.monotonic(), local.now())
    clock.watch(None)
    clock.watch("a")
    assert not clock.due, "the same server, or none known: no new measurement"
    clock.watch("b")
    assert clock.due
