"""The operators' pauses as this replica honours them: read at ``start()``, with every
tick's probe (in its one round trip, where the server can), and at a heartbeat when no
probe read them since the last one; applied to the scheduler, and published in the
replica's record.

A read that fails keeps the pauses last read (logged): a database that cannot be read
cannot be claimed from either, and a pause must not lapse on one lost reply.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from orchestrator.core import pauses, replicas
from orchestrator.core.clock import Clock
from orchestrator.core.errors import StoreError
from orchestrator.core.registry import Handler
from orchestrator.core.settings import Settings
from orchestrator.mongo._async.contract import AsyncLeaseStore
from orchestrator.runners.reporter import Reporter

__all__ = ["AsyncPauseWatch"]


class AsyncPauseWatch:
    """Keeps ``apply`` (the books' ``pause``) told which handlers are paused."""

    def __init__(
        self,
        *,
        store: AsyncLeaseStore,
        settings: Settings,
        report: Reporter,
        apply: Callable[[frozenset[str]], None],
        clock: Clock,
    ) -> None:
        self._store = store
        self._clock = clock  # local monotonic time: when the pauses were last read
        self._settings = settings
        self._report = report
        self._apply = apply
        self._lock = threading.Lock()  # the fields below, from any worker or the timer
        self._pauses: list[pauses.Pause] = []
        self._handlers: list[Handler] = []
        self._read_at: float | None = None

    @property
    def scopes(self) -> list[str]:
        """The pauses honoured now, as operators read them."""
        with self._lock:
            return [p.scope.describe() for p in self._pauses]

    def registered(self, handlers: list[Handler]) -> None:
        """The handlers changed: the pauses last read cover the new ones too."""
        with self._lock:
            self._handlers = list(handlers)
            found = self._pauses
        self._apply(pauses.paused(found, handlers))

    async def read(self, *, unless_fresh: bool = False) -> None:
        """Read the pauses now and apply them; ``unless_fresh`` (a heartbeat's): not if a
        probe read them within the last heartbeat interval."""
        if unless_fresh and self._fresh():
            return
        name = self._settings.pauses_collection
        try:
            found = await self._store.read_pauses(name)
        except StoreError as exc:
            self._report.line(
                logging.WARNING,
                f"could not read the pauses from {name}; the last read stand: {exc}",
                "pauses-unread",
            )
            return
        self.seen(found)

    def _fresh(self) -> bool:
        interval = replicas.refresh_interval(self._settings.lock_timeout)
        with self._lock:
            read_at = self._read_at
        return read_at is not None and 0 <= self._clock.monotonic() - read_at < interval

    def seen(self, found: list[pauses.Pause]) -> None:
        """The pauses in force are ``found`` (read now, by a probe or ``read``)."""
        with self._lock:
            self._read_at = self._clock.monotonic()
            changed = [p.scope for p in found] != [p.scope for p in self._pauses]
            self._pauses = found
            handlers = self._handlers
        if changed:
            shown = "; ".join(p.scope.describe() for p in found) or "none"
            self._report.line(logging.INFO, f"pauses now: {shown}", "paused")
        self._apply(pauses.paused(found, handlers))
