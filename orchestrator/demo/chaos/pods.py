"""The replicas of a chaos run, as pods: each an Orchestrator reaching the database through
its own ``Faults`` (network faults, crashes), on a clock skewed by up to the lock timeout,
running one step at a time. Ticked in turns; nothing may escape a tick. A crashed replica
stays dead, its leases left, and a fresh pod replaces it."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator import Orchestrator
from orchestrator.core.backoff import ExponentialBackoff
from orchestrator.demo.chaos.workload import World
from orchestrator.testing.faults import Faults, ReplicaCrashed


@dataclass
class Replica:
    name: str
    orch: Orchestrator
    faults: Faults
    skew: float
    alive: bool = True
    busy: bool = False
    broken: str | None = None
    """Why its loop broke: an exception escaped a tick."""


class Replicas:
    """Every pod spawned (``spawned``, the dead included); ``register`` gives a new one its
    handlers."""

    def __init__(
        self,
        world: World,
        register: Callable[[Replica], None],
    ) -> None:
        self.cfg = world.config
        self.rng = world.rng
        self.clock = world.clock
        self.raw = world.raw
        self.ledger = world.ledger
        self.register = register
        self.spawned: list[Replica] = []
        self.dead: list[Replica] = []
        self.silenced = False
        """Faults off (the settling after ``duration``), for the replicas to come too."""

    def live(self) -> list[Replica]:
        return [r for r in self.spawned if r.alive]

    def spawn(self) -> Replica:
        number = len(self.spawned) + 1
        name = f"pod-{number}"
        skew = self.rng.uniform(-self.cfg.lock_timeout, self.cfg.lock_timeout)
        faults = Faults(
            seed=self.cfg.seed * 1000 + number,
            rate=self.cfg.rate,
            lost_reply=self.cfg.rate / 2,
            slow=self.cfg.rate,
            slow_seconds=self.cfg.lock_timeout / 2,
            delay=self.clock.advance,
            clock=self.clock,
        )
        if self.silenced:
            faults.silence()
        orch = Orchestrator(
            faults.wrap(self.raw),
            clock=self.clock.skewed(skew),
            replica_id=name,
            lock_timeout=self.cfg.lock_timeout,
            tick=1.0,
            max_concurrency=1,  # one step at a time: the run is reproducible
            heartbeat=False,  # a stalled step models a frozen process: no heartbeat either
            step_timeout=2 * self.cfg.lock_timeout,
            max_attempts=5,
            retry_policy=ExponentialBackoff(cap=120, rng=random.Random(number)),
        )
        replica = Replica(name, orch, faults, skew)
        self.register(replica)
        self.spawned.append(replica)
        if abs(skew) >= 1:
            self.ledger.count("clock skew (replicas)")
        return replica

    def tick(self, r: Replica) -> None:
        if not r.alive or r.busy:
            return
        r.busy = True
        try:
            r.orch.run_once(heartbeat=False)  # a hang's heartbeat is the run's to call
        except ReplicaCrashed:
            r.faults.kill()
        except BaseException as exc:  # the invariant: nothing escapes a tick
            r.broken = f"{type(exc).__name__}: {exc}"
            self.ledger.unhandled.append(f"{r.name}: {r.broken}")
        finally:
            r.busy = False
        if r.faults.dead and r.alive:
            self.bury(r)

    def bury(self, r: Replica) -> None:
        """A crashed replica stays dead, its leases left; a new pod replaces it."""
        r.alive = False
        self.dead.append(r)
        r.orch.stop(timeout=0)
        self.spawn()

    def silence(self) -> None:
        self.silenced = True
        for r in self.spawned:
            r.faults.silence()


class WorldPart:
    """A part of the run that acts on the world beside the replicas (the arrivals, the
    step faults): the world's settings, random source, clock, raw database and ledger, at
    hand under short names."""

    def __init__(self, world: World, replicas: Replicas) -> None:
        self.cfg = world.config
        self.rng = world.rng
        self.clock = world.clock
        self.raw = world.raw
        self.ledger = world.ledger
        self.replicas = replicas


__all__ = ["Replica", "Replicas", "WorldPart"]
