"""The threaded runner: ``Orchestrator``, for sync applications and blocking handlers.

Each replica has up to ``max_concurrency`` worker threads. A free worker asks the scheduler
for an action and carries it out (a probe, or a claim and then the step, inline: no hand-off
to another thread), by driving the shared plans of ``orchestrator.runners.base`` with sync
calls. Ticks and heartbeats come from APScheduler's ``BackgroundScheduler``.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from pymongo.database import Database

from orchestrator.core.errors import ConfigError
from orchestrator.core.registry import Target
from orchestrator.core.resource import Resource
from orchestrator.mongo import Lease, Store
from orchestrator.mongo._sync.clock import measure
from orchestrator.mongo.common import Document
from orchestrator.runners.base import (
    TIMER_DEFAULTS,
    Runner,
    Step,
    StepTimeout,
    StopReport,
    drive,
    logger,
)

__all__ = ["Orchestrator", "StepTimeout", "StopReport"]


class Orchestrator(Runner[Database[Document]]):
    """Register handlers with ``phase``/``when``, then ``start()`` in every replica.

    ``db`` is a pymongo ``Database`` (or ``orchestrator.testing.memory_database()``).
    Settings come as keyword options (``lock_timeout=30, tick=1.0, ...``) or as a built
    ``Settings``; ``clock`` is this replica's local clock (tests pass a ``FakeClock``).
    """

    _engine = "threaded"
    _database_help = (
        "a sync Database (pymongo's MongoClient, or orchestrator.testing.memory_database())"
    )
    _store_type = Store
    _lease_type = Lease
    _measure = staticmethod(measure)

    def _notify(self, *, more_work: bool, everyone: bool = False) -> None:
        """Wake one more worker when there may be work for it (it wakes the next in turn
        if it finds some), and the waiters of run_once and stop when the replica may have
        settled. Waking every thread at every step cost a context switch each under the GIL."""
        if everyone:
            self._cv.notify_all()
            self._settled.notify_all()
            return
        if more_work:
            self._cv.notify()
        if self._settling():
            self._cv.notify_all()  # idle workers of run_once leave when quiet
            self._settled.notify_all()

    def _check_handler(self, func: Callable[..., Any]) -> None:
        if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigError(
                f"{getattr(func, '__qualname__', func)!s} is async; the threaded Orchestrator "
                "runs plain functions (AsyncOrchestrator awaits async ones)"
            )

    # -- documents ------------------------------------------------------------------------

    def submit(
        self,
        target: Target,
        doc: Mapping[str, Any] | Resource,
        *,
        unique: str | Iterable[str] | None = None,
    ) -> Document:
        """Create a document in its first phase, unlocked; with ``unique`` keys, idempotent:
        concurrent submits of one key create one document and all return it.

        ``unique`` defaults to the keys the model declares (``Resource.unique``; for a
        collection name, those of the model registered on it), else to ``_id`` when the
        document has one.
        """
        return drive(self._submit(target, doc, unique))

    def ensure_indexes(self) -> None:
        """The claim index on every registered collection, and the unique keys of submit."""
        drive(self._ensure_indexes())

    def measure_clock(self) -> None:
        """Measure the server's clock if a measurement is due (workers do before each
        action, and the heartbeat); with no estimate yet a failure raises ``StoreError``."""
        drive(self._measure_if_due())

    # -- the loop -------------------------------------------------------------------------

    def run_once(self) -> dict[str, int]:
        """One tick, synchronously: claim and run steps until no handler finds work and
        every step started has finished. Returns the outcome counts of this tick."""
        before = self._begin_once()
        self._wait_until(self._once_over)
        return self._end_once(before)

    def _spawn_worker(self) -> None:
        threading.Thread(
            target=self._work, name=f"orchestrator-{self.replica_id}", daemon=True
        ).start()

    def _work(self) -> None:
        """A worker: take actions until there are none and the replica is not serving."""
        while True:
            with self._lock:
                action = self._sched.next()
                while action is None:
                    if self._worker_exit():
                        return
                    self._cv.wait()
                    action = self._sched.next()
            try:
                if not drive(self._act(action)):
                    return  # its step was taken back by step_timeout; a new worker replaced it
            except BaseException as exc:  # not a StoreError: a bug, or the process dying
                self._worker_failed(exc)
                return

    def _run_step(self, step: Step, stopping: bool) -> str:
        try:
            return drive(self._step(step, stopping))
        except BaseException:
            return self._interrupted(step)

    def _call_handler(self, step: Step) -> Any:
        return step.lease.handler.func(step.lease)

    def _all_at_once(self, calls: list[Callable[[], Any]]) -> list[Any]:
        """Each call on a thread of its own (one here), all waited for."""
        if len(calls) == 1:
            return [_outcome_of(calls[0])]
        with ThreadPoolExecutor(len(calls), f"orchestrator-{self.replica_id}-beat") as pool:
            return list(pool.map(_outcome_of, calls))

    def _abandon(self, step: Step) -> None:
        # Its worker thread is stuck in the step: a fresh worker takes its place.
        self._workers -= 1
        self._top_up_workers()

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()``, keeping long steps' leases alive meanwhile: a heartbeat
        every interval, not at every wake-up (a test's own heartbeat calls stay its own)."""
        interval = min(self.settings.tick, self.settings.lock_timeout / 6)
        beat = time.monotonic() + interval
        while True:
            with self._cv:
                if ready():
                    return
                self._settled.wait(max(beat - time.monotonic(), 0.0))
                if ready():
                    return
            if time.monotonic() >= beat:
                self._safe_heartbeat()  # an error here must not leave run_once half-finished
                beat = time.monotonic() + interval

    # -- long steps -----------------------------------------------------------------------

    def heartbeat(self) -> int:
        """Extend the leases of steps running past half the lock timeout, take back those
        past ``step_timeout``, and refresh this replica's record while it is started. The
        loop calls this on its own; returns leases extended."""
        return drive(self._heartbeat())

    def _safe_heartbeat(self) -> None:
        try:
            self.heartbeat()
        except Exception:
            logger.exception("heartbeat failed", extra={**self._log_base, "outcome": "error"})

    # -- running in the background --------------------------------------------------------

    def start(self) -> None:
        """Create indexes, then keep claiming in the background: at once whenever a worker is
        free and work is due, and every ``tick`` seconds for due relocks and expired leases."""
        self._refuse_restart()
        self.ensure_indexes()
        measure(self.clock, self._store)  # raises if the server's clock cannot be read
        drive(self._begin_record())
        self._serve(BackgroundScheduler(timezone=UTC, job_defaults=TIMER_DEFAULTS))

    def _background_tick(self) -> None:
        with self._cv:
            self._tick()

    def stop(self, timeout: float = 10.0) -> StopReport:
        """Stop claiming, wait up to ``timeout`` seconds for running steps, hand back leases
        claimed but not started, and report what was still running."""
        self._stop_serving()
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._sched.busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._settled.wait(remaining)
        drive(self._forget_replica())
        return self._stop_report()


def _outcome_of(call: Callable[[], Any]) -> Any:
    """What ``call`` returned, or the exception it raised."""
    try:
        return call()
    except Exception as exc:
        return exc
