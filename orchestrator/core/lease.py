"""What a lease decides, written once for the async lease and the sync one generated from it.

``AsyncLease`` (``orchestrator/mongo/_async/lease.py``) and ``Lease`` (generated from it)
hold a ``LeaseCore`` and carry its writes to the store. Everything else is here and does
no I/O: the update each outcome writes, which fence each write carries in each state, and
the checked policy waits; the values they trade in (the outcome a step returns, the write,
the carry, the grant) are ``orchestrator.core.lease_values``'. The states themselves, and
the events that move a lease between them, are a table in ``orchestrator.core.lease_state``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from orchestrator.core import history
from orchestrator.core.clock import as_utc
from orchestrator.core.errors import ConfigError, LeaseLost, OrchestratorError
from orchestrator.core.lease_state import (
    CARRYING,
    COUNTS_AN_ERROR,
    HOLDING,
    LOSING,
    Ask,
    LeaseEvent,
    LeaseState,
    fire,
    refusal,
)
from orchestrator.core.lease_values import (
    SAME,
    Carry,
    ErrorWrite,
    Grant,
    Outcome,
    Release,
    Write,
)
from orchestrator.core.outcomes import LeaseWrite, StepOutcome
from orchestrator.core.queries import claims, lease_writes, submissions
from orchestrator.core.resource import EPOCH
from orchestrator.core.retention import NO_RETENTION, Retention
from orchestrator.core.trees import (
    OWNS_FIELD,
    PROGRESS_FIELD,
    WAIT_FIELD,
    Need,
    Wait,
    WaitKind,
    new_wait,
    progress_record,
)

if TYPE_CHECKING:
    from orchestrator.core.clock import ServerClock
    from orchestrator.core.limits import Slot
    from orchestrator.core.registry import Handler
    from orchestrator.core.settings import Settings

R = TypeVar("R")


class PolicyError(OrchestratorError):
    """A relock or retry policy raised or returned something that is not a wait."""


_RECORDS = frozenset({LeaseWrite.RETRY, LeaseWrite.FAIL, LeaseWrite.NOTE})
"""The writes that record a step's error: once one landed, a second record is refused."""

_CARRIES = frozenset({LeaseWrite.UNLOCK, LeaseWrite.ADVANCE})
"""The outcomes that free the document for a next step, which may carry the lease on."""


Carrier = Callable[["LeaseCore[Any]", str], "Handler | None"]
"""Asked by a lease whose step frees its document in ``phase``: the handler of this replica
that takes the next step at once (its slot and budget reserved), or None: release it."""


class LeaseCore(Generic[R]):
    """A lease's data, its state (``orchestrator.core.lease_state``) and what it decides:
    each outcome's write, the fence it carries, what is refused. ``doc`` is the claimed
    document as stored; ``resource`` is it validated by the handler's model (the same
    dict for handlers registered on a collection name).

    The I/O lease holds one and calls it by name: ``*_write`` plans a write, ``check``
    refuses it before it is sent, ``fence`` says its filter, and once the store answered,
    ``landed``, ``carried_on``, ``removed``, ``extended``, ``extension_unconfirmed`` or
    ``lose`` fires its event (``lease_state.fire``)."""

    def __init__(
        self,
        *,
        clock: ServerClock,
        settings: Settings,
        handler: Handler,
        grant: Grant,
        retention: Retention = NO_RETENTION,
    ) -> None:
        self._clock = clock
        self.settings = settings
        self.handler = handler
        self.retention = retention
        """Its collection's retention: the writes entering a retained phase carry the
        date the server deletes the document by (``lease_writes.expiring``)."""
        self.doc = grant.doc
        self.resource: R = grant.doc  # type: ignore[assignment]  # replaced once validated
        self.token = grant.token
        self.claimed_at = grant.claimed_at
        """When its step's clock started (``step_timeout``, the history's duration)."""
        self.locked_at = grant.claimed_at if grant.locked_at is None else grant.locked_at
        """When the lease was last written: a carried lease's is its carry's, earlier than
        its step's start when the step before worked on after its outcome."""
        self.expires_at = grant.expires_at
        self.throttled = False  # this document used its per-tick budget of claims (Books)
        self.taken_from = grant.taken_from
        """The replica whose expired lease this claim took over (its holder died or
        stalled), or None: the document was free."""
        self.state = LeaseState.HELD
        self.outcome: Outcome | None = None
        """The step's own outcome, once one landed (a handler's release, or its error
        record): the first one stands, whatever the step does after it."""
        self.carrier: Carrier | None = None
        """Set by the engine: whom to ask whether the lease goes on into a next step."""
        self.slots: list[Slot] = []
        """The slots of its handler's limits taken for this step (``orchestrator.core.
        limits``), set by the engine at the claim: a global limit's slot is renewed with
        the lease and freed when the step ends or the lease is lost."""
        self._release: Release | None = None  # once released by a write (not a removal)
        self._unconfirmed_until: datetime | None = None  # in UNCONFIRMED: it may have landed
        self._carry: Carry | None = None  # once a release carried the lease on
        self.progress: dict[str, Any] | None = None
        """The step's latest ``progress`` not yet written: its outcome's write carries it."""
        self._progress_at: datetime | None = None  # when a progress was last written
        self.cancel_requested = False
        """Set by the heartbeat: an operator moved the document (a cancel, a retry) or
        deleted it while the step ran."""
        self.waiting: Wait | None = None
        """The wait its step's relock stored (``wait_write``): judged again once written."""
        self.made: list[str] = []
        """The collections its step made children in (``trees``)."""

    @property
    def id(self) -> Any:
        return self.doc.get("_id")

    @property
    def collection(self) -> str:
        return self.handler.collection

    @property
    def phase(self) -> str | None:
        phase = self.doc.get("phase")
        return phase if isinstance(phase, str) else None

    @property
    def held(self) -> bool:
        """True until this lease is released or found lost."""
        return self.state in HOLDING

    @property
    def lost(self) -> bool:
        """True once a write found the document held by another lease (or its phase
        changed from outside): nothing more may be written for this step."""
        return self.state in LOSING

    @property
    def carried(self) -> Carry | None:
        """The next step this step's release carried the lease into, until an error
        recorded after it released the document after all."""
        return self._carry if self.state in CARRYING else None

    def expired(self, now: datetime) -> bool:
        """True once this lease's expiry has passed: another replica may hold it now.

        No margin for clock uncertainty: other replicas judge leases that much late, which
        covers their skew against this replica."""
        return now >= self.expires_at

    def seconds_left(self) -> float:
        """Seconds until this lease expires, by the server clock's estimate."""
        return (self.expires_at - self._clock.now()).total_seconds()

    @property
    def holds_slots(self) -> bool:
        """Whether this step still holds a slot of its handler's global limit (most
        handlers have no limit: no slot to look through)."""
        return bool(self.slots) and bool(self.held_slots())

    def held_slots(self) -> list[Slot]:
        """The slots this step still holds that follow its lease (a global limit's): renewed
        with it, freed with it. A rate limit's slot counts a start: it stays taken for its
        period, whatever becomes of the step."""
        return [slot for slot in self.slots if slot.limit.follows_lease and not slot.freed]

    # -- the writes each outcome makes ---------------------------------------------------

    def unlock_write(self, fields: dict[str, Any]) -> tuple[Write, Outcome]:
        data = self._fields(fields)
        now = self._clock.now()
        until, wait = self._free_until(now)
        update = lease_writes.unlock_update(data, until)
        write = self._releasing(update, LeaseWrite.UNLOCK, now, until, StepOutcome.UNLOCKED)
        return write, Outcome(StepOutcome.UNLOCKED, self.phase, wait, self.token)

    def relock_write(self, wait: float | None, fields: dict[str, Any]) -> tuple[Write, Outcome]:
        now = self._clock.now()
        data = self._fields(fields)
        if wait is None:
            count = _int(self.doc.get("relocks")) + 1
            wait = self._policy_wait("relock_policy", self.handler.relock_policy, now, count)
        elif not _is_wait(wait):
            raise ConfigError(
                f"relock(wait=...) needs a finite number of seconds >= 0, not {wait!r}"
            )
        wait = self._bounded(float(wait))
        until = now + timedelta(seconds=wait)
        update = lease_writes.relock_update(until, data)
        write = self._releasing(update, LeaseWrite.RELOCK, now, until, StepOutcome.RELOCKED)
        return write, Outcome(StepOutcome.RELOCKED, self.phase, wait, self.token)

    def advance_write(
        self, phase: str, fields: dict[str, Any], managed: Mapping[str, Any] | None = None
    ) -> tuple[Write, Outcome]:
        """``managed``: fields of the orchestrator's set with it (a wait that ended)."""
        self._check_phase("advance()", phase)
        data = {**self._fields(fields), **(managed or {})}
        now = self._clock.now()
        until, wait = self._free_until(now)
        update = lease_writes.expiring(
            lease_writes.advance_update(phase, now, data, until), phase, now, self.retention
        )
        write = self._releasing(
            update,
            LeaseWrite.ADVANCE,
            now,
            until,
            StepOutcome.ADVANCED,
            next_phase=phase,
        )
        return write, Outcome(StepOutcome.ADVANCED, phase, wait, self.token)

    def plan_wait(  # noqa: PLR0913  the keywords of the lease's two waits
        self,
        kind: WaitKind,
        *,
        then: str,
        name: str | None = None,
        need: Any = Need.ALL,
        on_failure: str | None = None,
        cancel_siblings: bool = False,
        timeout: Any = None,
        on_timeout: str | None = None,
    ) -> Wait:
        """The wait a handler asked for, checked now (a bad phase is the handler's error,
        not one met later when the wait ends)."""
        for what, phase in (("then", then), ("on_failure", on_failure), ("on_timeout", on_timeout)):
            if phase is not None or what == "then":
                self._check_phase(what, phase)
        return new_wait(
            kind,
            self._clock.now(),
            then=then,
            name=name,
            need=need,
            on_failure=on_failure,
            cancel_siblings=cancel_siblings,
            timeout=timeout,
            on_timeout=on_timeout,
        )

    def _check_phase(self, what: str, phase: Any) -> None:
        """A phase this lease's step may send its document to (``to=`` when declared)."""
        if not isinstance(phase, str) or not phase or phase.startswith("$"):
            raise ConfigError(f"{what} needs a phase name, not {phase!r}")
        if self.handler.to and phase not in self.handler.to:
            raise ConfigError(
                f"{self.handler.name} may advance to {list(self.handler.to)}, not {phase!r}"
            )

    def progress_write(self, fraction: Any, note: Any) -> dict[str, Any] | None:
        """Record a step's progress, checked; the update that writes it now (fenced as an
        extension is), or None: one was written less than ``progress_interval`` ago, and
        this one waits for the next call past it, or the step's outcome."""
        now = self._clock.now()
        self.progress = progress_record(fraction, note, self.phase, now)
        last = self._progress_at
        if last is not None and (now - last).total_seconds() < self.settings.progress_interval:
            return None
        return {"$set": {PROGRESS_FIELD: self.progress}}

    def progress_written(self) -> None:
        self._progress_at = self._clock.now()
        self.progress = None

    def wait_write(self, wait: Wait, owns: Sequence[str]) -> tuple[Write, Outcome]:
        """Relock with ``wait`` stored: claimable when what it waits for wakes it, at its
        deadline, or after a lock timeout at the latest (when its wait is judged again: a
        wake lost with a replica that died is made up for then). ``owns``: the
        collections its children are in."""
        now = self._clock.now()
        seconds = self.settings.lock_timeout
        if wait.deadline is not None:
            seconds = min(seconds, max((wait.deadline - now).total_seconds(), 0.0))
        seconds = self._bounded(seconds)
        until = now + timedelta(seconds=seconds)
        managed = {WAIT_FIELD: wait.stored(), OWNS_FIELD: list(owns)}
        update = lease_writes.relock_update(until, managed)
        write = self._releasing(update, LeaseWrite.RELOCK, now, until, StepOutcome.RELOCKED)
        self.waiting = wait
        return write, Outcome(StepOutcome.RELOCKED, self.phase, seconds, self.token)

    def release_write(self) -> tuple[Write, Outcome]:
        now = self._clock.now()
        until, wait = self._free_until(now)
        update = lease_writes.release_update(until)
        write = self._releasing(update, LeaseWrite.RELEASE, now, until, StepOutcome.RELEASED)
        return write, Outcome(StepOutcome.RELEASED, self.phase, wait, self.token)

    def remove_outcome(self) -> Outcome:
        """A removal writes no update: its fence (``fence(True)``) is all it sends."""
        return Outcome(StepOutcome.REMOVED, self.phase, None, self.token)

    def extend_write(self) -> tuple[datetime, datetime, dict[str, Any]]:
        now = self._clock.now()
        until = now + timedelta(seconds=self.settings.lock_timeout)
        return now, until, lease_writes.extend_update(now, until)

    def error_write(
        self, kind: str, message: str, permanent: bool, trace: str | None = None
    ) -> ErrorWrite:
        """Count a failed attempt: retry after the handler's backoff, or, past its
        ``max_attempts`` (or when ``permanent``), move to its failed phase.

        After the step's own outcome, the error is recorded on the document as that
        outcome left it. An outcome that kept the phase (unlock, relock) is part of the
        phase's streak of failed attempts; one that moved the document on (advance,
        remove) stands, and the error is only noted (``_note_write``)."""
        if self.state not in COUNTS_AN_ERROR:
            return self._note_write(kind, message)
        now = self._clock.now()
        attempts = _int(self.doc.get("attempts")) + 1
        note = ""
        wait = 0.0
        final = permanent or attempts >= self.handler.max_attempts
        if not final:
            try:
                wait = self._bounded(
                    self._policy_wait("retry_policy", self.handler.retry_policy, now, attempts)
                )
            except PolicyError as exc:  # a broken policy must not leave the attempt uncounted
                wait = self._bounded(self.settings.lock_timeout)
                note = f" [{exc}; waiting {wait:g}s instead]"
        error = lease_writes.error_record(kind, message + note, now, self.phase, trace)
        build: Callable[[dict[str, Any]], dict[str, Any]]
        if final:
            failed = self.handler.failed_phase
            until, _ = self._free_until(now)
            name = self.handler.key
            kept = self.retention

            def build(record: dict[str, Any]) -> dict[str, Any]:
                update = lease_writes.fail_update(failed, attempts, record, now, name, until=until)
                return lease_writes.expiring(update, failed, now, kept)

            action, next_phase = LeaseWrite.FAIL, failed
            outcome = Outcome(StepOutcome.FAILED, failed, None, self.token)
        else:
            until = now + timedelta(seconds=wait)

            def build(record: dict[str, Any]) -> dict[str, Any]:
                return lease_writes.retry_update(attempts, record, until)

            action, next_phase = LeaseWrite.RETRY, SAME
            outcome = Outcome(StepOutcome.RETRYING, self.phase, wait, self.token)
        forms = tuple(
            self._releasing(
                u,
                action,
                now,
                until,
                outcome.action,
                next_phase=next_phase,
                error=record,
            )
            for u, record in _record_forms(error, build)
        )
        unrecorded = lease_writes.unrecorded(build(error))
        last = self._releasing(
            unrecorded,
            action,
            now,
            until,
            outcome.action,
            next_phase=next_phase,
        )
        return ErrorWrite((*forms, last), outcome)

    def _note_write(self, kind: str, message: str) -> ErrorWrite:
        """An error raised after an outcome that moved the document on: kept as
        ``lastError`` on the document as that outcome left it (in its new phase, whose
        attempts are its own), which stands. A removed document has nothing to write: no
        forms."""
        assert self.outcome is not None
        if self._release is None:
            return ErrorWrite((), self.outcome)
        until = self._release.until
        now = self._clock.now()
        error = lease_writes.error_record(kind, message, now, self.phase)
        updates = _record_forms(error, lease_writes.note_update)
        forms = tuple(Write(u, LeaseWrite.NOTE, now, until) for u, _ in updates)
        return ErrorWrite(forms, self.outcome)

    def _releasing(
        self,
        update: dict[str, Any],
        action: LeaseWrite,
        now: datetime,
        until: datetime,
        outcome: StepOutcome,
        *,
        next_phase: Any = SAME,
        error: dict[str, Any] | None = None,
    ) -> Write:
        """A write that releases this lease, planned at ``now``; one that names its
        ``next_phase`` changes the phase, fenced on the claimed one. It leaves the lease's
        token as ``lastToken``: the fence of an error recorded after it
        (``released_fence``), which no other step's release can match; and it carries the
        step's history entry (``error``: the record it stores, whose absence on a failed
        attempt means the document is at its size limit, where nothing more is added),
        with the same write without it as its lighter form: a document at 16 MiB still
        takes the outcome."""
        update = lease_writes.stamp_release(update, self.token)
        if self.progress is not None:  # the latest progress not yet written goes with it
            update = {**update, "$set": {**update.get("$set", {}), PROGRESS_FIELD: self.progress}}
        keep = self.settings.history
        failing = action in _RECORDS
        lighter: tuple[dict[str, Any], ...] = ()
        if keep and (error is not None or not failing):
            entry = history.step_entry(
                replica=self.settings.replica_id,
                claimed_at=self.claimed_at,
                now=now,
                outcome=str(outcome),  # its value: a StrEnum's str, without Enum's property
                phase=self.doc.get("phase"),
                to=self.doc.get("phase") if next_phase is SAME else next_phase,
                error=error,
                taken_from=self.taken_from,
            )
            current = self.doc.get(history.HISTORY_FIELD, history.ABSENT)
            lighter = (update,)
            update = history.merge(update, history.push(entry, keep, current))
        phase_change = next_phase is not SAME
        return Write(update, action, now, until, phase_change, next_phase, lighter)

    def carry_plan(self, write: Write) -> Carry | None:
        """The lease carried on into the next step by ``write`` (an unlock or an advance that
        frees the document at once), when this replica's carrier has a handler for the
        phase it leaves the document in; None: the write releases. Fenced on the phase
        whatever the outcome, so an outside writer's change of phase wins. Its lease starts
        when ``write`` was planned (``Write.at``): the lease plans it and asks for its carry
        under one hold of its lock, with no wait between."""
        if self.carrier is None or write.action not in _CARRIES or write.until != EPOCH:
            return None
        phase = self._phase_after(write)
        if not isinstance(phase, str):
            return None
        handler = self.carrier(self, phase)
        if handler is None:
            return None
        now = write.at
        until = now + timedelta(seconds=self.settings.lock_timeout)
        token = secrets.token_hex(8)
        update = lease_writes.carry_update(
            write.update, now, until, token, self.settings.replica_id
        )
        return Carry(handler, token, now, until, update, self.fence(True))

    def fence(self, phase_change: bool) -> dict[str, Any]:
        """The filter a write carries: held, the token (and the claimed phase, for a phase
        change); after this step's own release, the document as that release left it
        (``Release``), and held by the lease it carried on, if any. With the document's
        shard key, so the write targets its shard; while migrating from the in-house
        pattern, with the ``lockedAt`` the lease wrote (``InHouse.fence``): either
        expiry's while an extension is unconfirmed."""
        pins = claims.shard_filter(self.doc, self.handler.shard_key)
        in_house = self.settings.in_house
        if self.state not in HOLDING:
            assert self._release is not None
            carried = self.carried
            holder = carried.token if carried is not None else None
            release = self._release
            released = lease_writes.released_fence(
                self.id, self.token, release.until, release.phase, pins=pins, holder=holder
            )
            return in_house.fence(released, [release.until])
        if phase_change:
            held = lease_writes.fenced(self.id, self.token, self.doc.get("phase"), pins)
        else:
            held = lease_writes.fenced(self.id, self.token, pins=pins)
        untils = [self.expires_at]
        if self.state is LeaseState.UNCONFIRMED:
            assert self._unconfirmed_until is not None
            untils.append(self._unconfirmed_until)
        return in_house.fence(held, untils)

    # -- the state machine: what may be written, and what each answer does --------------

    def check(self, action: LeaseWrite, after: bool = False) -> None:
        """Raise ``LeaseLost`` unless this lease may write ``action`` now (``REFUSALS``):
        held, or (``after``: an error's record only) released by this very step's own
        outcome, and its failed attempt not recorded yet."""
        if after:
            ask = Ask.RECORD_AFTER
        else:
            ask = Ask.RECORD if action is LeaseWrite.RECORD else Ask.WRITE
        reason = refusal(self.state, ask)
        if reason is not None:
            raise LeaseLost(self.collection, self.id, self.token, action, reason)

    def landed(self, write: Write, outcome: Outcome) -> Outcome:
        """A releasing write landed: the step's outcome, unless it had one already (an
        error after it), which stands and is returned."""
        if write.action in _RECORDS:
            event = LeaseEvent.NOTED if write.action is LeaseWrite.NOTE else LeaseEvent.RECORDED
        elif self._moves(write):
            event = LeaseEvent.ADVANCED
        else:
            event = LeaseEvent.RELEASED
        return self._released(event, write, write.until, outcome)

    def carried_on(self, write: Write, outcome: Outcome, carry: Carry) -> Outcome:
        """``carry``'s write landed: this step's outcome is recorded and the document is held
        by the next step's lease, which an error noted after it is fenced on."""
        self._carry = carry
        event = LeaseEvent.CARRIED_ADVANCED if self._moves(write) else LeaseEvent.CARRIED
        return self._released(event, write, carry.expires_at, outcome)

    def removed(self, outcome: Outcome) -> None:
        """The step's removal landed: the document is gone."""
        self._fire(LeaseEvent.REMOVED)
        self.outcome = outcome

    def extended(self, now: datetime, until: datetime) -> None:
        """An extension landed in time: the lease runs to ``until``."""
        self._fire(LeaseEvent.EXTENDED)
        self.locked_at = now
        self.expires_at = until
        self._unconfirmed_until = None

    def extension_unconfirmed(self, until: datetime) -> None:
        """An extension to ``until`` failed with time left and may have landed: the lease
        goes on, and while migrating its fence accepts the ``lockedAt`` of either expiry."""
        self._fire(LeaseEvent.UNCONFIRMED)
        self._unconfirmed_until = until

    def lose(self, action: LeaseWrite, reason: str | None = None) -> LeaseLost:
        """The write matched nothing (or, ``reason``, could not be confirmed in time): the
        lease is lost from now on."""
        self._fire(LeaseEvent.LOST)
        if reason is None:
            return LeaseLost(self.collection, self.id, self.token, action)
        return LeaseLost(self.collection, self.id, self.token, action, reason)

    def _released(
        self, event: LeaseEvent, write: Write, until: datetime, outcome: Outcome
    ) -> Outcome:
        if self.state in HOLDING:  # the step's own release: what an error after it is fenced on
            self._release = Release(until, self._phase_after(write))
        self._fire(event)
        if self.outcome is None:
            self.outcome = outcome
        return self.outcome

    def _fire(self, event: LeaseEvent) -> None:
        self.state = fire(self.state, event)

    def _moves(self, write: Write) -> bool:
        """Whether ``write`` leaves the document in another phase than it was claimed in."""
        return bool(self._phase_after(write) != self.doc.get("phase"))

    def _phase_after(self, write: Write) -> Any:
        return self.doc.get("phase") if write.next_phase is SAME else write.next_phase

    # -- pure helpers --------------------------------------------------------------------

    def _free_until(self, now: datetime) -> tuple[datetime, float | None]:
        """Released at once, unless this document used its claims for the tick: then it
        waits the relock floor from ``now``, so no outcome can make a handler spin."""
        if not self.throttled:
            return EPOCH, None
        wait = self.settings.relock_floor
        return now + timedelta(seconds=wait), wait

    def _policy_wait(self, name: str, policy: Any, now: datetime, count: int) -> float:
        """The policy's wait, checked: a policy that raises or answers NaN, None, a negative
        or an infinite number is a ``PolicyError``, never a silent bad lease time."""
        try:
            wait = policy.wait(
                waited=self._time_in_phase(now),
                count=count,
                lock_timeout=self.settings.lock_timeout,
            )
        except Exception as exc:
            raise PolicyError(f"{name} raised {type(exc).__name__}: {exc}") from exc
        if not _is_wait(wait):
            raise PolicyError(f"{name} returned {wait!r}, not a finite number of seconds >= 0")
        return float(wait)

    def _fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        model = self.handler.model
        named = {
            (model.field_name(k) if model is not None else k): _plain(v) for k, v in fields.items()
        }
        submissions.check_fields(named)
        return named

    def _time_in_phase(self, now: datetime) -> float:
        since = self.doc.get("updatedAt") or self.doc.get("createdAt")
        if not isinstance(since, datetime):
            return 0.0
        return max((now - as_utc(since)).total_seconds(), 0.0)

    def _bounded(self, wait: float) -> float:
        return min(max(wait, self.settings.relock_floor), self.settings.max_wait)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.collection}/{self.id} phase={self.phase} "
            f"{self.state.value}>"
        )


def _record_forms(
    error: dict[str, Any], build: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[tuple[dict[str, Any], dict[str, Any] | None], ...]:
    """The updates recording ``error``, to try in turn, each with the record it stores
    (for the history): whole, its message cut short and no traceback, then none of it,
    no ``previousError`` and no history entry (the server refuses a document past 16 MiB,
    yet the attempt must count)."""
    text = str(error.get("message", ""))
    cut = {k: v for k, v in error.items() if k != "traceback"}
    cut["message"] = text[:200] + " [cut: the document is near 16 MiB]"
    bare_record = {**cut, "message": "[not stored: the document is at the 16 MiB limit]"}
    bare = build(bare_record)
    bare.setdefault("$unset", {})["previousError"] = ""
    return (build(error), error), (build(cut), cut), (bare, None)


def _is_wait(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _plain(value: Any) -> Any:
    if type(value) in submissions.SCALARS:  # no model, told without the ABC check
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True)
    return value
