"""What a step's life decides, without doing any of it.

The engines carry a step out (claim, run the handler, write, log, report); what they
decide along the way is here, pure and tested without I/O: whether a claimed lease runs or
is handed back, whether what a handler returned is its outcome, how an error is named and
how its record reads, and what ``stop`` reports.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.lease_values import Outcome
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler

__all__ = [
    "StepTimeout",
    "StopReport",
    "carry_target",
    "claim_latency",
    "could_take",
    "describe",
    "hand_back_reason",
    "noted_message",
    "settled_level",
    "started",
    "stop_summary",
    "taken_from",
    "wrong_result",
]


class StepTimeout(OrchestratorError):
    """A step ran past ``step_timeout``: its lease was taken back and the attempt counted."""


@dataclass(frozen=True)
class StopReport:
    """What ``stop`` left behind: leases handed back unstarted, steps still running."""

    released: list[str] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)


def carry_target(handlers: Sequence[Handler], collection: str, phase: str) -> Handler | None:
    """The handler that would claim a document of ``collection`` left free in ``phase``,
    when that can be told without the server: one whose filter is exactly
    ``{"phase": phase}`` (``phase(C, X)``, or ``when(C, {"phase": X})``, the same
    registration), which the carry's write satisfies, with no failed-phase exclusion to
    judge. A filter with more to it is the server's to evaluate: the document is released."""
    for handler in handlers:
        if (
            handler.collection == collection
            and handler.exclusion is None
            and handler.match == {"phase": phase}
        ):
            return handler
    return None


def takers(handlers: Sequence[Handler], collection: str, phase: object) -> list[Handler]:
    """Those of ``handlers`` that might claim a document of ``collection`` free in
    ``phase`` (any of the collection's, when the phase is not a string): a document
    released or submitted into a phase none of them selects (the end of a workflow, a
    phase another service handles) wakes no idle worker of this replica to claim in vain,
    and one submitted in its first phase wakes that phase's handler, not every handler."""
    return [
        handler
        for handler in handlers
        if handler.collection == collection
        and not (
            isinstance(phase, str)
            and isinstance(pinned := handler.match.get("phase"), str)
            and pinned != phase
        )
    ]


def could_take(handlers: Sequence[Handler], collection: str, phase: str) -> bool:
    """Whether one of ``handlers`` might claim a document of ``collection`` left free in
    ``phase`` (``takers``)."""
    return bool(takers(handlers, collection, phase))


def started(stats: Mapping[str, int]) -> int:
    """Steps a replica started (from its ``stats()``): those it claimed, those a release
    carried its lease on into, and those whose document its submit created leased."""
    return stats.get("claimed", 0) + stats.get("carried", 0) + stats.get("lent", 0)


def hand_back_reason(*, stopping: bool, expired: bool) -> str | None:
    """Why a claimed lease is handed back rather than run, or None: it runs.

    A replica that is stopping starts nothing more; a lease that expired while its claim
    waited may be another replica's now (the hand-back is fenced: a no-op if it was taken).
    """
    if stopping:
        return "the replica is stopping"
    if expired:
        return "its lease expired before it started"
    return None


def wrong_result(result: object, token: str, handler: str) -> str | None:
    """Why what a handler returned is not its step's outcome, or None when it is (its own
    lease's ``Outcome``, or None: the step is unlocked)."""
    if result is None or (isinstance(result, Outcome) and result.token == token):
        return None
    what = "another lease's outcome" if isinstance(result, Outcome) else type(result).__name__
    return (
        f"{handler} returned {what}; a handler returns its own lease's "
        "unlock(), relock(), advance(...), fail(...), remove() or None"
    )


def describe(exc: BaseException) -> str:
    """The message of ``exc``, even when its ``__str__`` itself raises."""
    try:
        return str(exc) or repr(exc)
    except Exception:
        return f"<{type(exc).__name__} with an unprintable message>"


def noted_message(message: str, recorded: StepOutcome) -> str:
    """An error's message as logged once its record landed as ``recorded``: an error after
    the step's own outcome says that outcome stands."""
    if recorded in {StepOutcome.RETRYING, StepOutcome.FAILED}:
        return message
    return f"{message} (after its own outcome, {recorded}, which stands)"


def settled_level(recorded: StepOutcome) -> int:
    """The log level of a recorded error: the last attempt is an error, the rest warnings."""
    return logging.ERROR if recorded is StepOutcome.FAILED else logging.WARNING


def claim_latency(now: datetime, due_since: datetime | None) -> float | None:
    """Seconds the claimed document had been due, when its fields tell. A ``lockedUntil``
    ahead of ``now`` is a bogus lease the claim took as free: no latency."""
    if due_since is None or due_since > now:
        return None
    return (now - due_since).total_seconds()


def stop_summary(released: Sequence[str], still_running: Sequence[str]) -> tuple[int, str]:
    """The log level and line of a stop: a warning when steps are left to expire."""
    left = f": {', '.join(still_running)} left to expire" if still_running else ""
    message = (
        f"orchestrator stopped: {len(released)} unstarted lease(s) handed back, "
        f"{len(still_running)} step(s) still running{left}"
    )
    return (logging.WARNING if still_running else logging.INFO), message


def taken_from(before: Mapping[str, Any]) -> str | None:
    """The replica whose lease a claim took over, from the document as it was before the
    claim: a lease token never released means its holder's lease ran out under it (the
    replica died, stalled or lost the database); None when the document was free."""
    if before.get("lockToken") is None:
        return None
    holder = before.get("lockedBy")
    return holder if isinstance(holder, str) and holder else "an unnamed replica"
