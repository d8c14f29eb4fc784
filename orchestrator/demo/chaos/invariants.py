"""The invariants of a chaos run, checked once it has settled, and the figures it reports
(``Figures``; ``Figures.violations`` lists every invariant that failed): no resource lost,
a step run again only after a faulted run, no stale write landed, every loop alive with no
exception escaped, and no password in a document (``audit``) or a log record
(``LogCounter``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymongo.database import Database

from orchestrator.demo.chaos.arrivals import WORKERS
from orchestrator.demo.chaos.ledger import Ledger
from orchestrator.demo.chaos.pods import Replicas
from orchestrator.demo.chaos.step_faults import SECRET
from orchestrator.demo.chaos.workload import Widget, World


@dataclass
class Figures:
    replicas: int = 0
    restarts: int = 0
    resources: int = 0
    bad_inputs: int = 0
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    rounds: int = 0
    steps: int = 0
    claims: int = 0
    submit_retries: int = 0
    max_skew: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    ready: int = 0
    failed_expected: int = 0
    failed_by_faults: int = 0
    resources_lost: int = 0
    stale_writes_attempted: int = 0
    stale_writes_landed: int = 0
    steps_run_twice: int = 0
    steps_run_twice_interrupted: int = 0
    loops_alive: int = 0
    loops_expected: int = 0
    unhandled_exceptions: int = 0
    credentials_leaked: int = 0
    log_records: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class LogCounter(logging.Handler):
    """Counts the library's log records by level, and those that carry the secret."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.levels: Counter[str] = Counter()
        self.leaks = 0
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1
        if SECRET in self.format(record):
            self.leaks += 1

    def report(self, f: Figures) -> None:
        """Its figures, and a violation if a record carried the secret."""
        f.log_records = dict(sorted(self.levels.items()))
        f.credentials_leaked += self.leaks
        if self.leaks:
            f.violations.append(f"{self.leaks} log record(s) carry a password")


def audit(
    world: World,
    replicas: Replicas,
    expected: Mapping[str, str],
    *,
    bad_inputs: int,
    rounds: int,
    simulated_seconds: float,
) -> Figures:
    """The figures of the run, every failed invariant among their violations."""
    config, raw, ledger = world.config, world.raw, world.ledger
    f = Figures(
        replicas=config.replicas,
        restarts=len(replicas.dead),
        resources=config.resources,
        bad_inputs=bad_inputs,
        simulated_seconds=round(simulated_seconds, 1),
        rounds=rounds,
        submit_retries=ledger.submit_retries,
    )
    _count_faults(f, ledger, replicas)
    _check_documents(f, raw, expected)
    _check_steps(f, ledger)
    f.stale_writes_attempted = ledger.stale_attempted
    f.stale_writes_landed = ledger.stale_landed
    if ledger.stale_landed:
        f.violations.append(f"{ledger.stale_landed} write(s) from stale holders landed")
    live = replicas.live()
    f.loops_expected = config.replicas
    f.loops_alive = sum(1 for r in live if r.broken is None)
    if f.loops_alive != f.loops_expected:
        f.violations.append(f"{f.loops_alive} of {f.loops_expected} loops alive")
    f.unhandled_exceptions = len(ledger.unhandled)
    f.violations.extend(f"exception escaped a tick: {u}" for u in ledger.unhandled)
    return f


def _count_faults(f: Figures, ledger: Ledger, replicas: Replicas) -> None:
    network: Counter[str] = Counter()
    for r in replicas.spawned:  # the dead ones included
        network.update(r.faults.injected)
        f.claims += r.orch.stats().get("claimed", 0)
        f.max_skew = max(f.max_skew, round(abs(r.skew), 1))
    # Scripted faults are the harness's crashes and failed recordings, counted by kind.
    network["operations refused by an outage"] = network.pop("outage", 0)
    faults = Counter(
        {f"network: {k}": v for k, v in network.items() if k not in ("crash", "scripted")}
    )
    faults.update(ledger.injected)
    f.faults = dict(sorted((k, v) for k, v in faults.items() if v))


def _check_documents(f: Figures, raw: Database[Any], expected: Mapping[str, str]) -> None:
    """No password in a document; each resource ended as expected, exactly once."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for doc in raw[Widget.collection].find({}):
        by_name.setdefault(str(doc.get("name")), []).append(doc)
        if SECRET in repr(doc):
            f.credentials_leaked += 1
    if f.credentials_leaked:
        f.violations.append(f"{f.credentials_leaked} document(s) carry a password")
    for name, outcome in expected.items():
        problem = _judge(name, outcome, by_name.get(name, []), f)
        if problem:
            f.resources_lost += 1
            f.violations.append(problem)


def _judge(name: str, expected: str, found: Sequence[dict[str, Any]], f: Figures) -> str | None:
    if len(found) != 1:
        return f"{name}: {len(found)} documents, expected exactly one"
    doc = found[0]
    phase = doc.get("phase")
    if expected in WORKERS:
        return _judge_worked(name, expected, doc, f)
    if str(phase if phase is not None else "(none)") != expected or "lockedBy" in doc:
        return f"{name}: a document no handler matches was touched: {doc}"
    return None


def _judge_worked(name: str, expected: str, doc: dict[str, Any], f: Figures) -> str | None:
    """A document a handler works on: Ready with every part done, or Failed with its
    error kept (counted as the faults' or as expected)."""
    phase = doc.get("phase")
    if phase == "Ready" and expected == "work":
        if doc.get("done") != doc.get("parts"):
            return f"{name}: Ready with {doc.get('done')} of {doc.get('parts')} parts"
        f.ready += 1
        return None
    if phase == "Failed" and isinstance(doc.get("lastError"), dict):
        if expected == "work":
            f.failed_by_faults += 1
        else:
            f.failed_expected += 1
        return None
    error = doc.get("lastError")
    return f"{name}: ended in {phase!r} (expected {expected}); lastError {error}"


def _check_steps(f: Figures, ledger: Ledger) -> None:
    """A step with a side effect runs again only after a run interrupted by a fault."""
    for key, runs in ledger.executions.items():
        f.steps += sum(e.completed for e in runs)
        finished = [e for e in runs if e.completed]
        if (finished and finished[-1] is not runs[-1]) or len(finished) > 1:
            f.violations.append(f"step {key} ran again after it completed: {runs}")
        if len(runs) > 1:
            f.steps_run_twice += 1
            if all(e.interrupted for e in runs[:-1]):
                f.steps_run_twice_interrupted += 1
            else:
                f.violations.append(f"step {key} ran twice with no fault: {runs}")


__all__ = ["Figures", "LogCounter", "audit"]
