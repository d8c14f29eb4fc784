"""The workload of a chaos run: its size and fault rate (``ChaosConfig``), and the Widget
every replica works on, in three phases: Creating and Configuring (steps with a side
effect, each run through ``effect``, where step faults strike) and Waiting (relocks until
the widget is ready)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pymongo.database import Database

from orchestrator import Lease, Orchestrator
from orchestrator.core.clock import Clock, as_utc, bson_time
from orchestrator.core.lease_values import Outcome
from orchestrator.core.resource import Resource
from orchestrator.demo.chaos.ledger import Ledger
from orchestrator.testing.clock import FakeClock

FINAL = ("Ready", "Failed")


class Widget(Resource):
    """The workload: create, wait until ready (relocks), then configure ``parts`` parts."""

    collection: ClassVar[str] = "widgets"
    unique: ClassVar[tuple[str, ...]] = ("name",)

    name: str
    parts: int = 1
    ready_after: float = 0.0
    ready_at: datetime | None = None
    doomed: bool = False
    done: int = 0


@dataclass(frozen=True)
class ChaosConfig:
    replicas: int = 4
    resources: int = 200
    seed: int = 1
    duration: float = 600.0
    """Simulated seconds during which resources arrive and faults are injected."""
    rate: float = 0.02
    """Base fault rate: per database operation, and (x5) per step."""
    lock_timeout: float = 30.0
    settle: float = 3600.0
    """Simulated seconds allowed after ``duration`` for the work to finish, faults off."""


Effect = Callable[[Lease[Widget], tuple[str, str], Callable[[str], Outcome]], Any]
"""Runs a step with a side effect on one replica: its lease, the step's name and the write
it ends with (``advance`` or ``unlock``), and that write, given the execution's probe. Any:
a fault may return garbage."""


@dataclass(frozen=True)
class World:
    """What every part of one run shares: its configuration, its random source (one seed
    gives one run), its fake clock, its database and its ledger."""

    config: ChaosConfig
    rng: random.Random
    clock: FakeClock
    raw: Database[Any]
    ledger: Ledger


def register_workflow(orch: Orchestrator, clock: Clock, effect: Effect) -> None:
    """The Widget's three phases, on one replica."""

    @orch.phase(Widget, "Creating")
    def create(lease: Lease[Widget]) -> Any:  # Any: a fault may return garbage
        widget = lease.resource
        if widget.doomed:
            raise RuntimeError("doomed: the provider refuses this widget")
        ready_at = clock.now() + timedelta(seconds=widget.ready_after)
        return effect(
            lease,
            ("create", "advance"),
            lambda probe: lease.advance("Waiting", ready_at=bson_time(ready_at), probe=probe),
        )

    @orch.phase(Widget, "Waiting")
    def wait(lease: Lease[Widget]) -> Outcome:
        ready_at = lease.resource.ready_at
        if ready_at is not None and clock.now() < as_utc(ready_at):
            return lease.relock()
        return lease.advance("Configuring")

    @orch.phase(Widget, "Configuring")
    def configure(lease: Lease[Widget]) -> Any:
        done, parts = lease.resource.done, lease.resource.parts
        step = f"part-{done}"
        if done + 1 < parts:
            return effect(
                lease, (step, "unlock"), lambda probe: lease.unlock(done=done + 1, probe=probe)
            )
        return effect(
            lease,
            (step, "advance"),
            lambda probe: lease.advance("Ready", done=parts, probe=probe),
        )


__all__ = ["FINAL", "ChaosConfig", "Effect", "Widget", "register_workflow"]
