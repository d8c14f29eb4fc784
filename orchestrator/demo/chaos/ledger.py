"""What a chaos run records as it goes, for the audit to judge: every execution of a step
with a side effect, the faults injected by kind, the stale writes tried and landed, the
submits the API server retried, and the exceptions that escaped a tick. Locked: steps
record from their own threads too (a hung step, the heartbeat that times it out)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Execution:
    """One run of a step with a side effect, by one replica."""

    number: int
    replica: str
    completed: bool = False
    interrupted: str | None = None


@dataclass
class Ledger:
    executions: dict[tuple[str, str], list[Execution]] = field(default_factory=dict)
    """By widget and step: every run of it, in order."""
    injected: Counter[str] = field(default_factory=Counter)
    """Faults the harness injected, by kind (the network's are counted by each ``Faults``)."""
    stale_attempted: int = 0
    stale_landed: int = 0
    submit_retries: int = 0
    unhandled: list[str] = field(default_factory=list)
    """Exceptions that escaped a tick, and hung steps that never finished."""
    _started: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def execution(self, key: tuple[str, str], replica: str) -> Execution:
        """A new execution of step ``key``, numbered in the order they start."""
        with self._lock:
            self._started += 1
            execution = Execution(self._started, replica)
            self.executions.setdefault(key, []).append(execution)
        return execution

    def count(self, kind: str) -> None:
        with self._lock:
            self.injected[kind] += 1

    def stale_write(self, *, landed: bool) -> None:
        """A write from a holder whose lease was superseded: tried, or landed too."""
        with self._lock:
            if landed:
                self.stale_landed += 1
            else:
                self.stale_attempted += 1


__all__ = ["Execution", "Ledger"]
