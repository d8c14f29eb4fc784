"""``python -m orchestrator.demo.chaos``: many replicas, many faults, then the invariants.

A seeded, reproducible run on the in-memory store. Replicas take turns ticking while a
FakeClock, advanced by the harness, stands for time; every replica reaches MongoDB through
``orchestrator.testing.faults``. Injected: replicas dying mid-step, mid-unlock and
mid-advance (a fresh replica replaces each), stale workers (a step stalls past its lease
while another replica takes over), steps that never return (cut off by ``step_timeout``),
transient driver errors, lost replies, slow operations, outages and partitions, clocks off
by up to the lock timeout, handler exceptions of every kind (some while recording the
error), non-outcomes, and malformed documents. Then every invariant is checked; the exit
status is 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pymongo.database import Database
from rich.console import Console
from rich.table import Table

from orchestrator.core.backoff import ExponentialBackoff
from orchestrator.core.errors import StoreError
from orchestrator.core.lease import Outcome
from orchestrator.core.queries import as_utc, bson_time
from orchestrator.core.resource import EPOCH, Resource
from orchestrator.mongo import Lease
from orchestrator.runners._sync.engine import Orchestrator
from orchestrator.testing.clock import FakeClock
from orchestrator.testing.faults import Faults, ReplicaCrashed
from orchestrator.testing.memory import memory_database

SECRET = "hunter2"
"""A password planted in exception messages: it must reach no document and no log line."""

FINAL = ("Ready", "Failed")
MISSING = object()


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


@dataclass
class _Execution:
    number: int
    replica: str
    completed: bool = False
    interrupted: str | None = None


@dataclass
class _Replica:
    name: str
    orch: Orchestrator
    faults: Faults
    skew: float
    alive: bool = True
    busy: bool = False
    broken: str | None = None


@dataclass
class _Hung:
    thread: threading.Thread
    release: threading.Event = field(default_factory=threading.Event)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


HANDLER_EXCEPTIONS: dict[str, Callable[[], BaseException]] = {
    "hostile-message": lambda: RuntimeError(
        f"caf\u00e9 \ud800 {{'$where': 1}} mongodb://admin:{SECRET}@db:27017/app " + "x" * 3000
    ),
    "SystemExit": lambda: SystemExit(3),
    "unprintable": _Unprintable,
    "StoreError": lambda: StoreError("raised by the handler itself", transient=True),
    "ValueError": lambda: ValueError("the cloud API said no"),
    "KeyError": lambda: KeyError("missing"),
    "OSError": lambda: OSError(104, "connection reset by peer"),
    "TimeoutError": lambda: TimeoutError("upstream timed out"),
    "ZeroDivisionError": lambda: ZeroDivisionError("division by zero"),
}

WRITE_ACTIONS = frozenset({"advance", "unlock"})
"""The writes a chaos step ends with: a crash mid-write meets each kind before repeating."""

# Step faults are taken in turn from this cycle (its mix is the weighting), so even a short
# run meets every kind; "exception" takes the next of HANDLER_EXCEPTIONS.
STEP_FAULTS: tuple[str, ...] = (
    "exception",
    "stall",
    "crash-mid-write",
    "hang",
    "exception",
    "fails-while-recording",
    "crash-mid-step",
    "exception",
    "stall",
    "bad-outcome",
    "crash-mid-write",
    "exception",
)


class _CountingHandler(logging.Handler):
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


class Chaos:
    """One run. ``run()`` returns the figures; ``Figures.violations`` lists what failed."""

    def __init__(self, config: ChaosConfig) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.clock = FakeClock()
        self.raw: Database[Any] = memory_database("chaos", clock=self.clock)
        self.replicas: list[_Replica] = []
        self.dead: list[_Replica] = []
        self.lock = threading.RLock()
        self.executions: dict[tuple[str, str], list[_Execution]] = {}
        self.injected: Counter[str] = Counter()
        self.hung: list[_Hung] = []
        self.expected: dict[str, str] = {}  # name -> "work", "doomed", "invalid" or a phase
        self.pending: list[dict[str, Any]] = []
        self.events: list[tuple[float, str]] = []
        self.stale_attempted = 0
        self.submit_retries = 0
        self.stale_landed = 0
        self.unhandled: list[str] = []
        self.silenced = False
        self._spawned = 0
        self._executions = 0
        self._exceptions = 0
        self._step_faults = 0
        self._crashed_writes: set[str] = set()
        self._calm = 0
        self._hangs_left = max(2, config.resources // 40)

    # -- replicas -------------------------------------------------------------------------

    def _spawn(self) -> _Replica:
        self._spawned += 1
        name = f"pod-{self._spawned}"
        skew = self.rng.uniform(-self.cfg.lock_timeout, self.cfg.lock_timeout)
        faults = Faults(
            seed=self.cfg.seed * 1000 + self._spawned,
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
            retry_policy=ExponentialBackoff(cap=120, rng=random.Random(self._spawned)),
        )
        replica = _Replica(name, orch, faults, skew)
        self._register(replica)
        self.replicas.append(replica)
        self.injected["clock skew (replicas)"] += 1 if abs(skew) >= 1 else 0
        return replica

    def _register(self, r: _Replica) -> None:
        orch = r.orch

        @orch.phase(Widget, "Creating")
        def create(lease: Lease[Widget]) -> Any:  # Any: a fault may return garbage
            widget = lease.resource
            if widget.doomed:
                raise RuntimeError("doomed: the provider refuses this widget")
            ready_at = self.clock.now() + timedelta(seconds=widget.ready_after)
            return self._effect(
                r,
                lease,
                ("create", "advance"),
                lambda probe: lease.advance("Waiting", ready_at=bson_time(ready_at), probe=probe),
            )

        @orch.phase(Widget, "Waiting")
        def wait(lease: Lease[Widget]) -> Outcome:
            ready_at = lease.resource.ready_at
            if ready_at is not None and self.clock.now() < as_utc(ready_at):
                return lease.relock()
            return lease.advance("Configuring")

        @orch.phase(Widget, "Configuring")
        def configure(lease: Lease[Widget]) -> Any:
            done, parts = lease.resource.done, lease.resource.parts
            step = f"part-{done}"
            if done + 1 < parts:
                return self._effect(
                    r,
                    lease,
                    (step, "unlock"),
                    lambda probe: lease.unlock(done=done + 1, probe=probe),
                )
            return self._effect(
                r,
                lease,
                (step, "advance"),
                lambda probe: lease.advance("Ready", done=parts, probe=probe),
            )

    def _tick(self, r: _Replica) -> None:
        if not r.alive or r.busy:
            return
        r.busy = True
        try:
            r.orch.run_once()
        except ReplicaCrashed:
            r.faults.kill()
        except BaseException as exc:  # the invariant: nothing escapes a tick
            r.broken = f"{type(exc).__name__}: {exc}"
            self.unhandled.append(f"{r.name}: {r.broken}")
        finally:
            r.busy = False
        if r.faults.dead and r.alive:
            self._bury(r)

    def _bury(self, r: _Replica) -> None:
        """A crashed replica stays dead, its leases left; a new pod replaces it."""
        r.alive = False
        self.dead.append(r)
        r.orch.stop(timeout=0)
        self._spawn()

    # -- steps with side effects ----------------------------------------------------------

    def _effect(
        self,
        r: _Replica,
        lease: Lease[Widget],
        step: tuple[str, str],
        finish: Callable[[str], Outcome],
    ) -> Any:
        """Run a step with a side effect: record it in the ledger, maybe inject a fault,
        then write the outcome (``finish``: ``step[1]`` says which write) tagged with this
        execution's number."""
        key = (lease.resource.name, step[0])
        with self.lock:
            self._executions += 1
            execution = _Execution(self._executions, r.name)
            self.executions.setdefault(key, []).append(execution)
            fault = self._draw_step_fault(step[1])
        probe = f"{r.name}#{execution.number}"
        try:
            result = self._inject(fault, r, lease, probe, step[1], finish)
        except BaseException as exc:
            execution.interrupted = fault or type(exc).__name__
            raise
        if isinstance(result, Outcome):
            execution.completed = True
        else:
            execution.interrupted = fault or "bad-outcome"
        return result

    def _draw_step_fault(self, action: str) -> str | None:
        if self.silenced or self._calm or self.rng.random() >= min(1.0, 5 * self.cfg.rate):
            return None
        kind = STEP_FAULTS[self._step_faults % len(STEP_FAULTS)]
        uncovered = WRITE_ACTIONS - self._crashed_writes
        if kind == "crash-mid-write" and uncovered and action not in uncovered:
            return None  # kept for a step whose write kind has not crashed yet
        self._step_faults += 1
        if kind == "crash-mid-write":
            self._crashed_writes.add(action)
        if kind == "exception":
            kinds = list(HANDLER_EXCEPTIONS)
            kind = kinds[self._exceptions % len(kinds)]
            self._exceptions += 1
        if kind == "hang":
            if self._hangs_left <= 0:
                return None
            self._hangs_left -= 1
        return kind

    def _inject(
        self,
        fault: str | None,
        r: _Replica,
        lease: Lease[Widget],
        probe: str,
        action: str,
        finish: Callable[[str], Outcome],
    ) -> Any:
        if fault is None:
            return finish(probe)
        if fault == "crash-mid-step":
            self._count(fault)
            r.faults.kill()
            raise ReplicaCrashed("the replica died mid-step")
        if fault == "crash-mid-write":
            applied = self.rng.random() < 0.5
            self._count(f"crash-mid-{action} ({'applied' if applied else 'not applied'})")
            r.faults.crash_next("update_one", applied=applied)
            return finish(probe)
        if fault == "stall":
            return self._stall(r, lease, probe, finish)
        if fault == "hang":
            return self._hang(r, lease, probe, finish)
        if fault == "bad-outcome":
            self._count("handler returned a non-outcome")
            return self.rng.choice(["done", 42, {"phase": "Ready"}, lease])
        if fault == "fails-while-recording":
            self._count("exception, then recording it failed")
            r.faults.fail_next("update_one")
            raise RuntimeError("the step failed, and so will recording it")
        self._count(f"handler raised {fault}")
        raise HANDLER_EXCEPTIONS[fault]()

    def _stall(
        self, r: _Replica, lease: Lease[Widget], probe: str, finish: Callable[[str], Outcome]
    ) -> Outcome:
        """The step freezes past its lease; another replica ticks meanwhile (and takes the
        document over); then the frozen step wakes and tries to write its outcome."""
        others = [o for o in self.replicas if o is not r and o.alive and not o.busy]
        if not others:
            return finish(probe)
        self._count("stale worker (stall past the lease)")
        self.clock.advance(self.cfg.lock_timeout + 1)
        takeover = self.rng.choice(others)
        # The takeover itself runs calm, so that it does take the document over.
        self._calm += 1
        try:
            with takeover.faults.quiet():
                self._tick(takeover)
        finally:
            self._calm -= 1
        return self._late_write(lease, probe, finish)

    def _hang(
        self, r: _Replica, lease: Lease[Widget], probe: str, finish: Callable[[str], Outcome]
    ) -> Outcome | None:
        """The step never returns: past ``step_timeout`` the loop's heartbeat (run here on
        its own thread, as the scheduler runs it) takes the lease back. The step wakes at
        the end of the run and tries to write."""
        self._count("step that never returns")
        hung = _Hung(threading.current_thread())
        with self.lock:
            self.hung.append(hung)
        self.clock.advance(2 * self.cfg.lock_timeout + 1)
        heartbeat = threading.Thread(target=r.orch.heartbeat, name=f"{r.name}-heartbeat")
        heartbeat.start()
        heartbeat.join()
        hung.release.wait()
        if r.faults.dead:
            return None  # its process died meanwhile: this thread never wakes to write
        return self._late_write(lease, probe, finish)

    def _late_write(
        self, lease: Lease[Widget], probe: str, finish: Callable[[str], Outcome]
    ) -> Outcome:
        """A write from a holder whose lease may have been superseded: if another replica
        claimed since, the write must not land (checked by the exception and in the db)."""
        doc = self.raw[Widget.collection].find_one({"_id": lease.id}) or {}
        superseded = doc.get("lockToken") != lease.token
        with self.lock:
            self.stale_attempted += superseded
        try:
            outcome = finish(probe)
        finally:
            after = self.raw[Widget.collection].find_one({"_id": lease.id}) or {}
            if superseded and after.get("probe") == probe:
                with self.lock:
                    self.stale_landed += 1
        return outcome

    def _count(self, kind: str) -> None:
        with self.lock:
            self.injected[kind] += 1

    # -- the world ------------------------------------------------------------------------

    def _plan_resources(self) -> None:
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

    def _insert_bad_inputs(self) -> int:
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

    def _submit_due(self, elapsed: float) -> None:
        live = [r for r in self.replicas if r.alive]
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
                self.submit_retries += 1
                return  # the API server retries it next second; submit is idempotent
            except ReplicaCrashed:
                self._bury(r)
                return
            self.pending.pop(0)

    def _plan_network_events(self) -> None:
        """Outages of the whole database and partitions of one replica, at least one each."""
        count = max(1, round(self.cfg.duration * self.cfg.rate / 6))
        for kind in ("outage", "partition"):
            for _ in range(count):
                self.events.append((self.rng.uniform(0, 0.8 * self.cfg.duration), kind))
        self.events.sort()

    def _network_events(self, elapsed: float) -> None:
        while self.events and self.events[0][0] <= elapsed:
            _, kind = self.events.pop(0)
            if kind == "outage":
                seconds = self.rng.uniform(5, 2 * self.cfg.lock_timeout)
                for r in self.replicas:
                    r.faults.cut_off(seconds)
                self.injected["outage (all replicas)"] += 1
            else:
                victim = self.rng.choice([r for r in self.replicas if r.alive])
                victim.faults.cut_off(self.rng.uniform(5, 3 * self.cfg.lock_timeout))
                self.injected["partition (one replica)"] += 1

    def _silence(self) -> None:
        self.silenced = True
        for r in self.replicas:
            r.faults.silence()

    def _settled(self) -> bool:
        left = self.raw[Widget.collection].count_documents(
            {"phase": {"$nin": list(FINAL)}, "name": {"$in": self._workers()}}
        )
        return left == 0

    def _workers(self) -> list[str]:
        return [n for n, e in self.expected.items() if e in ("work", "doomed", "invalid")]

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Figures:
        started = time.monotonic()
        counting = _CountingHandler()
        library = logging.getLogger("orchestrator")
        library.addHandler(counting)
        try:
            figures = self._run(counting)
        finally:
            library.removeHandler(counting)
        figures.wall_seconds = round(time.monotonic() - started, 2)
        return figures

    def _run(self, counting: _CountingHandler) -> Figures:
        for _ in range(self.cfg.replicas):
            self._spawn()
        with self.replicas[0].faults.quiet():
            self.replicas[0].orch.ensure_indexes()
        bad = self._insert_bad_inputs()
        self._plan_resources()
        self._plan_network_events()
        rounds = 0
        while True:
            elapsed = self.clock.monotonic()
            if elapsed < self.cfg.duration or self.events:
                self._network_events(elapsed)
            elif not self.silenced:
                self._silence()
            self._submit_due(elapsed)
            order = [r for r in self.replicas if r.alive]
            self.rng.shuffle(order)
            for r in order:
                self._tick(r)
            rounds += 1
            if self.silenced and not self.pending and self._settled():
                break
            if elapsed > self.cfg.duration + self.cfg.settle:
                break
            self.clock.advance(1.0)
        for hung in self.hung:
            hung.release.set()
        for hung in self.hung:
            # step_timeout shut its pool, so the thread ends with its step; the timeout is
            # only a guard against a bug hanging the run.
            hung.thread.join(timeout=30)
            if hung.thread.is_alive():
                self.unhandled.append(f"{hung.thread.name} did not finish its timed-out step")
        for r in list(self.replicas):
            self._tick(r)  # one more tick each: every loop must still run
        figures = self._check(bad, rounds)
        figures.log_records = dict(sorted(counting.levels.items()))
        figures.credentials_leaked += counting.leaks
        if counting.leaks:
            figures.violations.append(f"{counting.leaks} log record(s) carry a password")
        for r in self.replicas:
            r.orch.stop(timeout=1)
        return figures

    def _check(self, bad: int, rounds: int) -> Figures:
        f = Figures(
            replicas=self.cfg.replicas,
            restarts=len(self.dead),
            resources=self.cfg.resources,
            bad_inputs=bad,
            simulated_seconds=round(self.clock.monotonic(), 1),
            rounds=rounds,
            submit_retries=self.submit_retries,
        )
        network: Counter[str] = Counter()
        for r in self.replicas:  # the dead ones included
            network.update(r.faults.injected)
            f.claims += r.orch.stats().get("claimed", 0)
            f.max_skew = max(f.max_skew, round(abs(r.skew), 1))
        # Scripted faults are the harness's crashes and failed recordings, counted by kind.
        network["operations refused by an outage"] = network.pop("outage", 0)
        faults = Counter(
            {f"network: {k}": v for k, v in network.items() if k not in ("crash", "scripted")}
        )
        faults.update(self.injected)
        f.faults = dict(sorted((k, v) for k, v in faults.items() if v))
        docs = list(self.raw[Widget.collection].find({}))
        by_name: dict[str, list[dict[str, Any]]] = {}
        for doc in docs:
            by_name.setdefault(str(doc.get("name")), []).append(doc)
            if SECRET in repr(doc):
                f.credentials_leaked += 1
        if f.credentials_leaked:
            f.violations.append(f"{f.credentials_leaked} document(s) carry a password")
        for name, expected in self.expected.items():
            found = by_name.get(name, [])
            problem = self._judge(name, expected, found, f)
            if problem:
                f.resources_lost += 1
                f.violations.append(problem)
        for key, runs in self.executions.items():
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
        f.stale_writes_attempted = self.stale_attempted
        f.stale_writes_landed = self.stale_landed
        if self.stale_landed:
            f.violations.append(f"{self.stale_landed} write(s) from stale holders landed")
        live = [r for r in self.replicas if r.alive]
        f.loops_expected = self.cfg.replicas
        f.loops_alive = sum(1 for r in live if r.broken is None)
        if f.loops_alive != f.loops_expected:
            f.violations.append(f"{f.loops_alive} of {f.loops_expected} loops alive")
        f.unhandled_exceptions = len(self.unhandled)
        f.violations.extend(f"exception escaped a tick: {u}" for u in self.unhandled)
        return f

    def _judge(
        self, name: str, expected: str, found: Sequence[dict[str, Any]], f: Figures
    ) -> str | None:
        if len(found) != 1:
            return f"{name}: {len(found)} documents, expected exactly one"
        doc = found[0]
        phase = doc.get("phase")
        if expected in ("work", "doomed", "invalid"):
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
        if str(phase if phase is not None else "(none)") != expected or "lockedBy" in doc:
            return f"{name}: a document no handler matches was touched: {doc}"
        return None


# -- command line ---------------------------------------------------------------------------


def _table(figures: Figures, config: ChaosConfig) -> Table:
    table = Table(title=f"chaos run (seed {config.seed}, fault rate {config.rate:g})")
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right")
    rows: list[tuple[str, Any]] = [
        ("replicas (crashed and replaced)", f"{figures.replicas} ({figures.restarts})"),
        ("resources (+ bad input documents)", f"{figures.resources} (+{figures.bad_inputs})"),
        ("simulated seconds / rounds", f"{figures.simulated_seconds:g} / {figures.rounds}"),
        ("steps with side effects completed", figures.steps),
        ("claims", figures.claims),
        ("submits retried by the API after a store error", figures.submit_retries),
        ("largest clock skew of a replica (s)", figures.max_skew),
    ]
    rows += [(f"  fault: {kind}", count) for kind, count in figures.faults.items()]
    rows += [
        ("faults injected, total", sum(figures.faults.values())),
        ("bad inputs tried", figures.bad_inputs),
        ("resources Ready", figures.ready),
        ("resources Failed as expected", figures.failed_expected),
        ("resources Failed by injected faults", figures.failed_by_faults),
        ("resources lost", figures.resources_lost),
        (
            "stale writes attempted / landed",
            f"{figures.stale_writes_attempted} / {figures.stale_writes_landed}",
        ),
        (
            "steps run twice (of them interrupted by a fault)",
            f"{figures.steps_run_twice} ({figures.steps_run_twice_interrupted})",
        ),
        ("loops alive", f"{figures.loops_alive}/{figures.loops_expected}"),
        ("exceptions escaped a tick", figures.unhandled_exceptions),
        ("passwords in documents or logs", figures.credentials_leaked),
        ("log records", ", ".join(f"{k} {v}" for k, v in figures.log_records.items())),
        ("wall seconds", figures.wall_seconds),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.demo.chaos", description=__doc__.split("\n\n")[0]
    )
    defaults = ChaosConfig()
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--resources", type=int, default=defaults.resources)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration,
        help="simulated seconds of arrivals and faults (a soak run: 86400)",
    )
    parser.add_argument("--rate", type=float, default=defaults.rate, help="base fault rate")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.replicas < 2 or args.resources < 1 or args.duration <= 0:
        parser.error("needs --replicas >= 2, --resources >= 1 and --duration > 0")
    if not 0 <= args.rate <= 0.2:
        parser.error("--rate must be within [0, 0.2]")
    config = ChaosConfig(
        replicas=args.replicas,
        resources=args.resources,
        seed=args.seed,
        duration=args.duration,
        rate=args.rate,
    )
    figures = Chaos(config).run()
    if args.json:
        print(json.dumps({**asdict(figures), "ok": figures.ok}, indent=2, default=str))
    else:
        console = Console()
        console.print(_table(figures, config))
        for violation in figures.violations:
            console.print(f"[red]invariant failed:[/red] {violation}", markup=True)
        console.print("[green]all invariants hold[/green]" if figures.ok else "")
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())
