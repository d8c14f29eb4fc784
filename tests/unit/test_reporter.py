"""What a replica says about its steps (``orchestrator/runners/reporter.py``): the log lines
and their structured ``extra`` fields (what a JSON formatter or a log search keys on), and
the events its listeners hear, each with the replica, the document and the times it was
given; with no listener, no event is built at all. Times come from the fake clock, the
server's estimate measured 5 s ahead of it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from orchestrator import Listener
from orchestrator.core.clock import ServerClock
from orchestrator.core.events import (
    AttemptFailedEvent,
    ClockMeasuredEvent,
    Event,
    IdleProbeEvent,
    LeaseExtendedEvent,
    LeaseLostEvent,
    Listeners,
    StepClaimedEvent,
    StepFinishedEvent,
    SubmittingEvent,
)
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler, Registry, options
from orchestrator.core.resource import TRACE_FIELD
from orchestrator.core.settings import Settings
from orchestrator.runners.reporter import Reporter
from orchestrator.runners.step import Step
from orchestrator.testing import FakeClock

pytestmark = pytest.mark.pure

OFFSET = 5.0
"""Seconds the server's clock is ahead of the fake local one."""


def provision(lease: Any) -> None:
    return None


def registered(*phases: str) -> list[Handler]:
    registry = Registry(Settings())
    for phase in phases:
        registry.add(provision, "gateways", {"phase": phase}, phase, options({}))
    return list(registry.handlers)


@dataclass
class Held:
    """What the reporter reads of a step's lease."""

    handler: Handler
    claimed_at: datetime
    id: Any = 7
    collection: str = "gateways"
    phase: str | None = "Provisioning"
    doc: dict[str, Any] = field(default_factory=dict)
    taken_from: str | None = None


class Heard(Listener):
    """Every event, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def submitting(self, event: SubmittingEvent) -> None:
        event.carrier["traceparent"] = "00-abc-def-01"
        event.carrier["bad.key"] = "dropped"
        self.events.append(event)

    def step_claimed(self, event: StepClaimedEvent) -> None:
        self.events.append(event)

    def step_finished(self, event: StepFinishedEvent) -> None:
        self.events.append(event)

    def attempt_failed(self, event: AttemptFailedEvent) -> None:
        self.events.append(event)

    def lease_lost(self, event: LeaseLostEvent) -> None:
        self.events.append(event)

    def lease_extended(self, event: LeaseExtendedEvent) -> None:
        self.events.append(event)

    def clock_measured(self, event: ClockMeasuredEvent) -> None:
        self.events.append(event)

    def idle_probe(self, event: IdleProbeEvent) -> None:
        self.events.append(event)


@dataclass
class Replica:
    """A reporter and what it needs: its clocks, a lease held since now, and a listener."""

    local: FakeClock
    clock: ServerClock
    report: Reporter
    heard: Heard
    lease: Any  # a Held: what the reporter reads of a LeaseCore


def replica(*, listening: bool = True) -> Replica:
    local = FakeClock()
    clock = ServerClock(local)
    now = local.now()
    clock.record(now + timedelta(seconds=OFFSET), local.monotonic(), local.monotonic(), now)
    heard = Heard()
    listeners = Listeners("pod-1", [heard] if listening else [])
    report = Reporter("pod-1", listeners, local, clock)
    (handler,) = registered("Provisioning")
    return Replica(local, clock, report, heard, Held(handler, clock.now()))


def on_orchestrator(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "orchestrator"]


# -- log lines ------------------------------------------------------------------------------


def test_a_step_s_line_carries_the_replica_document_phase_outcome_and_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = replica()
    boom = ValueError("upstream said no")
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        r.report.log(logging.ERROR, "step failed", r.lease, StepOutcome.FAILED, exc_info=boom)
    (record,) = on_orchestrator(caplog)
    fields = record.__dict__
    assert record.levelno == logging.ERROR and record.getMessage() == "step failed"
    assert {k: fields[k] for k in ("replica", "collection", "doc_id", "phase", "handler")} == {
        "replica": "pod-1",
        "collection": "gateways",
        "doc_id": "7",  # text, whatever the _id's type
        "phase": "Provisioning",
        "handler": r.lease.handler.name,
    }
    assert fields["outcome"] == "failed" and type(fields["outcome"]) is str
    assert "wait" not in fields
    assert record.exc_info is not None and record.exc_info[1] is boom


def test_a_step_s_line_says_the_wait_its_outcome_set_to_the_millisecond(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = replica()
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        r.report.log(logging.INFO, "relocked", r.lease, StepOutcome.RELOCKED, wait=2.34567)
    (record,) = on_orchestrator(caplog)
    assert record.__dict__["wait"] == 2.346


def test_a_line_below_the_logger_s_level_is_never_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = replica()
    nothing: Any = object()  # nothing to read: building the line would raise
    with caplog.at_level(logging.INFO, logger="orchestrator"):
        r.report.log(logging.DEBUG, "claimed", nothing, "claimed")
    assert on_orchestrator(caplog) == []


def test_a_line_about_the_replica_carries_its_name_outcome_and_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = replica()
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        r.report.line(logging.INFO, "started", "started", tick=1.0)
    (record,) = on_orchestrator(caplog)
    assert (record.__dict__["replica"], record.__dict__["outcome"]) == ("pod-1", "started")
    assert record.__dict__["tick"] == 1.0


def test_a_take_over_is_a_warning_naming_the_replica_it_took_from(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = replica()
    r.lease.taken_from = "pod-9"
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        r.report.taken_over(r.lease)
    (record,) = on_orchestrator(caplog)
    assert record.levelno == logging.WARNING
    assert record.__dict__["outcome"] == "taken-over"
    assert "'pod-9'" in record.getMessage()
    assert r.heard.events == []  # a take-over is logged, not an event


def test_a_lost_lease_is_logged_and_heard_with_how_long_it_was_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = replica()
    r.local.advance(12)
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        r.report.lost("another replica holds it", r.lease)
    (record,) = on_orchestrator(caplog)
    assert record.levelno == logging.WARNING and record.__dict__["outcome"] == "lost"
    assert r.heard.events == [
        LeaseLostEvent(
            "pod-1",
            "gateways",
            7,
            "Provisioning",
            r.lease.handler.name,
            "another replica holds it",
            12.0,
        )
    ]


# -- events ---------------------------------------------------------------------------------


def test_a_submit_stores_what_the_listeners_put_in_the_carrier_cleaned() -> None:
    r = replica()
    stored = r.report.submitting("gateways", {"_id": "gw-1", "phase": "New", "name": "a"})
    assert stored == {"traceparent": "00-abc-def-01"}
    (event,) = r.heard.events
    assert isinstance(event, SubmittingEvent)
    assert (event.replica, event.collection, event.document_id, event.phase) == (
        "pod-1",
        "gateways",
        "gw-1",
        "New",
    )


def test_a_submit_with_no_listener_stores_nothing() -> None:
    r = replica(listening=False)
    assert r.report.submitting("gateways", {"phase": "New"}) == {}


def test_a_claimed_step_is_heard_with_its_number_latency_and_the_carrier_its_submit_stored() -> (
    None
):
    r = replica()
    r.lease.doc = {TRACE_FIELD: {"traceparent": "00-abc-def-01", "$bad": "x"}}
    step: Step[Any] = Step(r.lease, number=3, latency=1.5)
    r.report.claimed(step)
    assert r.heard.events == [
        StepClaimedEvent(
            "pod-1",
            "gateways",
            7,
            "Provisioning",
            r.lease.handler.name,
            3,
            1.5,
            {"traceparent": "00-abc-def-01"},
        )
    ]


def test_a_finished_step_is_heard_with_its_outcome_duration_by_the_local_clock_and_wait() -> None:
    r = replica()
    step: Step[Any] = Step(r.lease, number=3, started=r.local.monotonic(), wait=30.0)
    r.local.advance(4)
    r.report.finished(step, StepOutcome.RELOCKED)
    assert r.heard.events == [
        StepFinishedEvent(
            "pod-1",
            "gateways",
            7,
            "Provisioning",
            r.lease.handler.name,
            3,
            StepOutcome.RELOCKED,
            4.0,
            30.0,
        )
    ]


@pytest.mark.parametrize(
    ("outcome", "final"), [(StepOutcome.RETRYING, False), (StepOutcome.FAILED, True)]
)
def test_a_failed_attempt_is_heard_final_only_when_it_moved_to_the_failed_phase(
    outcome: StepOutcome, final: bool
) -> None:
    r = replica()
    step: Step[Any] = Step(r.lease, wait=8.0)
    r.report.attempt_failed(step, "ValueError", "upstream said no", outcome)
    assert r.heard.events == [
        AttemptFailedEvent(
            "pod-1",
            "gateways",
            7,
            "Provisioning",
            r.lease.handler.name,
            "ValueError",
            "upstream said no",
            outcome,
            8.0,
            final,
        )
    ]


def test_an_extension_is_heard_with_how_long_the_lease_was_held_by_the_server_s_clock() -> None:
    r = replica()
    r.local.advance(20)
    r.report.extended(r.lease)
    assert r.heard.events == [
        LeaseExtendedEvent("pod-1", "gateways", 7, "Provisioning", r.lease.handler.name, 20.0)
    ]


def test_a_probe_is_heard_per_collection_with_its_handlers_names() -> None:
    r = replica()
    handlers = tuple(registered("New", "Deleting"))
    r.report.probed("gateways", handlers, None, 0.25)
    assert r.heard.events == [
        IdleProbeEvent("pod-1", "gateways", tuple(h.name for h in handlers), None, 0.25)
    ]


def test_a_clock_measurement_is_heard_with_its_offset_and_round_trip() -> None:
    r = replica()
    r.report.clock_measured(r.clock, 0.02)
    assert r.heard.events == [ClockMeasuredEvent("pod-1", OFFSET, 0.02, True)]


def test_with_no_listener_no_event_is_built() -> None:
    """Nothing is read to build one: a lease that has nothing to read raises nothing."""
    r = replica(listening=False)
    nothing: Any = object()
    step: Any = Step(nothing)
    r.report.claimed(step)
    r.report.finished(step, StepOutcome.UNLOCKED)
    r.report.attempt_failed(step, "ValueError", "no", StepOutcome.RETRYING)
    r.report.extended(nothing)
    r.report.probed("gateways", nothing, True, 0.1)
    r.report.clock_measured(nothing, 0.1)
