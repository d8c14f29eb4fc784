"""Whether the database answers, as one replica's own operations find it.

During an outage every tick's claim, every heartbeat's write and every clock measurement
fails: logged each time, an operator reads pages of the same error and cannot tell when
it began or ended. ``DatabaseWatch`` turns those failures and answers into two changes,
told once each: the database became unreachable (what failed, since when) and it is back
(after how long). No I/O: the store tells it what its operations found.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from orchestrator.core.clock import Clock
from orchestrator.core.errors import StoreError

__all__ = ["Back", "DatabaseWatch", "Unreachable"]


@dataclass(frozen=True)
class Unreachable:
    """The first transient failure after an answer: ``action`` failed with ``error``."""

    since: datetime
    action: str
    error: StoreError


@dataclass(frozen=True)
class Back:
    """The first answer after an outage that began at ``since``, ``down_for`` seconds
    earlier (by the replica's local clock)."""

    since: datetime
    down_for: float


class DatabaseWatch:
    """The database's state as this replica's operations find it, each change told once to
    ``changed``. An operation reads ``epoch`` as it starts and reports with it: only what
    it found in the state it started in counts, so an operation sent before an outage was
    noticed (that answers late) does not end it, nor does one sent during it (that fails
    late) begin another."""

    def __init__(self, clock: Clock, changed: Callable[[Unreachable | Back], None]) -> None:
        self._clock = clock
        self._changed = changed
        self._lock = threading.Lock()  # operations report from any worker or thread
        self._epoch = 0  # one more at each change
        self._since: datetime | None = None  # when the outage began; None: it answers
        self._began = 0.0  # the same, in the local clock's monotonic seconds

    @property
    def epoch(self) -> int:
        """What an operation reads as it starts, and reports with."""
        return self._epoch

    @property
    def down(self) -> bool:
        """The database is unreachable, as far as this replica knows."""
        return self._since is not None

    def failed(self, epoch: int, action: str, error: StoreError) -> None:
        """An operation started at ``epoch`` failed; a transient error (no server, no
        primary, no majority) makes the database unreachable."""
        if not error.transient or self._since is not None:
            return
        with self._lock:
            if epoch != self._epoch or self._since is not None:
                return
            self._epoch += 1
            self._since = self._clock.now()
            self._began = self._clock.monotonic()
            change = Unreachable(self._since, action, error)
        self._changed(change)

    def answered(self, epoch: int) -> None:
        """An operation started at ``epoch`` got its answer: an outage it began in is over.
        Called on every operation: nothing is locked while the database answers."""
        if self._since is None:
            return
        with self._lock:
            if epoch != self._epoch or self._since is None:
                return
            self._epoch += 1
            change = Back(self._since, max(self._clock.monotonic() - self._began, 0.0))
            self._since = None
        self._changed(change)
