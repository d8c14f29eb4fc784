"""The network faults a chaos run schedules: outages of the whole database and partitions
of one replica, at least one of each, within the first 80% of ``duration``. (Each replica's
``Faults`` adds its own per operation: transient errors, lost replies, slow operations.)"""

from __future__ import annotations

import random

from orchestrator.demo.chaos.ledger import Ledger
from orchestrator.demo.chaos.pods import Replicas
from orchestrator.demo.chaos.workload import ChaosConfig


class Network:
    """Planned up front from the run's random source, so one seed gives the same events."""

    def __init__(
        self, config: ChaosConfig, rng: random.Random, replicas: Replicas, ledger: Ledger
    ) -> None:
        self.cfg = config
        self.rng = rng
        self.replicas = replicas
        self.ledger = ledger
        self.events: list[tuple[float, str]] = []
        """(simulated seconds, "outage" or "partition"), in order; each removed as it
        strikes."""

    def plan(self) -> None:
        count = max(1, round(self.cfg.duration * self.cfg.rate / 6))
        for kind in ("outage", "partition"):
            for _ in range(count):
                self.events.append((self.rng.uniform(0, 0.8 * self.cfg.duration), kind))
        self.events.sort()

    def strike(self, elapsed: float) -> None:
        """Every event due by ``elapsed`` simulated seconds."""
        while self.events and self.events[0][0] <= elapsed:
            _, kind = self.events.pop(0)
            if kind == "outage":
                seconds = self.rng.uniform(5, 2 * self.cfg.lock_timeout)
                for r in self.replicas.spawned:
                    r.faults.cut_off(seconds)
                self.ledger.count("outage (all replicas)")
            else:
                victim = self.rng.choice(self.replicas.live())
                victim.faults.cut_off(self.rng.uniform(5, 3 * self.cfg.lock_timeout))
                self.ledger.count("partition (one replica)")


__all__ = ["Network"]
