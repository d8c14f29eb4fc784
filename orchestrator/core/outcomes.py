"""The two vocabularies of a step: what became of it (``StepOutcome``), and which write a
lease sent (``LeaseWrite``). One enum each, with what each value means, so the scheduler,
the runners, events, metrics and tracing classify an outcome by the same table.

Both are ``StrEnum``: a value is its own name in logs, metrics labels, JSON and stats keys
(``StepOutcome.UNLOCKED == "unlocked"``), as it was when they were plain strings.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["LeaseWrite", "StepOutcome"]


class StepOutcome(StrEnum):
    """What became of a claimed step (``StepFinishedEvent.outcome``, ``stats()`` keys)."""

    UNLOCKED = "unlocked"
    """Released for its next step at once (the handler returned ``unlock()`` or None)."""
    RELOCKED = "relocked"
    """Released to be claimed again after a wait (waiting on something outside)."""
    ADVANCED = "advanced"
    """Moved to another phase."""
    REMOVED = "removed"
    """Its document was deleted."""
    DONE = "done"
    """The handler wrote its outcome itself and returned nothing more to write."""
    RETRYING = "retrying"
    """It failed an attempt (raised, returned garbage, did not validate, timed out); it is
    retried after a wait."""
    FAILED = "failed"
    """It failed its last attempt (or ``fail()``): moved to the failed phase."""
    LOST = "lost"
    """A write found the lease lost: another replica holds it, or an outside writer
    changed its phase."""
    TIMED_OUT = "timed_out"
    """It ran past ``step_timeout``: its attempt was recorded, its slot freed."""
    RELEASED = "released"
    """Handed back unstarted (the replica was stopping, or its lease expired first)."""
    UNRECORDED = "unrecorded"
    """Writing its outcome failed: the lease is left to expire."""
    INTERRUPTED = "interrupted"
    """Torn down under it (SystemExit, the event loop ending): the lease is left to expire."""

    @property
    def frees_work(self) -> bool:
        """Something may be claimable at once after it, by this handler or another (a lost
        lease too: a step whose phase was changed from outside releases its document)."""
        return self in _FREES_WORK

    @property
    def is_failure(self) -> bool:
        """The step did not do its work: an error status on its span, a failure in metrics."""
        return self in _FAILURES

    @property
    def is_recorded(self) -> bool:
        """The document says what became of the step (a write of this step landed); the
        others leave the document as it was, its lease to expire or already taken."""
        return self not in _UNRECORDED


_FREES_WORK = frozenset(
    {
        StepOutcome.UNLOCKED,
        StepOutcome.ADVANCED,
        StepOutcome.FAILED,
        StepOutcome.RELEASED,
        StepOutcome.TIMED_OUT,
        StepOutcome.DONE,
        StepOutcome.LOST,
    }
)
_FAILURES = frozenset(
    {
        StepOutcome.RETRYING,
        StepOutcome.FAILED,
        StepOutcome.LOST,
        StepOutcome.TIMED_OUT,
        StepOutcome.UNRECORDED,
        StepOutcome.INTERRUPTED,
    }
)
_UNRECORDED = frozenset({StepOutcome.LOST, StepOutcome.UNRECORDED, StepOutcome.INTERRUPTED})


class LeaseWrite(StrEnum):
    """A write under a lease (``LeaseLost.action``): what the step asked its lease to do."""

    UNLOCK = "unlock"
    RELOCK = "relock"
    ADVANCE = "advance"
    RELEASE = "release"
    REMOVE = "remove"
    FAIL = "fail"
    EXTEND = "extend"
    RECORD = "record"
    """A failed attempt's record (before it is known to be a retry or the last attempt)."""
    RETRY = "retry"
    NOTE = "note"
    """An error after the step's own outcome, noted in ``lastError`` only."""
    WRITE = "write"
    """A write a ``ThreadLease`` could not deliver (its event loop is gone)."""
