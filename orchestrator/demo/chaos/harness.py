"""One chaos run (``Chaos``): the replicas, the faults and the documents around them, one
seeded random source and one FakeClock for all, and the loop that ticks the replicas in
turns, a simulated second a round, until the work has settled; then the audit."""

from __future__ import annotations

import logging
import random
import time
from functools import partial
from typing import Any

from pymongo.database import Database

from orchestrator.demo.chaos.arrivals import Arrivals
from orchestrator.demo.chaos.invariants import Figures, LogCounter, audit
from orchestrator.demo.chaos.ledger import Ledger
from orchestrator.demo.chaos.network import Network
from orchestrator.demo.chaos.pods import Replica, Replicas
from orchestrator.demo.chaos.step_faults import StepFaults
from orchestrator.demo.chaos.workload import ChaosConfig, World, register_workflow
from orchestrator.testing.clock import FakeClock
from orchestrator.testing.memory import memory_database


class Chaos:
    """One run. ``run()`` returns the figures; ``Figures.violations`` lists what failed."""

    def __init__(self, config: ChaosConfig) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.clock = FakeClock()
        self.raw: Database[Any] = memory_database("chaos", clock=self.clock)
        self.ledger = Ledger()
        self.world = World(config, self.rng, self.clock, self.raw, self.ledger)
        self.replicas = Replicas(self.world, register=self._register)
        self.step_faults = StepFaults(self.world, self.replicas)
        self.network = Network(config, self.rng, self.replicas, self.ledger)
        self.arrivals = Arrivals(self.world, self.replicas)

    def _register(self, replica: Replica) -> None:
        register_workflow(replica.orch, self.clock, partial(self.step_faults.effect, replica))

    def run(self) -> Figures:
        started = time.monotonic()
        counting = LogCounter()
        library = logging.getLogger("orchestrator")
        library.addHandler(counting)
        try:
            figures = self._run(counting)
        finally:
            library.removeHandler(counting)
        figures.wall_seconds = round(time.monotonic() - started, 2)
        return figures

    def _run(self, counting: LogCounter) -> Figures:
        for _ in range(self.cfg.replicas):
            self.replicas.spawn()
        first = self.replicas.spawned[0]
        with first.faults.quiet():
            first.orch.ensure_indexes()
        bad = self.arrivals.insert_bad_inputs()
        self.arrivals.plan()
        self.network.plan()
        rounds = 0
        while True:
            elapsed = self.clock.monotonic()
            if elapsed < self.cfg.duration or self.network.events:
                self.network.strike(elapsed)
            elif not self.replicas.silenced:
                self.replicas.silence()
            self.arrivals.submit_due(elapsed)
            order = self.replicas.live()
            self.rng.shuffle(order)
            for r in order:
                self.replicas.tick(r)
            rounds += 1
            if self.replicas.silenced and not self.arrivals.pending and self.arrivals.settled():
                break
            if elapsed > self.cfg.duration + self.cfg.settle:
                break
            self.clock.advance(1.0)
        self.step_faults.wake_hung()
        for r in list(self.replicas.spawned):
            self.replicas.tick(r)  # one more tick each: every loop must still run
        figures = audit(
            self.world,
            self.replicas,
            self.arrivals.expected,
            bad_inputs=bad,
            rounds=rounds,
            simulated_seconds=self.clock.monotonic(),
        )
        counting.report(figures)
        for r in self.replicas.spawned:
            r.orch.stop(timeout=1)
        return figures


__all__ = ["Chaos"]
