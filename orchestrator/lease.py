"""A handler's hold on one document for one step.

Every write a lease makes carries its token in the filter (fencing): once another replica
has claimed the document, this lease's writes match nothing and raise ``LeaseLost``
instead of overwriting the new holder's lease.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from orchestrator import queries
from orchestrator.errors import ConfigError, LeaseLost, OrchestratorError, StoreError
from orchestrator.queries import as_utc
from orchestrator.resource import EPOCH
from orchestrator.store import DocumentTooLarge

if TYPE_CHECKING:
    from orchestrator.clock import ServerClock
    from orchestrator.registry import Handler
    from orchestrator.settings import Settings
    from orchestrator.store import Store

R = TypeVar("R")

Action = Literal["unlocked", "relocked", "advanced", "retrying", "failed", "released", "removed"]


@dataclass(frozen=True)
class Outcome:
    """What a step did with its lease; handlers return the value their lease gave them.

    ``token`` names the lease that wrote it: returning another lease's outcome is an error.
    """

    action: Action
    phase: str | None
    wait: float | None = None
    token: str | None = field(default=None, compare=False, repr=False)


_SAME: Any = object()  # a release that leaves the phase as it was


class _State(Enum):
    HELD = "held"
    RELEASED = "released"
    LOST = "lost"


class PolicyError(OrchestratorError):
    """A relock or retry policy raised or returned something that is not a wait."""


class Lease(Generic[R]):
    """``doc`` is the claimed document as stored; ``resource`` is it validated by the
    handler's model (the same dict for handlers registered on a collection name)."""

    def __init__(
        self,
        *,
        store: Store,
        clock: ServerClock,
        settings: Settings,
        handler: Handler,
        doc: dict[str, Any],
        token: str,
        claimed_at: datetime,
        expires_at: datetime,
        throttled: bool = False,
    ) -> None:
        self._store = store
        self._clock = clock
        self._settings = settings
        self.handler = handler
        self.doc = doc
        self.resource: R = doc  # type: ignore[assignment]  # replaced once validated
        self.token = token
        self.claimed_at = claimed_at
        self.locked_at = claimed_at
        self.expires_at = expires_at
        self.throttled = throttled  # this document used its per-tick budget of claims
        self._state = _State.HELD
        self._released_until: datetime | None = None
        self._released_phase: Any = None
        self._lock = threading.Lock()

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
        return self._state is _State.HELD

    @property
    def lost(self) -> bool:
        """True once a write found the document held by another lease (or its phase
        changed from outside): nothing more may be written for this step."""
        return self._state is _State.LOST

    # -- what handlers call ---------------------------------------------------------------

    def unlock(self, **fields: Any) -> Outcome:
        """Step done, more to do: release now so the next step can be claimed at once."""
        data = self._fields(fields)
        until, wait = self._free_until()
        self._write(queries.unlock_update(data, until), "unlock", until=until)
        return Outcome("unlocked", self.phase, wait, self.token)

    def relock(self, wait: float | None = None, **fields: Any) -> Outcome:
        """Waiting on something outside: release, claimable again after ``wait`` seconds
        (by default the handler's relock policy; never less than the floor of one tick)."""
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
        self._write(queries.relock_update(until, data), "relock", until=until)
        return Outcome("relocked", self.phase, wait, self.token)

    def advance(self, phase: str, **fields: Any) -> Outcome:
        """Enter ``phase`` (setting ``fields`` with it) and release at once.

        Fenced on the phase the step was claimed in too: if an outside writer (the API
        cancelling, say) changed the phase meanwhile, the advance raises ``LeaseLost``, the
        lease is released, and the document stays in the phase the outside writer chose.
        """
        if not isinstance(phase, str) or not phase or phase.startswith("$"):
            raise ConfigError(f"advance() needs a phase name, not {phase!r}")
        if self.handler.to and phase not in self.handler.to:
            raise ConfigError(
                f"{self.handler.name} may advance to {list(self.handler.to)}, not {phase!r}"
            )
        data = self._fields(fields)
        until, wait = self._free_until()
        update = queries.advance_update(phase, self._clock.now(), data, until)
        self._write(update, "advance", until=until, phase_change=True, next_phase=phase)
        return Outcome("advanced", phase, wait, self.token)

    def remove(self) -> Outcome:
        """Delete the document (the end of its life), fenced like every write."""
        self._fenced(
            "remove",
            partial(self._store.delete, self.collection, self.id, self.token),
            until=None,
            next_phase=None,
        )
        return Outcome("removed", self.phase, None, self.token)

    def fail(self, reason: str) -> Outcome:
        """Give up now: the failed phase, with ``reason`` recorded, no further attempts."""
        return self.record_error("Failed", reason, permanent=True)

    def extend(self) -> None:
        """Renew the lease for another lock timeout, for a step longer than one."""
        now = self._clock.now()
        until = now + timedelta(seconds=self._settings.lock_timeout)
        update = queries.extend_update(now, until)
        with self._lock:
            if self._state is not _State.HELD:
                raise LeaseLost(self.collection, self.id, self.token, "extend")
            if not self._store.write(self.collection, queries.fenced(self.id, self.token), update):
                self._state = _State.LOST
                raise LeaseLost(self.collection, self.id, self.token, "extend")
            self.locked_at = now
            self.expires_at = until

    def expired(self, now: datetime) -> bool:
        """True once this lease's expiry has passed: another replica may hold it now.

        No margin for clock uncertainty: other replicas judge leases that much late, which
        covers their skew against this replica."""
        return now >= self.expires_at

    # -- what the loop calls --------------------------------------------------------------

    def record_error(self, kind: str, message: str, *, permanent: bool = False) -> Outcome:
        """Count a failed attempt: retry after the handler's backoff, or, past its
        ``max_attempts`` (or when ``permanent``), move to its failed phase.

        Works on a lease the step already released with an outcome of its own (a handler
        that unlocked, then raised): the attempt still counts, fenced on the document
        being as that release left it.
        """
        now = self._clock.now()
        attempts = _int(self.doc.get("attempts")) + 1
        note = ""
        wait = 0.0
        if not permanent and attempts < self.handler.max_attempts:
            try:
                wait = self._bounded(
                    self._policy_wait("retry_policy", self.handler.retry_policy, now, attempts)
                )
            except PolicyError as exc:  # a broken policy must not leave the attempt uncounted
                wait = self._bounded(self._settings.lock_timeout)
                note = f" [{exc}; waiting {wait:g}s instead]"
        error = queries.error_record(kind, message + note, now, self.phase)
        if permanent or attempts >= self.handler.max_attempts:
            failed = self.handler.failed_phase
            until, _ = self._free_until()
            self._write_error(
                lambda record: queries.fail_update(
                    failed, attempts, record, now, self.handler.name, until
                ),
                error,
                "fail",
                until=until,
                phase_change=True,
                next_phase=failed,
            )
            return Outcome("failed", failed, None, self.token)
        until = now + timedelta(seconds=wait)
        self._write_error(
            lambda record: queries.retry_update(attempts, record, until),
            error,
            "retry",
            until=until,
        )
        return Outcome("retrying", self.phase, wait, self.token)

    def release(self) -> Outcome:
        """Hand back a lease whose step never ran (subject to the budget, like any release)."""
        until, wait = self._free_until()
        self._write(queries.release_update(until), "release", until=until)
        return Outcome("released", self.phase, wait, self.token)

    # -- internals -------------------------------------------------------------------------

    def _write_error(
        self,
        build: Callable[[dict[str, Any]], dict[str, Any]],
        error: dict[str, Any],
        action: str,
        **write: Any,
    ) -> None:
        """Write a failed attempt with ``build(error record)``. The server refuses a write
        that takes the document past 16 MiB, yet the attempt must count: store less and
        write again, the message cut short, then no message and no ``previousError``."""
        message = str(error.get("message", ""))
        cut = {**error, "message": message[:200] + " [cut: the document is near 16 MiB]"}
        bare = {**error, "message": "[not stored: the document is at the 16 MiB limit]"}
        for record in (error, cut):
            try:
                self._write(build(record), action, after=True, **write)
                return
            except DocumentTooLarge:
                continue
        update = build(bare)
        update.setdefault("$unset", {})["previousError"] = ""
        self._write(update, action, after=True, **write)

    def _write(
        self,
        update: dict[str, Any],
        action: str,
        *,
        until: datetime,
        phase_change: bool = False,
        next_phase: Any = _SAME,
        after: bool = False,
    ) -> None:
        """A releasing write. ``phase_change``: fenced on the claimed phase too. ``after``:
        allowed on a lease this step released itself (error bookkeeping only)."""
        if next_phase is _SAME:
            next_phase = self.doc.get("phase")

        def operation() -> None:
            if self._state is _State.RELEASED:
                assert self._released_until is not None
                query = queries.released_fence(self.id, self._released_until, self._released_phase)
            elif phase_change:
                query = queries.fenced(self.id, self.token, self.doc.get("phase"))
            else:
                query = queries.fenced(self.id, self.token)
            if not self._store.write(self.collection, query, update):
                if self._state is _State.HELD and phase_change:
                    self._release_after_outside_change()
                raise LeaseLost(self.collection, self.id, self.token, action)

        self._fenced(action, operation, until=until, next_phase=next_phase, after=after)

    def _release_after_outside_change(self) -> None:
        """The phase-fenced write matched nothing: if the token still matches, the phase was
        changed from outside while the step ran; let the document go at once."""
        with contextlib.suppress(StoreError):  # if it fails, the lease expires on its own
            self._store.write(
                self.collection, queries.fenced(self.id, self.token), queries.release_update()
            )

    def _fenced(
        self,
        action: str,
        operation: Callable[[], None],
        *,
        until: datetime | None,
        next_phase: Any,
        after: bool = False,
    ) -> None:
        """Run a fenced ``operation``; serialised with the heartbeat's extends."""
        with self._lock:
            allowed = self._state is _State.HELD or (after and self._state is _State.RELEASED)
            if not allowed:
                reason = (
                    "this step already gave an outcome; a step returns exactly one"
                    if self._state is _State.RELEASED
                    else "another replica holds it now"
                )
                raise LeaseLost(self.collection, self.id, self.token, action, reason)
            try:
                operation()
            except LeaseLost:
                self._state = _State.LOST
                raise
            self._state = _State.RELEASED
            if until is not None:
                self._released_until = until
                self._released_phase = next_phase

    def _free_until(self) -> tuple[datetime, float | None]:
        """Released at once, unless this document used its claims for the tick: then it
        waits the relock floor, so no outcome can make a handler spin."""
        if not self.throttled:
            return EPOCH, None
        wait = self._settings.relock_floor
        return self._clock.now() + timedelta(seconds=wait), wait

    def _policy_wait(self, name: str, policy: Any, now: datetime, count: int) -> float:
        """The policy's wait, checked: a policy that raises or answers NaN, None, a negative
        or an infinite number is a ``PolicyError``, never a silent bad lease time."""
        try:
            wait = policy.wait(
                waited=self._time_in_phase(now),
                count=count,
                lock_timeout=self._settings.lock_timeout,
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
        queries.check_fields(named)
        return named

    def _time_in_phase(self, now: datetime) -> float:
        since = self.doc.get("updatedAt") or self.doc.get("createdAt")
        if not isinstance(since, datetime):
            return 0.0
        return max((now - as_utc(since)).total_seconds(), 0.0)

    def _bounded(self, wait: float) -> float:
        return min(max(wait, self._settings.relock_floor), self._settings.max_wait)

    def __repr__(self) -> str:
        return f"<Lease {self.collection}/{self.id} phase={self.phase} {self._state.value}>"


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
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True)
    return value
