"""Time: a replica's local clock, and the database server's clock as seen from it.

Leases are compared across replicas, so they must be judged by one clock: the server's.
Each replica estimates its offset from the server's ``hello`` reply and refreshes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """A source of wall time (aware UTC) and of monotonic seconds."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The machine's own clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ServerClock:
    """The server's time, estimated as local time plus an offset measured with ``hello``.

    ``probe`` returns the server's ``localTime`` (or ``None`` when the server gives none:
    then the local clock is used as is). The offset is refreshed every ``refresh`` seconds
    of the local monotonic clock; a failed probe keeps the last estimate.
    """

    def __init__(
        self,
        local: Clock,
        probe: Callable[[], datetime | None],
        refresh: float = 60.0,
    ) -> None:
        self._local = local
        self._probe = probe
        self._refresh = refresh
        self._offset = timedelta(0)
        self._measured_at: float | None = None
        self._lock = threading.Lock()

    @property
    def offset(self) -> timedelta:
        """Server time minus local time, as last measured."""
        return self._offset

    def now(self) -> datetime:
        due = self._measured_at is None or (
            self._local.monotonic() - self._measured_at >= self._refresh
        )
        if due:
            self.measure()
        return self._local.now() + self._offset

    def measure(self) -> None:
        """Probe the server now; the midpoint of the round trip stands for its reply time.

        A failed probe keeps the last estimate; with none yet, it raises, since leases
        cannot be judged safely by an unmeasured local clock.
        """
        with self._lock:
            before = self._local.now()
            started = self._local.monotonic()
            try:
                server = self._probe()
            except Exception:
                if self._measured_at is None:
                    raise
                self._measured_at = started  # retried at the next refresh
                return
            after = self._local.now()
            self._measured_at = started
            self._offset = (
                timedelta(0) if server is None else server - (before + (after - before) / 2)
            )
