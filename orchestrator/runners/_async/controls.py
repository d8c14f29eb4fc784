"""The operators' pauses as this replica honours them: read at ``start()``, with every
tick's probe (in its one round trip, where the server can), and at a heartbeat when no
probe read them since the last one; applied to the scheduler, and published in the
replica's record.

A read that fails keeps the pauses last read (logged): a database that cannot be read
cannot be claimed from either, and a pause must not lapse on one lost reply.

Reads are numbered as they are sent, and an answer older than the newest applied is
dropped: a tick's probe and a heartbeat run side by side, and a probe sent before a
heartbeat's read could land after it and put back, until the next read, a pause the
operators had lifted, or lift one they had just made.
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
        # The fields below, from any worker or the timer; ``apply`` is called under it (it
        # takes the books' lock, never this one), so what is applied last was read last.
        self._lock = threading.Lock()
        self._pauses: list[pauses.Pause] = []
        self._handlers: list[Handler] = []
        self._probed = False  # a probe read them since the last heartbeat
        self._sent = 0  # reads sent, numbered in the order they were sent
        self._applied = 0  # the number of the newest read applied

    @property
    def scopes(self) -> list[str]:
        """The pauses honoured now, as operators read them."""
        with self._lock:
            return [p.scope.describe() for p in self._pauses]

    def registered(self, handlers: list[Handler]) -> None:
        """The handlers changed: the pauses last read cover the new ones too."""
        with self._lock:
            self._handlers = list(handlers)
            self._apply(pauses.paused(self._pauses, self._handlers))

    async def read(self, *, unless_probed: bool = False) -> None:
        """Read the pauses now and apply them; ``unless_probed`` (a heartbeat's): not if a
        tick's probe read them since the last heartbeat (a replica whose handlers are all
        paused sends no probe: its heartbeats read them)."""
        with self._lock:
            probed, self._probed = self._probed, False
            if unless_probed and probed:
                return
            number = self._send()
        name = self._settings.pauses_collection
        try:
            found = await self._store.read_pauses(name)
        except StoreError as exc:
            self._report.line(
                self._report.trouble(logging.WARNING, exc),
                f"could not read the pauses from {name}; the last read stand: {exc}",
                "pauses-unread",
            )
            return
        self._seen(found, number, probe=False)

    def probing(self) -> Callable[[list[pauses.Pause]], None]:
        """A tick's probe that reads the pauses is being sent now: what its answer (the
        pauses in force) is given to."""
        with self._lock:
            number = self._send()
        return lambda found: self._seen(found, number, probe=True)

    def _send(self) -> int:
        """The number of a read sent now (the caller holds the lock)."""
        self._sent += 1
        return self._sent

    def _seen(self, found: list[pauses.Pause], number: int, *, probe: bool) -> None:
        """The read numbered ``number`` found the pauses in force to be ``found``: applied,
        unless a read sent after it was applied first (this one says less about now).
        Applied under the lock, so two answers are never applied out of order."""
        with self._lock:
            if number < self._applied:
                return
            self._applied = number
            if probe:
                self._probed = True
            changed = [p.scope for p in found] != [p.scope for p in self._pauses]
            self._pauses = found
            self._apply(pauses.paused(found, self._handlers))
        if changed:
            shown = "; ".join(p.scope.describe() for p in found) or "none"
            self._report.line(logging.INFO, f"pauses now: {shown}", "paused")
