"""The faults a chaos run injects into steps with a side effect, taken in turn from
``STEP_FAULTS``: handler exceptions of every kind (one carries a password, ``SECRET``),
crashes mid-step and mid-write, stale workers (the clock jumps past the lease while another
replica takes the document over, then the stalled step writes), steps that never return,
failed recordings of an error, and non-outcomes. Every execution goes in the ledger."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import Lease
from orchestrator.core.errors import StoreError
from orchestrator.core.lease_values import Outcome
from orchestrator.demo.chaos.pods import Replica, Replicas, WorldPart
from orchestrator.demo.chaos.workload import Widget, World
from orchestrator.testing.faults import ReplicaCrashed

SECRET = "hunter2"
"""A password planted in exception messages: it must reach no document and no log line."""


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


@dataclass
class _Hung:
    thread: threading.Thread
    release: threading.Event = field(default_factory=threading.Event)


class StepFaults(WorldPart):
    """Runs each step with a side effect (``effect``), with a fault drawn at the base rate
    (x5) while faults are on. A stall and a hang use the other replicas and the clock."""

    def __init__(self, world: World, replicas: Replicas) -> None:
        super().__init__(world, replicas)
        self._lock = threading.Lock()
        self._hung: list[_Hung] = []
        self._drawn = 0
        self._exceptions = 0
        self._crashed_writes: set[str] = set()
        self._calm = 0
        self._hangs_left = max(2, world.config.resources // 40)

    def effect(
        self,
        r: Replica,
        lease: Lease[Widget],
        step: tuple[str, str],
        finish: Callable[[str], Outcome],
    ) -> Any:
        """Run a step with a side effect: record it in the ledger, maybe inject a fault,
        then write the outcome (``finish``: ``step[1]`` says which write) tagged with this
        execution's number."""
        with self._lock:
            execution = self.ledger.execution((lease.resource.name, step[0]), r.name)
            fault = self._draw(step[1])
        probe = f"{r.name}#{execution.number}"
        try:
            result = self._inject(fault, r, lease, probe, step[1], finish=finish)
        except BaseException as exc:
            execution.interrupted = fault or type(exc).__name__
            raise
        if isinstance(result, Outcome):
            execution.completed = True
        else:
            execution.interrupted = fault or "bad-outcome"
        return result

    def wake_hung(self) -> None:
        """At the end of the run, every step that never returned wakes and tries to write."""
        for hung in self._hung:
            # One at a time: two woken together would draw their replica's faults in an
            # order the threads' timing decides, and the same seed would not replay.
            hung.release.set()
            # step_timeout shut its pool, so the thread ends with its step; the timeout is
            # only a guard against a bug hanging the run.
            hung.thread.join(timeout=30)
            if hung.thread.is_alive():
                self.ledger.unhandled.append(
                    f"{hung.thread.name} did not finish its timed-out step"
                )

    def _draw(self, action: str) -> str | None:
        if self.replicas.silenced or self._calm or self.rng.random() >= min(1.0, 5 * self.cfg.rate):
            return None
        kind = STEP_FAULTS[self._drawn % len(STEP_FAULTS)]
        uncovered = WRITE_ACTIONS - self._crashed_writes
        if kind == "crash-mid-write" and uncovered and action not in uncovered:
            return None  # kept for a step whose write kind has not crashed yet
        self._drawn += 1
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
        r: Replica,
        lease: Lease[Widget],
        probe: str,
        action: str,
        *,
        finish: Callable[[str], Outcome],
    ) -> Any:
        if fault is None:
            return finish(probe)
        if fault == "crash-mid-step":
            self.ledger.count(fault)
            r.faults.kill()
            raise ReplicaCrashed("the replica died mid-step")
        if fault == "crash-mid-write":
            applied = self.rng.random() < 0.5
            self.ledger.count(f"crash-mid-{action} ({'applied' if applied else 'not applied'})")
            r.faults.crash_next("update_one", applied=applied)
            return finish(probe)
        if fault == "stall":
            return self._stall(r, lease, probe, finish)
        if fault == "hang":
            return self._hang(r, lease, probe, finish)
        if fault == "bad-outcome":
            self.ledger.count("handler returned a non-outcome")
            return self.rng.choice(["done", 42, {"phase": "Ready"}, lease])
        if fault == "fails-while-recording":
            self.ledger.count("exception, then recording it failed")
            r.faults.fail_next("update_one")
            raise RuntimeError("the step failed, and so will recording it")
        self.ledger.count(f"handler raised {fault}")
        raise HANDLER_EXCEPTIONS[fault]()

    def _stall(
        self, r: Replica, lease: Lease[Widget], probe: str, finish: Callable[[str], Outcome]
    ) -> Outcome:
        """The step freezes past its lease; another replica ticks meanwhile (and takes the
        document over); then the frozen step wakes and tries to write its outcome."""
        others = [o for o in self.replicas.spawned if o is not r and o.alive and not o.busy]
        if not others:
            return finish(probe)
        self.ledger.count("stale worker (stall past the lease)")
        self.clock.advance(self.cfg.lock_timeout + 1)
        takeover = self.rng.choice(others)
        # The takeover itself runs calm, so that it does take the document over.
        self._calm += 1
        try:
            with takeover.faults.quiet():
                self.replicas.tick(takeover)
        finally:
            self._calm -= 1
        return self._late_write(lease, probe, finish)

    def _hang(
        self, r: Replica, lease: Lease[Widget], probe: str, finish: Callable[[str], Outcome]
    ) -> Outcome | None:
        """The step never returns: past ``step_timeout`` the loop's heartbeat (run here on
        its own thread, as the scheduler runs it) takes the lease back. The step wakes at
        the end of the run and tries to write."""
        self.ledger.count("step that never returns")
        hung = _Hung(threading.current_thread())
        with self._lock:
            self._hung.append(hung)
        self.clock.advance(2 * self.cfg.lock_timeout + 1)
        taken_back = r.orch.stats().get("timed_out", 0)
        # Heartbeats at their interval until one takes the step back: a new measurement
        # of the server's clock may put "now" a little before the deadline the jump passed.
        for _ in range(12):
            heartbeat = threading.Thread(target=r.orch.heartbeat, name=f"{r.name}-heartbeat")
            heartbeat.start()
            heartbeat.join()
            if r.faults.dead or r.orch.stats().get("timed_out", 0) > taken_back:
                break
            self.clock.advance(self.cfg.lock_timeout / 6)
        if not r.faults.dead:  # a process that died meanwhile (its heartbeat crashed) takes
            hung.release.wait()  # its hung thread with it: nothing waits for the run's end
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
        if superseded:
            self.ledger.stale_write(landed=False)
        try:
            outcome = finish(probe)
        finally:
            after = self.raw[Widget.collection].find_one({"_id": lease.id}) or {}
            if superseded and after.get("probe") == probe:
                self.ledger.stale_write(landed=True)
        return outcome


__all__ = ["HANDLER_EXCEPTIONS", "SECRET", "STEP_FAULTS", "StepFaults"]
