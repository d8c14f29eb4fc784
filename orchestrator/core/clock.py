"""Time: a replica's local clock, the database server's clock as seen from it, and
dates as the server stores them (``bson_time``) and hands them back (``as_utc``).

Leases are compared across replicas, so they must be judged by one clock: the server's.
Each replica estimates its offset from the server's ``hello`` reply and refreshes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from orchestrator.core.errors import OrchestratorError

_NAIVE_EPOCH = datetime(1970, 1, 1)
UTC_EPOCH = _NAIVE_EPOCH.replace(tzinfo=UTC)
"""The epoch, aware: the stored ``EPOCH`` as ``as_utc`` reads it back."""


def bson_time(value: datetime) -> datetime:
    """Naive UTC with millisecond precision: what the server will hand back. One
    ``replace`` at most (every write stamps several): none for a value already so."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
        micro = value.microsecond
        return value.replace(tzinfo=None, microsecond=micro - micro % 1000)
    micro = value.microsecond
    if micro % 1000:
        return value.replace(microsecond=micro - micro % 1000)
    return value


def as_utc(value: datetime) -> datetime:
    """Aware UTC, whatever the client's ``tz_aware`` setting gave us."""
    if value.tzinfo is None:
        # As value.replace(tzinfo=UTC), a tenth of its cost (every claim pays it).
        return UTC_EPOCH + (value - _NAIVE_EPOCH)
    return value.astimezone(UTC)


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

    It does no I/O: the runners measure (``hello``) when ``due`` says so and hand the
    result to ``record``, or to ``failed`` when the measurement failed; ``now()`` answers
    from the estimate alone, so reading the time never blocks on the server or hides a
    round trip inside an event loop.

    Between two measurements time advances with ``monotonic()``, never with the local wall
    clock, so an NTP step on this machine cannot make a live lease look expired.
    A measurement of ``None`` means the server gives no ``localTime``: then the local wall
    clock is the anchor, the estimate is only as good as the replicas' synchronisation,
    and ``uncertainty`` is ``tolerance`` (leases are judged that much later, so replicas
    whose clocks differ by less than ``tolerance`` never steal one). A measurement is due
    every ``refresh`` seconds; a failed one keeps the last estimate.
    """

    def __init__(
        self,
        local: Clock,
        refresh: float = 60.0,
        tolerance: float = 60.0,
        on_fallback: Callable[[], None] | None = None,
        on_measured: Callable[[ServerClock, float], None] | None = None,
    ) -> None:
        self.local = local
        self._refresh = refresh
        self._tolerance = tolerance
        self._on_fallback = on_fallback
        self._on_measured = on_measured  # (this clock, the round trip): the replica's events
        self._anchor: datetime | None = None
        self._latest: datetime | None = None
        self._anchor_mono = 0.0
        self._measured_at: float | None = None
        self._offset = timedelta(0)
        self._server_time = True
        self._server: Hashable = None  # the server last measured, as ``watch`` names it
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

    @property
    def measured(self) -> bool:
        """True once a measurement succeeded: before that there is no estimate."""
        return self._anchor is not None

    @property
    def due(self) -> bool:
        """A measurement is due: none yet, or the last one is ``refresh`` seconds old."""
        measured_at = self._measured_at
        return measured_at is None or self.local.monotonic() - measured_at >= self._refresh

    def now(self) -> datetime:
        """The server's time now, by the estimate; ``OrchestratorError`` before the first
        measurement, since leases cannot be judged safely by an unmeasured clock."""
        with self._lock:
            if self._anchor is None:
                raise OrchestratorError(
                    "the server's clock has not been measured yet (start() or "
                    "measure_clock() measures it)"
                )
            estimate = self._anchor + timedelta(seconds=self.local.monotonic() - self._anchor_mono)
            # A re-measure may land up to half a round trip earlier (the reply's delay is
            # not symmetric); time judged by this replica never runs backwards.
            if self._latest is not None and estimate < self._latest:
                return self._latest
            self._latest = estimate
            return estimate

    def record(
        self, server: datetime | None, started: float, finished: float, wall: datetime
    ) -> None:
        """A measurement: the server's reply (``None``: it gives no time), the monotonic
        times the probe started and finished, and the local wall time at its end. The
        midpoint of the round trip stands for the reply's time."""
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
        if self._on_measured is not None:
            self._on_measured(self, finished - started)

    def watch(self, server: Hashable) -> None:
        """The server the driver now sends to (``None``: unknown). A change, a primary's
        failover to a node whose clock may differ, makes a measurement due at once,
        rather than after ``refresh``: replicas would disagree on leases meanwhile."""
        with self._lock:
            changed = server is not None and self._server is not None and server != self._server
            if server is not None:
                self._server = server
            if changed:
                self._measured_at = None

    def failed(self, started: float) -> None:
        """A measurement begun at ``started`` failed: the last estimate stands and the
        next one is due a refresh later (with no estimate yet, at once)."""
        with self._lock:
            if self._anchor is not None:
                self._measured_at = started
