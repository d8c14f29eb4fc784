"""What a replica says about its steps: log lines with structured ``extra`` fields, and
events for its listeners. Engine-neutral; with no listener registered no event is built."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from orchestrator.core.clock import Clock, ServerClock
from orchestrator.core.errors import StoreError
from orchestrator.core.events import (
    AttemptFailedEvent,
    ClockMeasuredEvent,
    IdleProbeEvent,
    LeaseExtendedEvent,
    LeaseLostEvent,
    Listeners,
    ScheduleFiredEvent,
    StepClaimedEvent,
    StepFinishedEvent,
    SubmittingEvent,
    carrier,
)
from orchestrator.core.lease_api import StepLease
from orchestrator.core.outages import Back, DatabaseWatch, Unreachable
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.redact import RedactingFilter
from orchestrator.core.registry import Handler
from orchestrator.core.resource import TRACE_FIELD
from orchestrator.runners.step import Step

__all__ = ["Reporter", "logger"]

logger = logging.getLogger("orchestrator")
logger.addFilter(RedactingFilter())


class Reporter:
    """Logs and events of one replica (``replica``), timed by its ``local`` clock and its
    estimate of the server's (``clock``)."""

    def __init__(
        self, replica: str, listeners: Listeners, local: Clock, clock: ServerClock
    ) -> None:
        self.replica = replica
        self.events = listeners
        self.base: dict[str, object] = {"replica": replica}
        """The ``extra`` fields of every line this replica logs."""
        self._local = local
        self._clock = clock
        self.database = DatabaseWatch(local, self._database_changed)
        """Whether the database answers this replica's store (its ``watch``)."""

    # -- logs ---------------------------------------------------------------------------

    def log(
        self,
        level: int,
        message: str,
        lease: StepLease,
        outcome: str,
        *,
        wait: float | None = None,
        exc_info: BaseException | bool | None = None,
    ) -> None:
        """A line about ``lease``'s step."""
        if not logger.isEnabledFor(level):
            return
        extra: dict[str, object] = {
            **self.base,
            "collection": lease.collection,
            "doc_id": str(lease.id),
            "phase": lease.phase,
            "outcome": str(outcome),  # a plain name, whichever vocabulary gave it
            "handler": lease.handler.name,
        }
        if wait is not None:
            extra["wait"] = round(wait, 3)
        logger.log(level, message, extra=extra, exc_info=exc_info)

    def line(self, level: int, message: str, outcome: str, **fields: object) -> None:
        """A line about the replica itself (started, stopped, its record, its clock)."""
        logger.log(level, message, extra={**self.base, "outcome": outcome, **fields})

    def trouble(self, level: int, exc: BaseException) -> int:
        """The level of a line saying an operation failed with ``exc``: DEBUG while the
        database is known unreachable and ``exc`` says so again (the outage's own line
        said it once), else ``level``."""
        if isinstance(exc, StoreError) and exc.transient and self.database.down:
            return logging.DEBUG
        return level

    def _database_changed(self, change: Unreachable | Back) -> None:
        """One line when the database stops answering this replica, one when it is back:
        the failures in between are logged at DEBUG (``trouble``)."""
        since = change.since.isoformat()
        if isinstance(change, Unreachable):
            self.line(
                logging.WARNING,
                f"database unreachable: {change.error}; claims, heartbeats and records fail"
                " until it answers again (said once, and once when it is back)",
                "database-unreachable",
                failed=change.action,
                error=str(change.error),
                since=since,
            )
            return
        self.line(
            logging.WARNING,
            f"database reachable again after {change.down_for:.1f}s unreachable (since {since})",
            "database-back",
            since=since,
            down_for=round(change.down_for, 3),
        )

    def lost(self, message: str, lease: StepLease) -> None:
        """A write found ``lease`` lost: logged, and reported to the listeners."""
        self.log(logging.WARNING, message, lease, StepOutcome.LOST)
        if self.events.active:
            self.events.emit(LeaseLostEvent(*self._about(lease), message, self._held_for(lease)))

    def taken_over(self, lease: StepLease) -> None:
        """A claim took over a lease its holder never released (``lease.taken_from``)."""
        self.log(
            logging.WARNING,
            f"took over the expired lease of replica {lease.taken_from!r} (it died, stalled "
            "or lost the database); its step runs again here",
            lease,
            "taken-over",
        )

    # -- events -------------------------------------------------------------------------

    def submitting(self, collection: str, fields: Mapping[str, Any]) -> dict[str, str]:
        """What the listeners want stored on a document about to be submitted (its
        ``fields``): their carrier, cleaned; empty (nothing stored) with none listening."""
        if not self.events.active:
            return {}
        event = SubmittingEvent(self.replica, collection, fields.get("_id"), fields["phase"])
        self.events.emit(event)
        return carrier(event.carrier)

    def claimed(self, step: Step[Any]) -> None:
        """A step begins: claimed, or carried on from the step before. Its document is
        as the claim (or the carry) stored it, with the carrier its submit stored."""
        if self.events.active:
            stored = carrier(step.lease.doc.get(TRACE_FIELD))
            self.events.emit(
                StepClaimedEvent(*self._about(step.lease), step.number, step.latency, stored),
            )

    def finished(self, step: Step[Any], outcome: StepOutcome) -> None:
        """The one ``StepFinishedEvent`` of a claimed step: from its worker, or from the
        time-out that took it back."""
        if self.events.active:
            self.events.emit(
                StepFinishedEvent(
                    *self._about(step.lease),
                    step.number,
                    outcome,
                    self._local.monotonic() - step.started,
                    step.wait,
                ),
            )

    def attempt_failed(
        self, step: Step[Any], kind: str, message: str, outcome: StepOutcome
    ) -> None:
        if self.events.active:
            self.events.emit(
                AttemptFailedEvent(
                    *self._about(step.lease),
                    kind,
                    message,
                    outcome,
                    step.wait,
                    outcome is StepOutcome.FAILED,
                ),
            )

    def extended(self, lease: StepLease) -> None:
        if self.events.active:
            self.events.emit(LeaseExtendedEvent(*self._about(lease), self._held_for(lease)))

    def probed(
        self, collection: str, handlers: tuple[Handler, ...], found: bool | None, took: float
    ) -> None:
        if self.events.active:
            names = tuple(h.name for h in handlers)
            self.events.emit(IdleProbeEvent(self.replica, collection, names, found, took))

    def schedule_fired(self, event: ScheduleFiredEvent) -> None:
        """A fire time dealt with: logged (a failure as a warning), and told listeners."""
        level = logging.WARNING if event.error else logging.INFO
        message = f"schedule {event.schedule}: fire {event.fire} {event.result}"
        if event.error:
            message += f": {event.error}"
        logger.log(
            level,
            message,
            extra={
                **self.base,
                "schedule": event.schedule,
                "fire": str(event.fire),
                "outcome": f"schedule-{event.result}",
                "lag": event.lag,
                "doc_id": event.run,
                "count": event.count,
            },
        )
        if self.events.active:
            self.events.emit(event)

    def clock_measured(self, clock: ServerClock, round_trip: float) -> None:
        if self.events.active:
            offset = clock.offset.total_seconds()
            event = ClockMeasuredEvent(self.replica, offset, round_trip, clock.server_time)
            self.events.emit(event)

    def _about(self, lease: StepLease) -> tuple[str, str, Any, str | None, str]:
        """What every step event says first: this replica, and the step's document,
        phase and handler."""
        return (self.replica, lease.collection, lease.id, lease.phase, lease.handler.name)

    def _held_for(self, lease: StepLease) -> float:
        """Seconds since ``lease`` was claimed, by the server clock's estimate."""
        return float((self._clock.now() - lease.claimed_at).total_seconds())
