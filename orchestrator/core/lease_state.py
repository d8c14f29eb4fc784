"""The life of one lease, as a table (h11's ``_state.py``).

Every state a lease can be in is a ``LeaseState``; every write that lands (or finds the
lease gone) is a ``LeaseEvent``; ``TRANSITIONS`` says where each event leads from each
state, and ``fire`` is the one function that applies it. A pair missing from the table
cannot happen: ``fire`` raises ``LeaseStateError`` rather than guess.

What a lease may still write in each state is a table too (``REFUSALS``), and the sets
below name what the states share (held, carried on, lost). The data that goes with a
state (the release's fence, the unconfirmed expiry, the carried lease) is
``orchestrator.core.lease.LeaseCore``'s; which of it counts is decided here.
"""

from __future__ import annotations

from enum import Enum

from orchestrator.core.errors import OrchestratorError

__all__ = [
    "CARRYING",
    "COUNTS_AN_ERROR",
    "HOLDING",
    "LOSING",
    "REFUSALS",
    "TRANSITIONS",
    "Ask",
    "LeaseEvent",
    "LeaseState",
    "LeaseStateError",
    "fire",
    "refusal",
]


class _Keyed(Enum):
    """A member hashes as it compares, by identity: ``Enum.__hash__`` hashes its name in
    Python, and every write of a lease looks its state up in the tables below a few
    times (``fire``, ``refusal``, ``HOLDING``...)."""

    __hash__ = object.__hash__


class LeaseState(_Keyed):
    """Where a lease is in its life."""

    HELD = "held"
    """Claimed (or extended, confirmed in time): its writes are fenced on its token."""
    UNCONFIRMED = "held, extension unconfirmed"
    """Held, but an extension's reply was lost with time left: it may have landed, so a
    migrating fence accepts either expiry's ``lockedAt``."""
    RELEASED = "released"
    """The step's own outcome landed and kept the phase (unlock, relock, release): an
    error after it is the phase's failed attempt, fenced on the document as released."""
    CARRIED = "released, carried on"
    """As ``RELEASED`` (an unlock), in the same write as the claim of the next step on
    this replica: an error after it is recorded and releases what was carried on."""
    ADVANCED = "advanced"
    """The step's own outcome moved the document to another phase: that stands, and an
    error after it is only noted."""
    ADVANCED_CARRIED = "advanced, carried on"
    """As ``ADVANCED``, with the lease carried on into the next step."""
    REMOVED = "removed"
    """The step deleted its document: an error after it has nothing to be written on."""
    RECORDED = "error recorded"
    """A failed attempt's record landed (a retry, or the failed phase): nothing more."""
    NOTED = "error noted"
    """An error after an advance was noted on the document: nothing more."""
    NOTED_CARRIED = "error noted, carried on"
    """As ``NOTED``, the lease carried on by the advance still standing."""
    LOST = "lost"
    """A write matched nothing (or was not confirmed in time): another replica may hold
    the document; nothing more may be written."""
    LOST_CARRIED = "lost, carried on"
    """As ``LOST``, after a release that carried the lease on: the engine hands that back."""


class LeaseEvent(_Keyed):
    """What happened to a lease: a write of it landed, or found it gone."""

    EXTENDED = "extended"
    """An extension landed, confirmed before the lease expired."""
    UNCONFIRMED = "extension unconfirmed"
    """An extension failed with time left: it may have landed."""
    RELEASED = "released"
    """A release that keeps the phase landed (unlock, relock, release; an advance into
    the phase it was claimed in)."""
    ADVANCED = "advanced"
    """A release into another phase landed."""
    CARRIED = "carried"
    """A release that keeps the phase landed, carrying the lease into the next step."""
    CARRIED_ADVANCED = "advanced and carried"
    """A release into another phase landed, carrying the lease into the next step."""
    REMOVED = "removed"
    """The document was deleted."""
    RECORDED = "recorded"
    """A failed attempt's record landed: a retry, or the failed phase."""
    NOTED = "noted"
    """An error's note landed on the document as the step's advance left it."""
    LOST = "lost"
    """A write matched nothing, or could not be confirmed in time."""


S = LeaseState
E = LeaseEvent

_HOLDING_ROW: dict[LeaseEvent, LeaseState] = {
    E.EXTENDED: S.HELD,
    E.UNCONFIRMED: S.UNCONFIRMED,
    E.RELEASED: S.RELEASED,
    E.CARRIED: S.CARRIED,
    E.ADVANCED: S.ADVANCED,
    E.CARRIED_ADVANCED: S.ADVANCED_CARRIED,
    E.REMOVED: S.REMOVED,
    E.RECORDED: S.RECORDED,
    E.LOST: S.LOST,
}
"""What a lease that holds its document may do, whether or not an extension is unconfirmed:
the same row for both (an extension confirmed ends the doubt)."""

TRANSITIONS: dict[LeaseState, dict[LeaseEvent, LeaseState]] = {
    S.HELD: _HOLDING_ROW,
    S.UNCONFIRMED: _HOLDING_ROW,
    # After the step's own outcome: only an error's record, which the outcome decides.
    S.RELEASED: {E.RECORDED: S.RECORDED, E.LOST: S.LOST},
    S.CARRIED: {E.RECORDED: S.RECORDED, E.LOST: S.LOST_CARRIED},
    S.ADVANCED: {E.NOTED: S.NOTED, E.LOST: S.LOST},
    S.ADVANCED_CARRIED: {E.NOTED: S.NOTED_CARRIED, E.LOST: S.LOST_CARRIED},
    # The ends: nothing more is written.
    S.REMOVED: {},
    S.RECORDED: {},
    S.NOTED: {},
    S.NOTED_CARRIED: {},
    S.LOST: {},
    S.LOST_CARRIED: {},
}


class Ask(_Keyed):
    """What a write asks of the lease's state, before it is sent."""

    WRITE = "write"
    """The step's outcome, a removal, or an extension."""
    RECORD = "record"
    """The step's failed attempt, as its outcome (``fail``)."""
    RECORD_AFTER = "record after"
    """An error's record, also after the step's own outcome (the handler raised after it)."""


_GAVE = "this step already gave an outcome; a step returns exactly one"
_RECORDED = "this step's failed attempt is already recorded"
_ANOTHER = "another replica holds it now"

_AFTER_OUTCOME = {Ask.WRITE: _GAVE, Ask.RECORD: _GAVE}
_AFTER_RECORD = {Ask.WRITE: _GAVE, Ask.RECORD: _RECORDED, Ask.RECORD_AFTER: _RECORDED}
_AFTER_LOSS = {Ask.WRITE: _ANOTHER, Ask.RECORD: _ANOTHER, Ask.RECORD_AFTER: _ANOTHER}

REFUSALS: dict[LeaseState, dict[Ask, str]] = {
    S.HELD: {},
    S.UNCONFIRMED: {},
    S.RELEASED: _AFTER_OUTCOME,
    S.CARRIED: _AFTER_OUTCOME,
    S.ADVANCED: _AFTER_OUTCOME,
    S.ADVANCED_CARRIED: _AFTER_OUTCOME,
    S.REMOVED: _AFTER_OUTCOME,
    S.RECORDED: _AFTER_RECORD,
    S.NOTED: _AFTER_RECORD,
    S.NOTED_CARRIED: _AFTER_RECORD,
    S.LOST: _AFTER_LOSS,
    S.LOST_CARRIED: _AFTER_LOSS,
}
"""Why a lease in each state refuses each ask (``LeaseLost``'s reason); absent: allowed.
A failed attempt is recorded once: a time-out's record and the handler's own error,
racing, land once."""

HOLDING = frozenset({S.HELD, S.UNCONFIRMED})
"""The lease is held: its writes are fenced on its token."""

CARRYING = frozenset({S.CARRIED, S.ADVANCED_CARRIED, S.NOTED_CARRIED, S.LOST_CARRIED})
"""The step's release carried the lease on into the next step, and that stands."""

LOSING = frozenset({S.LOST, S.LOST_CARRIED})
"""The lease is lost."""

COUNTS_AN_ERROR = frozenset({S.HELD, S.UNCONFIRMED, S.RELEASED, S.CARRIED})
"""An error in these states counts as the phase's failed attempt (a retry, or the failed
phase); after an advance or a removal it is only noted, on the document as it was left."""


class LeaseStateError(OrchestratorError):
    """A lease event its state has no transition for: a fault of the lease's code, never
    of a handler (a handler's second outcome is refused before it is written)."""


def fire(state: LeaseState, event: LeaseEvent) -> LeaseState:
    """The state ``event`` leads to from ``state`` (``TRANSITIONS``)."""
    try:
        return TRANSITIONS[state][event]
    except KeyError:
        raise LeaseStateError(f"a lease {state.value} cannot be {event.value}") from None


def refusal(state: LeaseState, ask: Ask) -> str | None:
    """Why a lease in ``state`` refuses ``ask`` (``REFUSALS``), or None: it may write."""
    return REFUSALS[state].get(ask)
