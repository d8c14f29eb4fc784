"""The listener interface: what a replica reports, alike on both engines, and a listener
that raises never breaking a step. Time comes from the FakeClock."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import anyio
import pytest
from pymongo.database import Database

from orchestrator import (
    AttemptFailedEvent,
    ClockMeasuredEvent,
    ConfigError,
    IdleProbeEvent,
    LeaseExtendedEvent,
    LeaseLostEvent,
    Listener,
    Orchestrator,
    ScheduleFiredEvent,
    StepClaimedEvent,
    StepFinishedEvent,
    StepOutcome,
    SubmittingEvent,
)
from orchestrator.core.events import MAX_CARRIER_ENTRIES, Event, Listeners, carrier
from orchestrator.core.queries import claims
from orchestrator.core.resource import EPOCH
from orchestrator.testing import FakeClock, memory_database
from tests.conftest import MakeEither
from tests.engines import hold, wait

pytestmark = pytest.mark.anyio


class Recorder(Listener):
    """Every event, in order (listeners are called from worker threads too)."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self._lock = threading.Lock()

    def _add(self, event: object) -> None:
        with self._lock:
            self.events.append(event)

    submitting = step_claimed = step_finished = attempt_failed = lease_lost = _add
    lease_extended = clock_measured = idle_probe = _add

    def of(self, kind: type[Any]) -> list[Any]:
        with self._lock:
            return [e for e in self.events if isinstance(e, kind)]

    def clear(self) -> None:
        with self._lock:
            self.events.clear()


async def test_claims_and_outcomes_are_reported_with_latency_and_duration(
    replicas: MakeEither, clock: FakeClock
) -> None:
    recorder = Recorder()
    replica = await replicas("pod-1", listeners=[recorder])
    measured = recorder.of(ClockMeasuredEvent)
    assert len(measured) == 1 and measured[0].replica == "pod-1" and measured[0].server_time

    @replica.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        if not lease.doc.get("waited"):
            return await lease.relock(10, waited=True)
        clock.advance(0.25)  # the step's own work
        return await lease.advance("Done")

    @replica.phase("jobs", "Other")  # two handlers on a collection: an idle replica probes it
    async def other(lease: Any) -> Any:
        return await lease.advance("Done")

    doc = await replica.submit("jobs", {"phase": "Running"})
    clock.advance(3)  # due since its submit
    await replica.run_once()
    clock.advance(12)  # its relock's 10 s ran out 2 s ago
    await replica.run_once()

    claims = recorder.of(StepClaimedEvent)
    assert [(c.collection, c.document_id, c.phase, c.replica) for c in claims] == [
        ("jobs", doc["_id"], "Running", "pod-1")
    ] * 2
    # Times are stored to the millisecond.
    assert claims[0].latency == pytest.approx(3.0, abs=0.002)
    assert claims[1].latency == pytest.approx(2.0, abs=0.002)
    finished = recorder.of(StepFinishedEvent)
    assert [(f.step, f.outcome, f.wait, f.duration) for f in finished] == [
        (claims[0].step, "relocked", 10.0, 0.0),
        (claims[1].step, "advanced", None, 0.25),
    ]
    assert claims[0].step != claims[1].step

    recorder.clear()
    await replica.run_once()  # nothing left: an idle probe that finds nothing
    probes = recorder.of(IdleProbeEvent)
    assert probes and all(p.collection == "jobs" and p.found is False for p in probes)
    assert set(probes[0].handlers) == {h.name for h in replica.orch.handlers}
    assert not recorder.of(StepClaimedEvent)


async def test_failed_attempts_and_lost_leases_are_reported(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    recorder = Recorder()
    replica = await replicas("pod-1", listeners=[recorder], max_attempts=2)

    @replica.phase("jobs", "Flaky")
    async def flaky(lease: Any) -> Any:
        raise ValueError("the SDK said no")

    @replica.phase("jobs", "Taken")
    async def taken(lease: Any) -> Any:
        # Another replica took the document over meanwhile, and moved it on.
        db.jobs.update_one(
            {"_id": lease.id}, {"$set": {"lockToken": "someone-else", "phase": "Elsewhere"}}
        )
        return await lease.advance("Done")

    await replica.submit("jobs", {"_id": "flaky", "phase": "Flaky"})
    await replica.submit("jobs", {"_id": "taken", "phase": "Taken"})
    await replica.run_once()
    clock.advance(3600)  # past any retry backoff
    await replica.run_once()

    failures = recorder.of(AttemptFailedEvent)
    assert [(f.document_id, f.error_type, f.outcome, f.final) for f in failures] == [
        ("flaky", "ValueError", "retrying", False),
        ("flaky", "ValueError", "failed", True),
    ]
    assert failures[0].message == "the SDK said no" and failures[0].wait is not None
    lost = recorder.of(LeaseLostEvent)
    assert [(e.document_id, e.phase) for e in lost] == [("taken", "Taken")]
    outcomes = sorted((f.document_id, f.outcome) for f in recorder.of(StepFinishedEvent))
    assert outcomes == [("flaky", "failed"), ("flaky", "retrying"), ("taken", "lost")]


async def test_the_heartbeat_and_a_time_out_are_reported(
    replicas: MakeEither, clock: FakeClock
) -> None:
    recorder = Recorder()
    # The lease outlives the step_timeout (extended at 300 s, it lasts to 900 s), so when
    # the clock jumps to the time-out no claim can take the document back: an idle
    # worker's claim still on its way would, from an expired lease. And in minutes,
    # run_once's own heartbeat (every lock_timeout/6 of real time) never runs meanwhile.
    worker = await replicas(
        "pod-1", listeners=[recorder], lock_timeout=600, tick=600, step_timeout=600
    )
    box = hold(worker)
    await worker.submit("jobs", {"_id": "long", "phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run_once)
        assert await wait(box["claimed"])
        clock.advance(300)
        assert await worker.heartbeat() == 1
        clock.advance(350)  # 650 s: past step_timeout
        await worker.heartbeat()
    box["go"].set()
    if worker.threaded:  # its thread returns at last (an async step was cancelled)
        assert await wait(box["returned"])

    extended = recorder.of(LeaseExtendedEvent)
    assert [(e.document_id, e.held_for) for e in extended] == [
        ("long", pytest.approx(300.0, abs=0.002))
    ]
    finished = recorder.of(StepFinishedEvent)
    assert [(f.outcome, f.duration) for f in finished] == [("timed_out", 650.0)], "one per claim"
    # (A thread step's late write after it is reported as a lost lease, not recorded.)
    assert recorder.of(AttemptFailedEvent)[0].error_type == "StepTimeout"


class Broken(Listener):
    """Raises on every event."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def _raise(self, event: object) -> None:
        with self._lock:  # called from worker threads too
            self.calls += 1
        raise RuntimeError("a bug in a listener")

    submitting = step_claimed = step_finished = attempt_failed = lease_lost = _raise
    lease_extended = clock_measured = idle_probe = schedule_fired = _raise


async def test_a_listener_that_raises_never_breaks_a_step(
    replicas: MakeEither, db: Database[Any], caplog: pytest.LogCaptureFixture
) -> None:
    broken, recorder = Broken(), Recorder()
    caplog.set_level(logging.ERROR, logger="orchestrator")
    replica = await replicas("pod-1", listeners=[broken])
    replica.orch.add_listener(recorder)  # added later: called after the broken one

    @replica.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        return await lease.advance("Done")

    for n in range(3):
        await replica.submit("jobs", {"_id": n, "phase": "Running"})
    counts = await replica.run_once()

    assert counts.get("advanced") == 3
    assert [d["phase"] for d in db.jobs.find({})] == ["Done"] * 3
    assert len(recorder.of(StepFinishedEvent)) == 3, "the other listeners are still called"
    assert broken.calls > 3
    assert replica.stats()["listener_errors"] == broken.calls, "each error is counted"
    logged = [r for r in caplog.records if getattr(r, "outcome", None) == "listener-error"]
    assert len(logged) == 1, "logged once per listener, not at every event"
    assert logged[0].listener == "Broken"  # type: ignore[attr-defined]
    assert logged[0].replica == "pod-1"  # type: ignore[attr-defined]
    assert logged[0].exc_info is not None


def test_a_listener_is_a_listener(clock: FakeClock) -> None:
    with pytest.raises(ConfigError, match=r"subclasses orchestrator\.Listener"):
        Orchestrator(memory_database(clock=clock), clock=clock, listeners=[object()])  # type: ignore[list-item]


def _at(seconds: float) -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("before", "due"),
    [
        # A relock's or retry's wait, or an expired lease, ran out at lockedUntil.
        ({"lockedUntil": _at(50), "updatedAt": _at(0), "lockedAt": _at(10)}, _at(50)),
        # Submitted, or advanced into its phase: due since it entered it.
        ({"lockedUntil": EPOCH, "updatedAt": _at(5)}, _at(5)),
        ({"lockedUntil": EPOCH, "updatedAt": _at(5), "lockedAt": _at(4)}, _at(5)),
        ({"updatedAt": _at(5)}, _at(5)),
        # Unlocked (or handed back) within its phase: when is not recorded.
        ({"lockedUntil": EPOCH, "updatedAt": _at(5), "lockedAt": _at(9)}, None),
        # Malformed lease fields: claimable, since nobody knows when.
        ({"lockedUntil": "soon", "updatedAt": _at(5)}, None),
        ({"lockedUntil": EPOCH, "updatedAt": "then"}, None),
    ],
)
def test_how_long_a_document_was_due_is_read_from_its_fields(
    before: dict[str, Any], due: datetime | None
) -> None:
    assert claims.due_since(before) == due


@pytest.mark.pure
def test_a_claim_applies_its_update_to_the_document_it_read() -> None:
    before = {"_id": 1, "phase": "P", "lockedUntil": EPOCH}
    now = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    after = claims.claimed(before, claims.claim_update(now, now, "t", "pod-1"))
    assert after == {
        "_id": 1,
        "phase": "P",
        "lockedUntil": datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC),  # as stored
        "lockedAt": datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC),
        "lockToken": "t",
        "lockedBy": "pod-1",
    }
    with pytest.raises(ConfigError, match="only sets fields"):
        claims.claimed({}, {"$set": {}, "$inc": {"claims": 1}})


# -- typed dispatch, without a replica -------------------------------------------------------

STEP = ("pod-1", "jobs", 1, "Running", "jobs.Running")
"""What every step event says first: replica, collection, document id, phase, handler."""

SAMPLES: dict[str, Event] = {
    # The Listener method each event type is delivered to, and one event of that type.
    "submitting": SubmittingEvent("pod-1", "jobs", 1, "Running"),
    "step_claimed": StepClaimedEvent(*STEP, 7, 0.5),
    "step_finished": StepFinishedEvent(*STEP, 7, StepOutcome.ADVANCED, 1.5),
    "attempt_failed": AttemptFailedEvent(
        *STEP, "ValueError", "bad", StepOutcome.RETRYING, 2.0, False
    ),
    "lease_lost": LeaseLostEvent(*STEP, "taken", 3.0),
    "lease_extended": LeaseExtendedEvent(*STEP, 4.0),
    "clock_measured": ClockMeasuredEvent("pod-1", 0.25, 0.01, True),
    "idle_probe": IdleProbeEvent("pod-1", "jobs", ("jobs.Running",), False, 0.02),
    "schedule_fired": ScheduleFiredEvent(
        "pod-1", "nightly", datetime(2026, 1, 1, tzinfo=UTC), "started", 0.2, "nightly@x"
    ),
}


class ByMethod(Listener):
    """Which method each event reached."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def submitting(self, event: SubmittingEvent) -> None:
        self.calls.append(("submitting", event))

    def step_claimed(self, event: StepClaimedEvent) -> None:
        self.calls.append(("step_claimed", event))

    def step_finished(self, event: StepFinishedEvent) -> None:
        self.calls.append(("step_finished", event))

    def attempt_failed(self, event: AttemptFailedEvent) -> None:
        self.calls.append(("attempt_failed", event))

    def lease_lost(self, event: LeaseLostEvent) -> None:
        self.calls.append(("lease_lost", event))

    def lease_extended(self, event: LeaseExtendedEvent) -> None:
        self.calls.append(("lease_extended", event))

    def clock_measured(self, event: ClockMeasuredEvent) -> None:
        self.calls.append(("clock_measured", event))

    def idle_probe(self, event: IdleProbeEvent) -> None:
        self.calls.append(("idle_probe", event))

    def schedule_fired(self, event: ScheduleFiredEvent) -> None:
        self.calls.append(("schedule_fired", event))


def test_every_event_type_has_a_sample_and_a_listener_method() -> None:
    assert {type(e) for e in SAMPLES.values()} == set(get_args(Event))
    assert set(SAMPLES) == {n for n, v in vars(Listener).items() if inspect.isfunction(v)}


@pytest.mark.parametrize("method", SAMPLES)
def test_each_event_reaches_its_own_listener_method(method: str) -> None:
    listener = ByMethod()
    listeners = Listeners("pod-1", [listener])
    listeners.emit(SAMPLES[method])
    assert listener.calls == [(method, SAMPLES[method])]
    assert listeners.errors == 0


def test_a_raising_listener_is_isolated_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="orchestrator")
    broken, after = Broken(), ByMethod()
    listeners = Listeners("pod-1", [broken, after])
    for event in SAMPLES.values():
        listeners.emit(event)
    assert after.calls == list(SAMPLES.items()), "the next listener still gets every event"
    assert listeners.errors == broken.calls == len(SAMPLES)
    logged = [r for r in caplog.records if getattr(r, "outcome", None) == "listener-error"]
    assert len(logged) == 1, "logged once per listener"
    assert (logged[0].listener, logged[0].event) == ("Broken", "submitting")  # type: ignore[attr-defined]
    assert "Broken.submitting raised" in logged[0].getMessage()


@pytest.mark.parametrize("method", SAMPLES)
@pytest.mark.parametrize("kind", ["coroutine", "async generator"])
def test_an_async_listener_method_is_refused(method: str, kind: str) -> None:
    async def coroutine(self: Listener, event: object) -> None:
        raise AssertionError("never awaited")

    async def generator(self: Listener, event: object) -> AsyncIterator[None]:
        yield None

    hook = coroutine if kind == "coroutine" else generator
    listener = type("AsyncHook", (Listener,), {method: hook})()
    listeners = Listeners("pod-1")
    with pytest.raises(ConfigError, match=rf"AsyncHook\.{method} is async"):
        listeners.add(listener)
    assert listeners.active == ()


def test_with_no_listener_an_event_reaches_nothing() -> None:
    listeners = Listeners("pod-1")
    assert not listeners.active  # what the runner tests before it builds an event
    for event in SAMPLES.values():
        listeners.emit(event)
    assert listeners.errors == 0


# -- a carrier stored at submit, carried back by each step's claim --------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("stored", "kept"),
    [
        ({"traceparent": "00-ab-cd-01", "tracestate": "k=v"}, None),  # kept whole
        ("00-ab-cd-01", {}),
        (["traceparent"], {}),
        (None, {}),
        ({"traceparent": 1, "b": None, "c": {"d": "e"}, "f": b"g"}, {}),
        ({1: "x", "": "x", "$set": "x", "a.b": "x", "ok": "x"}, {"ok": "x"}),
        ({"k" * 65: "x", "v": "x" * 8193, "w": "x" * 8192}, {"w": "x" * 8192}),
        ({"nul": "a\x00b", "é": "x", "t": "é", "nl": "a\nb", "sp": "a b"}, {"sp": "a b"}),
        ({f"k{n}": "v" for n in range(20)}, {f"k{n}": "v" for n in range(MAX_CARRIER_ENTRIES)}),
    ],
)
def test_a_carrier_keeps_only_bounded_printable_text(stored: object, kept: object) -> None:
    assert carrier(stored) == (stored if kept is None else kept)


class Injecting(Recorder):
    """Puts its entries into each submit's carrier, as a tracing propagator injects."""

    def __init__(self, entries: dict[Any, Any]) -> None:
        super().__init__()
        self.entries = entries

    def submitting(self, event: SubmittingEvent) -> None:
        self._add(event)
        event.carrier.update(self.entries)


async def test_what_a_listener_puts_in_the_carrier_comes_back_with_every_step(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """Stored on the document at submit (cleaned), read back from the claim and from the
    carried next step, on whichever replica: no extra read."""
    injecting = Injecting({"traceparent": "00-ab-cd-01", "junk": 42, "$x": "y"})
    submitter = await replicas("api", listeners=[injecting])
    recorder = Recorder()
    worker = await replicas("worker", listeners=[recorder])

    @worker.phase("jobs", "A")
    async def first(lease: Any) -> Any:
        return await lease.advance("B")

    @worker.phase("jobs", "B")
    async def second(lease: Any) -> Any:
        return await lease.advance("Done")

    await submitter.submit("jobs", {"_id": 1, "phase": "A"})
    [submitted] = injecting.of(SubmittingEvent)
    assert (submitted.collection, submitted.document_id, submitted.phase) == ("jobs", 1, "A")
    doc = db.jobs.find_one({"_id": 1})
    assert doc is not None and doc["orchestratorTrace"] == {"traceparent": "00-ab-cd-01"}
    await worker.run_once()
    assert worker.stats().get("carried") == 1
    claimed = recorder.of(StepClaimedEvent)
    assert [(e.phase, dict(e.carrier)) for e in claimed] == [
        ("A", {"traceparent": "00-ab-cd-01"}),
        ("B", {"traceparent": "00-ab-cd-01"}),
    ]
    assert recorder.of(SubmittingEvent) == [], "the worker submitted nothing"


@pytest.mark.parametrize("entries", [{}, {"junk": 42}])
async def test_nothing_is_stored_when_no_listener_fills_the_carrier(
    replicas: MakeEither, db: Database[Any], entries: dict[str, Any]
) -> None:
    replica = await replicas(listeners=[Injecting(entries)])
    bare = await replicas("bare")
    await replica.submit("jobs", {"_id": 1, "phase": "A"})
    await bare.submit("jobs", {"_id": 2, "phase": "A"})
    assert [sorted(d) for d in db.jobs.find({}, {"orchestratorTrace": 1})] == [["_id"]] * 2
