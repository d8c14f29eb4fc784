"""The values a lease's decisions trade in (no I/O): the outcome a step returns, the write
that stores it, a carry of the lease into the next step, and what a claim granted.
``LeaseCore`` (``orchestrator.core.lease``) makes them; the I/O leases carry them to the
store and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orchestrator.core.outcomes import LeaseWrite, StepOutcome

if TYPE_CHECKING:
    from orchestrator.core.registry import Handler

__all__ = ["SAME", "Carry", "ErrorWrite", "Grant", "Outcome", "Release", "Write"]


@dataclass(frozen=True)
class Outcome:
    """What a step did with its lease; handlers return the value their lease gave them.

    ``action``: ``unlocked``, ``relocked``, ``advanced``, ``retrying``, ``failed``,
    ``released`` or ``removed``. ``token`` names the lease that wrote it: returning another
    lease's outcome is an error.
    """

    action: StepOutcome
    phase: str | None
    wait: float | None = None
    token: str | None = field(default=None, compare=False, repr=False)


SAME: Any = object()
"""A release that leaves the phase as it was."""


@dataclass(frozen=True)
class Write:
    """One releasing write: its update, and what the lease becomes once it lands.
    ``at``: when it was planned, by the server clock's estimate (its history entry's time,
    and a lease it carries on starts then). ``lighter``: the same outcome stored with less
    (no history entry), each tried in turn when the server refuses the one before as
    taking the document past 16 MiB."""

    update: dict[str, Any]
    action: LeaseWrite
    at: datetime
    until: datetime
    phase_change: bool = False
    next_phase: Any = SAME
    lighter: tuple[dict[str, Any], ...] = ()

    @property
    def forms(self) -> tuple[dict[str, Any], ...]:
        """The updates to try in turn, the whole one first."""
        return (self.update, *self.lighter)


@dataclass
class Carry:
    """A release that took the lease on into the next step (``lease_writes.carry_update``): the
    handler that runs it, its fresh token and expiry, and (once written) the document as
    stored."""

    handler: Handler
    token: str
    claimed_at: datetime
    expires_at: datetime
    update: dict[str, Any]
    fence: dict[str, Any]
    doc: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ErrorWrite:
    """A failed attempt's write, in the forms to try in turn: the full record, the message
    cut short, a placeholder, then no record at all (the server refuses a document past
    16 MiB, yet the attempt counts: the last form grows the document by nothing the claim
    did not add)."""

    forms: tuple[Write, ...]
    outcome: Outcome


@dataclass(frozen=True)
class Release:
    """Where the step's own release left the document: the fence of an error recorded
    after it (``lease_writes.released_fence``). ``until``: the ``lockedUntil`` it wrote (a
    carried lease's expiry), ``phase``: the phase it left."""

    until: datetime
    phase: Any


@dataclass(frozen=True)
class Grant:
    """What a claim, or a carry into the next step, granted: the document as stored, the
    lease's token and expiry, when its step's clock started (``claimed_at``), when the
    lease was written (``locked_at``, ``claimed_at`` when None) and whose expired lease
    it took over (``taken_from``, None: the document was free)."""

    doc: dict[str, Any]
    token: str
    claimed_at: datetime
    expires_at: datetime
    locked_at: datetime | None = None
    taken_from: str | None = None
