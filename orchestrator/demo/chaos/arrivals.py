"""The documents of a chaos run and what each must end as (``expected``): the resources
the API server submits on schedule (through a live replica; a store error is retried the
next second, as submit is idempotent), doomed ones among them, and malformed documents
written by someone else (lease fields and models no handler can trust)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.core.clock import bson_time
from orchestrator.core.errors import StoreError
from orchestrator.core.resource import EPOCH
from orchestrator.demo.chaos.pods import Replicas, WorldPart
from orchestrator.demo.chaos.workload import FINAL, Widget, World
from orchestrator.testing.faults import ReplicaCrashed

MISSING = object()

WORKERS = ("work", "doomed", "invalid")
"""What a handler must settle: Ready, or Failed as expected ("doomed", "invalid"); any
other expectation is the phase of a document no handler matches, left untouched."""


class Arrivals(WorldPart):
    """Planned up front from the run's random source, so one seed gives the same arrivals."""

    def __init__(self, world: World, replicas: Replicas) -> None:
        super().__init__(world, replicas)
        self.expected: dict[str, str] = {}  # name -> one of WORKERS, or a phase
        self.pending: list[dict[str, Any]] = []
        """The resources still to submit, in order of arrival."""

    def plan(self) -> None:
        window = 0.8 * self.cfg.duration
        for n in range(self.cfg.resources):
            doomed = self.rng.random() < 0.05
            self.pending.append(
                {
                    "at": self.rng.uniform(0, window),
                    "name": f"widget-{n:05d}",
                    "parts": self.rng.randint(1, 4),
                    "ready_after": self.rng.choice([0.0, 0.0, 5.0, 40.0, 200.0]),
                    "doomed": doomed,
                }
            )
            self.expected[f"widget-{n:05d}"] = "doomed" if doomed else "work"
        self.pending.sort(key=lambda p: p["at"])

    def insert_bad_inputs(self) -> int:
        """Documents written by someone else: malformed lease fields and models."""
        now = bson_time(self.clock.now())
        base = {"phase": "Creating", "parts": 2, "readyAfter": 0.0, "lockedAt": EPOCH}
        base |= {"attempts": 0, "relocks": 0, "createdAt": now, "updatedAt": now}
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("no-lockedAt", {"lockedAt": MISSING}, "work"),
            ("null-lockedAt", {"lockedAt": None}, "work"),
            ("string-lockedAt", {"lockedAt": "yesterday"}, "work"),
            ("number-lockedAt", {"lockedAt": 0}, "work"),
            ("far-future-lockedAt", {"lockedAt": datetime(2100, 1, 1)}, "work"),
            ("no-updatedAt", {"updatedAt": MISSING, "createdAt": MISSING}, "work"),
            ("corrupt-counters", {"attempts": -3, "relocks": "many"}, "invalid"),
            ("wrong-type-field", {"parts": "many"}, "invalid"),
            ("garbage-lastError", {"lastError": "boom"}, "invalid"),
            ("unicode-\u540d\u524d-\U0001f680", {}, "work"),
            ("unknown-phase", {"phase": "Bogus"}, "Bogus"),
            ("no-phase", {"phase": MISSING}, "(none)"),
            ("phase-not-a-string", {"phase": 7}, "7"),
        ]
        for name, changes, expected in cases:
            doc = {**base, "name": name}
            for key, value in changes.items():
                if value is MISSING:
                    doc.pop(key, None)
                else:
                    doc[key] = value
            self.raw[Widget.collection].insert_one(doc)
            self.expected[name] = expected
        return len(cases)

    def submit_due(self, elapsed: float) -> None:
        """Every resource due by ``elapsed`` simulated seconds, each by a live replica."""
        live = self.replicas.live()
        while self.pending and self.pending[0]["at"] <= elapsed:
            spec = self.pending[0]
            r = self.rng.choice(live)
            try:
                r.orch.submit(
                    Widget,
                    Widget(
                        name=spec["name"],
                        phase="Creating",
                        parts=spec["parts"],
                        ready_after=spec["ready_after"],
                        doomed=spec["doomed"],
                    ),
                    unique="name",
                )
            except StoreError:
                self.ledger.submit_retries += 1
                return  # the API server retries it next second; submit is idempotent
            except ReplicaCrashed:
                self.replicas.bury(r)
                return
            self.pending.pop(0)

    def settled(self) -> bool:
        """Every document a handler must settle is Ready or Failed."""
        workers = [n for n, e in self.expected.items() if e in WORKERS]
        left = self.raw[Widget.collection].count_documents(
            {"phase": {"$nin": list(FINAL)}, "name": {"$in": workers}}
        )
        return left == 0


__all__ = ["WORKERS", "Arrivals"]
