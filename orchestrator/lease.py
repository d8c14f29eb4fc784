"""A handler's hold on one document for one step.

Every write a lease makes carries its token in the filter (fencing): once another replica
has claimed the document, this lease's writes match nothing and raise ``LeaseLost``
instead of overwriting the new holder's lease.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from orchestrator import queries
from orchestrator.errors import ConfigError, LeaseLost
from orchestrator.queries import as_utc
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
    """What a step did with its lease; handlers return the value their lease gave them."""

    action: Action
    phase: str | None
    wait: float | None = None


class _State(Enum):
    HELD = "held"
    RELEASED = "released"
    LOST = "lost"


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
        self._state = _State.HELD
        self._lock = threading.Lock()
        self.throttled = False  # set by the loop when this document used its burst

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

    # -- what handlers call ---------------------------------------------------------------

    def unlock(self, **fields: Any) -> Outcome:
        """Step done, more to do: release now so the next step can be claimed at once."""
        data = self._fields(fields)
        if not self.throttled:
            self._write(queries.unlock_update(data), "unlock", release=True)
            return Outcome("unlocked", self.phase)
        wait = self._settings.relock_floor
        update = queries.unlock_update(data, self._release_at(self._clock.now(), wait))
        self._write(update, "unlock", release=True)
        return Outcome("unlocked", self.phase, wait)

    def relock(self, wait: float | None = None, **fields: Any) -> Outcome:
        """Waiting on something outside: release, claimable again after ``wait`` seconds
        (by default the handler's relock policy; never less than the floor of one tick)."""
        now = self._clock.now()
        count = _int(self.doc.get("relocks")) + 1
        if wait is None:
            wait = self.handler.relock_policy.wait(
                waited=self._time_in_phase(now),
                count=count,
                lock_timeout=self._settings.lock_timeout,
            )
        elif not isinstance(wait, int | float) or not math.isfinite(wait) or wait < 0:
            raise ConfigError(
                f"relock(wait=...) needs a finite number of seconds >= 0, not {wait!r}"
            )
        wait = self._bounded(float(wait), floor=self._settings.relock_floor)
        update = queries.relock_update(self._release_at(now, wait), self._fields(fields))
        self._write(update, "relock", release=True)
        return Outcome("relocked", self.phase, wait)

    def advance(self, phase: str, **fields: Any) -> Outcome:
        """Enter ``phase`` (setting ``fields`` with it) and release at once."""
        if not isinstance(phase, str) or not phase or phase.startswith("$"):
            raise ConfigError(f"advance() needs a phase name, not {phase!r}")
        if self.handler.to and phase not in self.handler.to:
            raise ConfigError(
                f"{self.handler.name} may advance to {list(self.handler.to)}, not {phase!r}"
            )
        update = queries.advance_update(phase, self._clock.now(), self._fields(fields))
        self._write(update, "advance", release=True)
        return Outcome("advanced", phase)

    def remove(self) -> Outcome:
        """Delete the document (the end of its life), fenced like every write."""
        self._fenced("remove", partial(self._store.delete, self.collection, self.id, self.token))
        return Outcome("removed", self.phase)

    def fail(self, reason: str) -> Outcome:
        """Give up now: the failed phase, with ``reason`` recorded, no further attempts."""
        return self.record_error("Failed", reason, permanent=True)

    def extend(self) -> None:
        """Renew the lease for another lock timeout, for a step longer than one."""
        now = self._clock.now()
        self._write(queries.extend_update(now), "extend", release=False)
        self.locked_at = now

    # -- what the loop calls --------------------------------------------------------------

    def record_error(self, kind: str, message: str, *, permanent: bool = False) -> Outcome:
        """Count a failed attempt: retry after the handler's backoff, or, past its
        ``max_attempts`` (or when ``permanent``), move to its failed phase."""
        now = self._clock.now()
        attempts = _int(self.doc.get("attempts")) + 1
        error = queries.error_record(kind, message, now, self.phase)
        if permanent or attempts >= self.handler.max_attempts:
            failed = self.handler.failed_phase
            self._write_error(
                lambda record: queries.fail_update(failed, attempts, record, now), error, "fail"
            )
            return Outcome("failed", failed)
        try:
            wait = self.handler.retry_policy.wait(
                waited=self._time_in_phase(now),
                count=attempts,
                lock_timeout=self._settings.lock_timeout,
            )
        except Exception:  # a broken policy must not stop the attempt from being counted
            wait = self._settings.lock_timeout
        wait = self._bounded(wait, floor=self._settings.relock_floor)
        release_at = self._release_at(now, wait)
        self._write_error(
            lambda record: queries.retry_update(attempts, record, release_at), error, "retry"
        )
        return Outcome("retrying", self.phase, wait)

    def release(self) -> Outcome:
        """Hand back a lease whose step never ran."""
        self._write(queries.release_update(), "release", release=True)
        return Outcome("released", self.phase)

    # -- internals -------------------------------------------------------------------------

    def _write_error(
        self,
        build: Callable[[dict[str, Any]], dict[str, Any]],
        error: dict[str, Any],
        action: str,
    ) -> None:
        """Write a failed attempt with ``build(error record)``. The server refuses a write
        that takes the document past 16 MiB, yet the attempt must count: store less and
        write again, the message cut short, then no message and no ``previousError``."""
        message = str(error.get("message", ""))
        cut = {**error, "message": message[:200] + " [cut: the document is near 16 MiB]"}
        bare = {**error, "message": "[not stored: the document is at the 16 MiB limit]"}
        for record in (error, cut):
            try:
                self._write(build(record), action, release=True)
                return
            except DocumentTooLarge:
                continue
        update = build(bare)
        update.setdefault("$unset", {})["previousError"] = ""
        self._write(update, action, release=True)

    def _write(self, update: dict[str, Any], action: str, *, release: bool) -> None:
        write = partial(self._store.write, self.collection, self.id, self.token, update, action)
        self._fenced(action, write, release=release)

    def _fenced(self, action: str, operation: Callable[[], None], *, release: bool = True) -> None:
        """Run a token-filtered ``operation``; serialised with the heartbeat's extends."""
        with self._lock:
            if self._state is not _State.HELD:
                raise LeaseLost(self.collection, self.id, self.token, action)
            try:
                operation()
            except LeaseLost:
                self._state = _State.LOST
                raise
            if release:
                self._state = _State.RELEASED

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

    def _bounded(self, wait: float, *, floor: float) -> float:
        return min(max(wait, floor), self._settings.max_wait)

    def _release_at(self, now: datetime, wait: float) -> datetime:
        """``lockedAt`` that makes the document claimable ``wait`` seconds from now."""
        return now - timedelta(seconds=self._settings.lock_timeout) + timedelta(seconds=wait)

    def __repr__(self) -> str:
        return f"<Lease {self.collection}/{self.id} phase={self.phase} {self._state.value}>"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True)
    return value
