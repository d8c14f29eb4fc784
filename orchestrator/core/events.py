"""What a replica reports as it works: events, and the listeners that receive them.

In the manner of PyMongo's monitoring (``pymongo.monitoring``): an event class per thing
that happens, a listener base class with one method per event, and listeners registered on
the object that emits them (``Orchestrator(db, listeners=[...])`` or ``add_listener``),
never in a global registry. Metrics and traces are listeners
(``orchestrator.monitoring``); an application may add its own. Each event delivers itself
to its listener method (``deliver``), so the type checker sees every call.

Events are emitted by the engine written once (``orchestrator.runners``), so the
threaded and the asyncio engine report alike. A listener is called in the thread or task
that did the work, synchronously: it must be quick and thread-safe. One that raises never
breaks a step: its error is logged once per listener and counted, and the step goes on.
With no listener registered, nothing is built or called.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, get_type_hints

from orchestrator.core.errors import ConfigError
from orchestrator.core.outcomes import StepOutcome

logger = logging.getLogger("orchestrator")

__all__ = [
    "AttemptFailedEvent",
    "ClockMeasuredEvent",
    "Event",
    "IdleProbeEvent",
    "LeaseExtendedEvent",
    "LeaseLostEvent",
    "Listener",
    "Listeners",
    "ScheduleFiredEvent",
    "StepClaimedEvent",
    "StepFinishedEvent",
    "SubmittingEvent",
    "carrier",
]

MAX_CARRIER_ENTRIES = 8
MAX_CARRIER_KEY = 64
MAX_CARRIER_VALUE = 8192
"""Bounds of a stored carrier (W3C's ``tracestate`` is at most 512 characters, its
``baggage`` 8192): a document's field may hold anything, and what goes past them is
dropped, never cut (a cut header is a wrong one)."""


def carrier(value: object) -> dict[str, str]:
    """The entries of ``value`` a carrier may hold: printable ASCII text keys (no ``$`` or
    ``.``: they are stored as field names) and values, within the bounds; anything else
    (not a mapping, other types, huge strings) is left out, so a garbage field gives an
    empty carrier, never an error on the step's path."""
    if value is None or not isinstance(value, Mapping):  # None: most documents, at once
        return {}
    kept: dict[str, str] = {}
    for key, text in value.items():
        if len(kept) == MAX_CARRIER_ENTRIES:
            break
        if (
            isinstance(key, str)
            and isinstance(text, str)
            and 0 < len(key) <= MAX_CARRIER_KEY
            and len(text) <= MAX_CARRIER_VALUE
            and _header_text(key)
            and _header_text(text)
            and not key.startswith("$")
            and "." not in key
        ):
            kept[key] = text
    return kept


def _header_text(text: str) -> bool:
    return text.isascii() and text.isprintable()


@dataclass(frozen=True, slots=True)
class SubmittingEvent:
    """A document is about to be submitted (its checks passed): a listener may put text
    entries into ``carrier`` (a tracing propagator's ``inject``), which are stored on the
    document (``TRACE_FIELD``) and come back with each of its steps'
    ``StepClaimedEvent``, on whichever replica claims it. Nothing is stored when the
    carrier stays empty. ``document_id``: the ``_id`` submitted, None when the server
    assigns it."""

    replica: str
    collection: str
    document_id: Any
    phase: str
    carrier: dict[str, str] = field(default_factory=dict)

    def deliver(self, listener: Listener) -> None:
        listener.submitting(self)


@dataclass(frozen=True, slots=True)
class StepClaimedEvent:
    """A replica claimed a document for a step.

    ``step`` identifies the step in this replica (its later events carry the same number);
    ``latency`` is how long the document had been due when it was claimed, in seconds,
    when its lease fields tell: since its relock or retry wait or its previous lease ran
    out, or since it entered its phase (submitted, advanced, retried by an operator).
    None after a plain unlock or a hand-back, whose time is not recorded. ``carrier``:
    what the listeners put into the ``SubmittingEvent``'s carrier when the document was
    submitted, as stored on it (cleaned by ``carrier``; empty when nothing was stored).
    """

    replica: str
    collection: str
    document_id: Any
    phase: str | None
    handler: str
    step: int
    latency: float | None
    carrier: Mapping[str, str] = field(default_factory=dict)

    def deliver(self, listener: Listener) -> None:
        listener.step_claimed(self)


@dataclass(frozen=True, slots=True)
class StepFinishedEvent:
    """A claimed step is over, one such event per ``StepClaimedEvent``.

    ``outcome``: what became of it, a ``StepOutcome`` (``unlocked``, ``relocked``,
    ``advanced``, ``removed``, ``done``, ``retrying``, ``failed``, ``lost``, ``timed_out``,
    ``released``, ``unrecorded`` or ``interrupted``; each documented there, with whether
    it frees work, is a failure, is recorded). ``duration``: seconds since the claim, by the
    replica's monotonic clock. ``wait``: seconds until the document is claimable again,
    when the outcome set one.
    """

    replica: str
    collection: str
    document_id: Any
    phase: str | None
    handler: str
    step: int
    outcome: StepOutcome
    duration: float
    wait: float | None = None

    def deliver(self, listener: Listener) -> None:
        listener.step_finished(self)


@dataclass(frozen=True, slots=True)
class AttemptFailedEvent:
    """A step failed an attempt: its handler raised, returned something that is not its
    outcome, its document did not validate, or it ran past step_timeout.

    ``outcome``: ``retrying`` (retried after ``wait``), ``failed`` (moved to the failed
    phase; ``final``), ``lost`` (the lease was lost meanwhile) or ``unrecorded``; or, for
    an error raised after the step's own outcome, that outcome, which stands.
    """

    replica: str
    collection: str
    document_id: Any
    phase: str | None
    handler: str
    error_type: str
    message: str
    outcome: StepOutcome
    wait: float | None
    final: bool

    def deliver(self, listener: Listener) -> None:
        listener.attempt_failed(self)


@dataclass(frozen=True, slots=True)
class LeaseLostEvent:
    """A write under a lease found it lost: another replica holds the document now, or an
    outside writer changed its phase. ``held_for``: seconds since the claim (server time)."""

    replica: str
    collection: str
    document_id: Any
    phase: str | None
    handler: str
    reason: str
    held_for: float

    def deliver(self, listener: Listener) -> None:
        listener.lease_lost(self)


@dataclass(frozen=True, slots=True)
class LeaseExtendedEvent:
    """The heartbeat extended the lease of a long step; ``held_for``: seconds since the
    claim (server time)."""

    replica: str
    collection: str
    document_id: Any
    phase: str | None
    handler: str
    held_for: float

    def deliver(self, listener: Listener) -> None:
        listener.lease_extended(self)


@dataclass(frozen=True, slots=True)
class ClockMeasuredEvent:
    """A measurement of the server's clock: ``offset`` is server minus local wall time in
    seconds (0 when the server reports no time: ``server_time`` False), ``round_trip``
    the ``hello``'s round trip in seconds."""

    replica: str
    offset: float
    round_trip: float
    server_time: bool

    def deliver(self, listener: Listener) -> None:
        listener.clock_measured(self)


@dataclass(frozen=True, slots=True)
class IdleProbeEvent:
    """An idle replica asked whether a collection has work for ``handlers``: ``found``
    True or False, None when the read failed; ``duration`` in seconds."""

    replica: str
    collection: str
    handlers: tuple[str, ...]
    found: bool | None
    duration: float

    def deliver(self, listener: Listener) -> None:
        listener.idle_probe(self)


@dataclass(frozen=True, slots=True)
class ScheduleFiredEvent:
    """A schedule's fire time was dealt with: ``result`` one of ``schedules.FireResult``
    (started, skipped, buffered, declined, coalesced, missed, failed); ``lag`` seconds
    from the fire time to the start (None unless started); ``run`` the document started;
    ``count`` fire times it stands for (a missed range); ``error`` why it failed."""

    replica: str
    schedule: str
    fire: datetime
    result: str
    lag: float | None = None
    run: str | None = None
    count: int = 1
    error: str | None = None

    def deliver(self, listener: Listener) -> None:
        listener.schedule_fired(self)


class Listener:
    """Receives a replica's events: subclass it and override the methods you need (the
    others do nothing). Called synchronously where the work happens, from worker threads
    or the event loop: keep it quick and thread-safe."""

    def submitting(self, event: SubmittingEvent) -> None:
        """A document is about to be submitted; entries put into ``event.carrier`` are
        stored on it for its steps."""

    def step_claimed(self, event: StepClaimedEvent) -> None:
        """A document was claimed for a step."""

    def step_finished(self, event: StepFinishedEvent) -> None:
        """A step is over, with its outcome and duration."""

    def attempt_failed(self, event: AttemptFailedEvent) -> None:
        """A step's attempt failed (retried, or moved to the failed phase)."""

    def lease_lost(self, event: LeaseLostEvent) -> None:
        """A lease was found lost."""

    def lease_extended(self, event: LeaseExtendedEvent) -> None:
        """The heartbeat extended a lease."""

    def clock_measured(self, event: ClockMeasuredEvent) -> None:
        """The server's clock was measured."""

    def idle_probe(self, event: IdleProbeEvent) -> None:
        """An idle replica probed a collection for work."""

    def schedule_fired(self, event: ScheduleFiredEvent) -> None:
        """A schedule's fire time started a document, or was skipped, missed, failed..."""


Event = (
    SubmittingEvent
    | StepClaimedEvent
    | StepFinishedEvent
    | AttemptFailedEvent
    | LeaseLostEvent
    | LeaseExtendedEvent
    | ClockMeasuredEvent
    | IdleProbeEvent
    | ScheduleFiredEvent
)
"""Every event a replica emits. Each one's ``deliver`` calls its ``Listener`` method, so a
misspelt or mistyped method fails the type check, not a listener at run time."""


def _methods() -> dict[type[Event], str]:
    """Each event type's ``Listener`` method, read from the methods' annotations: the typed
    table the async check and the error log take their method names from."""
    table: dict[type[Event], str] = {}
    for name, method in vars(Listener).items():
        if inspect.isfunction(method) and not name.startswith("_"):
            table[get_type_hints(method)["event"]] = name
    return table


_METHODS = _methods()
"""The ``Listener`` method each event type is delivered to."""


class Listeners:
    """One replica's listeners, and the one place that calls them.

    ``active`` is the hot path's whole cost when none is registered: the runner tests it
    before it builds an event. The tuple is replaced, never changed in place, so a worker
    iterating it while a listener is added is unaffected.
    """

    def __init__(self, replica: str, listeners: Iterable[Listener] = ()) -> None:
        self._replica = replica
        self.active: tuple[Listener, ...] = ()
        self.errors = 0
        """Calls that raised, over every listener (each listener's first is logged)."""
        self._failed: set[int] = set()
        self._lock = threading.Lock()
        for listener in listeners:
            self.add(listener)

    def add(self, listener: Listener) -> None:
        if not isinstance(listener, Listener):
            raise ConfigError(
                f"a listener subclasses orchestrator.Listener, not {type(listener).__name__}"
            )
        for method in _METHODS.values():
            hook = getattr(listener, method, None)
            if inspect.iscoroutinefunction(hook) or inspect.isasyncgenfunction(hook):
                raise ConfigError(
                    f"{type(listener).__qualname__}.{method} is async: listeners are called "
                    "on the step's path and never awaited; make it a plain def (hand slow "
                    "work to a queue or a task of your own)"
                )
        with self._lock:
            self.active = (*self.active, listener)

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to every listener; a listener that raises is logged (its first
        error only) and counted, and the others are still called."""
        for listener in self.active:
            try:
                event.deliver(listener)
            except Exception as exc:
                self._listener_failed(listener, _METHODS[type(event)], exc)

    def _listener_failed(self, listener: Listener, method: str, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
            first = id(listener) not in self._failed
            self._failed.add(id(listener))
        if first:
            name = type(listener).__qualname__
            logger.error(
                f"listener {name}.{method} raised; the step goes on (further errors of this "
                "listener are counted, not logged)",
                exc_info=exc,
                extra={
                    "replica": self._replica,
                    "listener": name,
                    "event": method,
                    "outcome": "listener-error",
                },
            )
