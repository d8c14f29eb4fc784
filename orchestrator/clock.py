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
    """The server's time, as measured with ``hello`` and carried forward by the local
    monotonic clock.

    Between two measurements time advances with ``monotonic()``, never with the local wall
    clock, so an NTP step on this machine cannot make a live lease look expired.
    ``probe`` returns the server's ``localTime``, or ``None`` when the server gives none:
    then the local wall clock is the anchor, the estimate is only as good as the replicas'
    synchronisation, and ``uncertainty`` is ``tolerance`` (leases are judged that much
    later, so replicas whose clocks differ by less than ``tolerance`` never steal one).
    The anchor is refreshed every ``refresh`` seconds; a failed probe keeps the last one.
    """

    def __init__(
        self,
        local: Clock,
        probe: Callable[[], datetime | None],
        refresh: float = 60.0,
        tolerance: float = 60.0,
        on_fallback: Callable[[], None] | None = None,
    ) -> None:
        self._local = local
        self._probe = probe
        self._refresh = refresh
        self._tolerance = tolerance
        self._on_fallback = on_fallback
        self._anchor: datetime | None = None
        self._latest: datetime | None = None
        self._anchor_mono = 0.0
        self._measured_at: float | None = None
        self._offset = timedelta(0)
        self._server_time = True
        self._lock = threading.Lock()

    @property
    def offset(self) -> timedelta:
        """Server time minus local wall time, as last measured (zero in the fallback)."""
        return self._offset

    @property
    def server_time(self) -> bool:
        """False while the server reports no time and the local wall clock stands in."""
        return self._server_time

    @property
    def uncertainty(self) -> float:
        """Seconds by which this estimate may be off relative to other replicas' estimates."""
        return 0.0 if self._server_time else self._tolerance

    def now(self) -> datetime:
        mono = self._local.monotonic()
        if self._measured_at is None or mono - self._measured_at >= self._refresh:
            self.measure()
        with self._lock:
            assert self._anchor is not None  # measure() raised otherwise
            estimate = self._anchor + timedelta(seconds=self._local.monotonic() - self._anchor_mono)
            # A re-measure may land up to half a round trip earlier (the reply's delay is
            # not symmetric); time judged by this replica never runs backwards.
            if self._latest is not None and estimate < self._latest:
                return self._latest
            self._latest = estimate
            return estimate

    def measure(self) -> None:
        """Probe the server now; the midpoint of the round trip stands for its reply time.

        A failed probe keeps the last estimate; with none yet, it raises, since leases
        cannot be judged safely by an unmeasured clock.
        """
        started = self._local.monotonic()
        try:
            server = self._probe()
        except Exception:
            with self._lock:
                if self._anchor is None:
                    raise
                self._measured_at = started  # retried at the next refresh
            return
        finished = self._local.monotonic()
        wall = self._local.now()
        midpoint = (started + finished) / 2
        fallback = server is None
        with self._lock:
            if server is None:
                self._anchor = wall - timedelta(seconds=finished - midpoint)
                self._offset = timedelta(0)
            else:
                self._anchor = server
                self._offset = server - (wall - timedelta(seconds=finished - midpoint))
            self._anchor_mono = midpoint
            self._measured_at = started
            newly_fallback = fallback and self._server_time
            self._server_time = not fallback
        if newly_fallback and self._on_fallback is not None:
            self._on_fallback()
