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

from orchestrator.core import pauses
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
    ) -> None:
        self._store = store
        self._settings = settings
        self._report = report
        self._apply = apply
        self._lock = threading.Lock()  # the fields below, from any worker or the timer
        self._pauses: list[pauses.Pause] = []
        self._handlers: list[Handler] = []
        self._probed = False  # a probe read them since the last heartbeat

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

    async def read(self, *, unless_probed: bool = False) -> None:
        """Read the pauses now and apply them; ``unless_probed`` (a heartbeat's): not if a
        tick's probe read them since the last heartbeat (a replica whose handlers are all
        paused sends no probe: its heartbeats read them)."""
        with self._lock:
            probed, self._probed = self._probed, False
        if unless_probed and probed:
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

    def probed(self, found: list[pauses.Pause]) -> None:
        """A tick's probe read the pauses in force: ``found``."""
        with self._lock:
            self._probed = True
        self.seen(found)

    def seen(self, found: list[pauses.Pause]) -> None:
        """The pauses in force are ``found`` (read now)."""
        with self._lock:
            changed = [p.scope for p in found] != [p.scope for p in self._pauses]
            self._pauses = found
            handlers = self._handlers
        if changed:
            shown = "; ".join(p.scope.describe() for p in found) or "none"
            self._report.line(logging.INFO, f"pauses now: {shown}", "paused")
        self._apply(pauses.paused(found, handlers))
