"""A clock that moves only when a test says so.

Leases, backoff and the server's clock all depend on time; tests must control it without
sleeping. ``FakeClock.skewed`` gives one replica a clock that is off by a fixed amount, as a
badly synchronised machine would be, while one ``advance`` moves every view at once.
"""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta

__all__ = ["FakeClock"]

_DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)


def _finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


class FakeClock:
    """A manually advanced clock: wall time (aware UTC) and monotonic seconds move together.

    ``start`` defaults to 2026-01-01T00:00:00Z; a naive ``start`` is taken as UTC.
    ``monotonic()`` counts the seconds advanced since creation (it starts at 0.0).
    Thread-safe; never sleeps.
    """

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            start = _DEFAULT_START
        elif start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
        else:
            start = start.astimezone(UTC)
        self._start = start
        self._elapsed = 0.0
        self._stepped = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            # Derived from the elapsed seconds, so now() and monotonic() never drift apart
            # unless a test steps the wall clock on purpose.
            return self._start + timedelta(seconds=self._elapsed + self._stepped)

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (ValueError when negative or not finite)."""
        seconds = _finite("seconds", seconds)
        if seconds < 0:
            raise ValueError(f"a clock cannot go back: advance({seconds!r})")
        with self._lock:
            self._elapsed += seconds

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (either way) without moving ``monotonic()``:
        what an NTP correction does to a machine."""
        seconds = _finite("seconds", seconds)
        with self._lock:
            self._stepped += seconds

    def skewed(self, offset_seconds: float) -> _SkewedClock:
        """A view of this clock whose ``now()`` is ``offset_seconds`` ahead (or behind if < 0).

        Its ``monotonic()`` is this clock's; advancing this clock moves the view too.
        """
        return _SkewedClock(self, timedelta(seconds=_finite("offset_seconds", offset_seconds)))

    def __repr__(self) -> str:
        return f"FakeClock({self.now().isoformat()}, monotonic={self.monotonic()!r})"


class _SkewedClock:
    """A FakeClock seen from a machine whose wall clock is off by ``offset``."""

    def __init__(self, base: FakeClock, offset: timedelta) -> None:
        self.base = base
        self.offset = offset

    def now(self) -> datetime:
        return self.base.now() + self.offset

    def monotonic(self) -> float:
        return self.base.monotonic()

    def advance(self, seconds: float) -> None:
        """Advance the shared base clock (and so every view of it)."""
        self.base.advance(seconds)

    def step_wall(self, seconds: float) -> None:
        """Step this view's wall clock only (an NTP correction on one machine)."""
        self.offset += timedelta(seconds=_finite("seconds", seconds))

    def __repr__(self) -> str:
        return f"<skewed {self.offset.total_seconds():+g}s of {self.base!r}>"
