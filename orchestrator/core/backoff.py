"""How long a document waits before it may be claimed again.

A policy maps what is known about the wait so far to seconds. Relocks use the
progressive policy of the original platform by default; handler errors use an
exponential one with jitter so that a burst of failures does not retry in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@runtime_checkable
class BackoffPolicy(Protocol):
    """``waited``: seconds since the document entered its phase; ``count``: relocks (or
    failed attempts) so far in this phase, this one included."""

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> float: ...


@dataclass(frozen=True)
class ProgressiveBackoff:
    """Wait a tenth of the time spent so far; past two minutes, a whole lock timeout.

    Quick things (a pod that starts in seconds) are seen quickly; slow ones stop costing
    a query every second.
    """

    threshold: float = 120.0
    divisor: float = 10.0

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> float:
        if waited <= self.threshold:
            return max(waited, 0.0) / self.divisor
        return lock_timeout


@dataclass(frozen=True)
class ExponentialBackoff:
    """``base * factor**(count-1)`` up to ``cap``, less up to ``jitter`` of itself."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.1
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.base <= 0 or self.factor < 1 or self.cap <= 0 or not 0 <= self.jitter < 1:
            raise ValueError(
                "ExponentialBackoff needs base > 0, factor >= 1, cap > 0 and 0 <= jitter < 1"
            )

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> float:
        exponent = min(max(count - 1, 0), 64)
        raw = min(self.cap, self.base * self.factor**exponent)
        return raw * (1.0 - self.jitter * self.rng.random())
