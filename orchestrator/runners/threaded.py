"""The public Orchestrator: a registry of phase handlers and the loop that drives them.

Each replica runs the same loop. A tick claims documents (one atomic find-and-modify
each), runs their steps on a bounded pool, and keeps claiming while there is work and
capacity, so a step that unlocks is followed by the next one at once, not a tick later.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from apscheduler.schedulers.background import BackgroundScheduler
from pydantic import BaseModel, ValidationError
from pymongo.database import Database

from orchestrator.core import queries, scheduler
from orchestrator.core.clock import Clock, ServerClock, SystemClock
from orchestrator.core.errors import ConfigError, LeaseLost, OrchestratorError, StoreError
from orchestrator.core.redact import RedactingFilter
from orchestrator.core.registry import Handler, Registry, Target, options, resolve
from orchestrator.core.resource import Resource
from orchestrator.core.scheduler import Claim, Probe, Scheduler
from orchestrator.core.settings import Settings
from orchestrator.mongo import Store
from orchestrator.mongo.common import Document
from orchestrator.mongo.lease import Lease, Outcome

logger = logging.getLogger("orchestrator")
logger.addFilter(RedactingFilter())

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Step:
    lease: Lease[Any]
    abandoned: bool = False


@dataclass(frozen=True)
class StopReport:
    """What ``stop`` left behind: leases handed back unstarted, steps still running."""

    released: list[str] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)


class StepTimeout(OrchestratorError):
    """A step ran past ``step_timeout``: its lease was taken back and the attempt counted."""


class Orchestrator:
    """Register handlers with ``phase``/``when``, then ``start()`` in every replica.

    ``db`` is a pymongo ``Database`` (or ``orchestrator.testing.memory_database()``).
    Settings come as keyword options (``lock_timeout=30, tick=1.0, ...``) or as a built
    ``Settings``; ``clock`` is this replica's local clock (tests pass a ``FakeClock``).
    """

    def __init__(
        self,
        db: Database[Document],
        settings: Settings | None = None,
        *,
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and options:
            raise ConfigError("pass either a Settings object or keyword settings, not both")
        self.settings = settings if settings is not None else Settings.build(**options)
        self._store = Store(db, self.settings.write_concern, self.settings.write_timeout)
        self._local = clock if clock is not None else SystemClock()
        self.clock = ServerClock(
            self._local,
            self._store.server_time,
            self.settings.clock_refresh,
            self.settings.skew_tolerance,
            on_fallback=self._clock_fallback,
        )
        self._registry = Registry(self.settings)
        lock = threading.RLock()
        self._cv = threading.Condition(lock)  # workers wait here for an action
        self._settled = threading.Condition(lock)  # run_once and stop wait here
        self._sched = Scheduler(
            [],
            max_concurrency=self.settings.max_concurrency,
            budget=self.settings.max_unlocks_per_tick,
        )
        self._running: dict[str, _Step] = {}
        self._workers = 0  # worker threads that will take another action
        self._serving = False  # workers stay for the next tick (start() until stop())
        self._stats: Counter[str] = Counter()
        self._released_on_stop: list[str] = []
        self._timer: Any = None  # the APScheduler of ticks and heartbeats, while started
        self._in_step = threading.local()
        self._errors: list[BaseException] = []  # what workers met during run_once
        self._log_base = {"replica": self.settings.replica_id}

    @property
    def replica_id(self) -> str:
        return self.settings.replica_id

    @property
    def handlers(self) -> list[Handler]:
        return list(self._registry.handlers)

    # -- registration ---------------------------------------------------------------------

    def phase(self, target: Target, phase: str, **opts: Any) -> Callable[[F], F]:
        """Register the decorated function for documents of ``target`` in ``phase``.

        Options: ``max_attempts``, ``failed_phase``, ``relock_policy``, ``retry_policy``.
        """
        if not isinstance(phase, str) or not phase or phase.startswith("$"):
            raise ConfigError(f"phase must be a non-empty name, not {phase!r}")
        return self._decorator(target, {"phase": phase}, phase, opts)

    def when(self, target: Target, match: Mapping[str, Any], **opts: Any) -> Callable[[F], F]:
        """Register the decorated function for documents of ``target`` matching a filter,
        e.g. a desired ``state`` that differs from the observed ``phase``."""
        phase = match.get("phase") if isinstance(match, Mapping) else None
        return self._decorator(target, match, phase if isinstance(phase, str) else None, opts)

    def _decorator(
        self, target: Target, match: Mapping[str, Any], phase: str | None, opts: dict[str, Any]
    ) -> Callable[[F], F]:
        resolve(target)
        handler_options = options(opts)

        def decorate(func: F) -> F:
            self._registry.add(func, target, match, phase, handler_options)
            with self._cv:
                self._sched.register(self._registry.handlers)
            return func

        return decorate

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
        collection, model = resolve(target)
        fields = self._document_fields(doc, model)
        phase = fields.get("phase")
        if not isinstance(phase, str) or not phase or phase.startswith("$"):
            raise ConfigError("submit: the document needs a 'phase' (a non-empty string)")
        queries.check_fields(
            {k: v for k, v in fields.items() if k not in {"_id", "phase", "updatedAt"}}
        )
        keys: tuple[str, ...]
        declared = model or self._registry.model_for(collection)
        if unique is None and declared is not None and declared.unique:
            # The model's identity is the default: a second submit of one key returns the first.
            keys = tuple(declared.field_name(k) for k in declared.unique)
            self._registry.add_unique(collection, keys)
        elif unique is None:
            keys = ("_id",) if "_id" in fields else ()
        else:
            raw = (unique,) if isinstance(unique, str) else tuple(unique)
            keys = tuple(model.field_name(k) if model else k for k in raw)
            if not keys:
                raise ConfigError("submit: unique names no field")
            self._registry.add_unique(collection, keys)
        stored = self._store.insert(
            collection, queries.new_document(fields, self.clock.now()), keys
        )
        with self._cv:  # idle workers look again at once, not at the next tick
            self._sched.wake()
            self._cv.notify_all()
        return stored

    @staticmethod
    def _document_fields(
        doc: Mapping[str, Any] | Resource, model: type[Resource] | None
    ) -> dict[str, Any]:
        if isinstance(doc, BaseModel):
            return doc.model_dump(by_alias=True, exclude_unset=True)
        if not isinstance(doc, Mapping):
            raise ConfigError(f"submit: a document is a dict or a Resource, not {type(doc)}")
        if model is None:
            return dict(doc)
        try:
            return model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True)
        except ValidationError as exc:
            raise ConfigError(f"submit: invalid {model.__name__}: {exc}") from exc

    def ensure_indexes(self) -> None:
        """The claim index on every registered collection, and the unique keys of submit."""
        for collection in self._registry.collections:
            self._store.ensure_claim_index(collection)
        for collection, key_sets in self._registry.unique.items():
            for keys in key_sets:
                self._store.ensure_unique(collection, keys)

    # -- the loop -------------------------------------------------------------------------
    #
    # Each replica has up to max_concurrency worker threads. A free worker asks the
    # scheduler for an action, carries it out (a probe, or a claim and then the step,
    # inline: no hand-off to another thread) and reports back. The scheduler decides;
    # the workers only do I/O and wait.

    def run_once(self) -> dict[str, int]:
        """One tick, synchronously: claim and run steps until no handler finds work and
        every step started has finished. Returns the outcome counts of this tick."""
        if getattr(self._in_step, "active", False):
            raise OrchestratorError(
                "run_once() called from inside a step: it would wait for that step to end"
            )
        before = self.stats()
        with self._cv:
            self._errors.clear()
            self._tick()
        # Over when quiet, or when every worker failed (their errors are raised here).
        self._wait_until(lambda: self._sched.quiet or not self._workers)
        with self._cv:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]
        after = self.stats()
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    def _tick(self) -> None:
        """A new tick (the caller holds the lock): fresh budgets, and workers to use them."""
        self._stats["ticks"] += 1
        self._sched.tick()
        self._top_up_workers()

    def _work(self) -> None:
        """A worker: take actions until there are none and the replica is not serving."""
        while True:
            with self._cv:
                action = self._sched.next()
                while action is None:
                    if not self._serving and self._sched.quiet:
                        self._workers -= 1
                        self._settled.notify_all()
                        return
                    self._cv.wait()
                    action = self._sched.next()
            try:
                if isinstance(action, Probe):
                    self._probe(action)
                elif not self._claim_and_run(action):
                    return  # its step was taken back by step_timeout; a new worker replaced it
            except BaseException as exc:  # not a StoreError: a bug, or the process dying
                with self._cv:
                    self._workers -= 1  # the next tick puts a fresh worker in its place
                    self._stats["tick_failures"] += 1
                    self._errors.append(exc)
                    self._changed(more_work=True)
                logger.error(
                    "a worker failed; the next tick replaces it",
                    exc_info=exc,
                    extra={**self._log_base, "outcome": "tick-failed"},
                )
                return

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()``, keeping long steps' leases alive meanwhile."""
        interval = min(self.settings.tick, self.settings.lock_timeout / 6)
        while True:
            with self._cv:
                if ready():
                    return
                self._settled.wait(interval)
                if ready():
                    return
            self._safe_heartbeat()  # an error here must not leave run_once half-finished

    def _probe(self, probe: Probe) -> None:
        found: bool | None = None  # on a StoreError the claims meet it too and report it
        try:
            found = self._store.has_claimable(
                probe.collection,
                [(h.match, h.name) for h in probe.handlers],
                self._judgement_time(),
                self.settings.horizon,
            )
        except StoreError:
            pass
        finally:
            with self._cv:
                self._sched.probed(probe, found)
                self._changed(more_work=found is not False)

    def _judgement_time(self) -> datetime:
        """When leases are judged: the server's time, less what this estimate may be off by
        (nothing while the server reports its time), so no skew steals a live lease."""
        return self.clock.now() - timedelta(seconds=self.clock.uncertainty)

    def _claim_and_run(self, claim: Claim) -> bool:
        try:
            lease = self._claim(claim.handler)
        except BaseException:
            with self._cv:
                self._sched.claimed(claim, None)
            raise
        with self._cv:
            throttled = self._sched.claimed(claim, None if lease is None else str(lease.id))
            if lease is not None:
                lease.throttled = throttled
                step = _Step(lease)
                self._running[lease.token] = step
                stopping = self._sched.stopping
            self._changed(more_work=lease is not None)
        if lease is None:
            return True
        self._in_step.active = True
        outcome = "interrupted"
        try:
            if stopping:
                outcome = self._release_unstarted(lease)
            elif lease.expired(self.clock.now()):
                # It waited longer than its lease lasted: another replica may run the step
                # now. Hand it back (fenced: a no-op if it was taken) rather than run it.
                outcome = self._hand_back(lease, "its lease expired before it started")
            else:
                outcome = self._execute(lease)
        except BaseException:
            # SystemExit and the like from a handler: the lease is left to expire, so
            # another replica takes the step over; this worker carries on.
            self._log(
                logging.CRITICAL,
                "step interrupted; lease left to expire",
                lease,
                "interrupted",
                exc_info=True,
            )
        finally:
            self._in_step.active = False
        with self._cv:
            self._stats[outcome] += 1
            if step.abandoned:
                return False
            del self._running[lease.token]
            self._sched.finished(outcome)
            self._changed(more_work=False)  # this worker takes the next action itself
        return True

    def _changed(self, *, more_work: bool) -> None:
        """Wake whom a change concerns (the caller holds the lock): one more worker when
        there may be work for it (it wakes the next in turn if it finds some), and the
        waiters of run_once and stop when the replica may have settled. Waking every
        thread at every step cost a context switch each under the GIL."""
        if more_work:
            self._cv.notify()
        if self._sched.quiet or not self._sched.busy or not self._workers:
            self._cv.notify_all()  # idle workers of run_once leave when quiet
            self._settled.notify_all()

    def _claim(self, handler: Handler) -> Lease[Any] | None:
        token = secrets.token_hex(8)
        try:
            now = self.clock.now()
            until = now + timedelta(seconds=self.settings.lock_timeout)
            doc = self._store.claim(
                handler.collection,
                handler.match,
                now - timedelta(seconds=self.clock.uncertainty),
                self.settings.horizon,
                handler.name,
                queries.claim_update(now, until, token, self.settings.replica_id),
            )
        except StoreError as exc:
            # The database is unreachable (or the reply was lost after the claim applied:
            # that lease then expires unused). This handler sits the tick out; the others,
            # and the next tick, go on.
            with self._cv:
                self._stats["claim_errors"] += 1
            logger.warning(
                f"claim failed; {handler.name} skips this tick: {exc}",
                extra={**self._log_base, "collection": handler.collection, "outcome": "error"},
            )
            return None
        if doc is None:
            return None
        with self._cv:
            self._stats["claimed"] += 1
        return Lease(
            store=self._store,
            clock=self.clock,
            settings=self.settings,
            handler=handler,
            doc=doc,
            token=token,
            claimed_at=now,
            expires_at=until,
        )

    def _execute(self, lease: Lease[Any]) -> str:
        handler = lease.handler
        if handler.model is not None:
            try:
                lease.resource = handler.model.model_validate(lease.doc)
            except ValidationError as exc:
                return self._settle(lease, "ValidationError", str(exc), permanent=True)
        try:
            result = handler.func(lease)
        except Exception as exc:
            # Judged by the step's own lease, not by the exception: a LeaseLost raised by
            # another lease object, or by a second outcome, is the handler's error.
            if lease.lost:
                self._log(logging.WARNING, f"lease lost: {_describe(exc)}", lease, "lost")
                return "lost"
            return self._settle(lease, type(exc).__name__, _describe(exc), exc=exc)
        if result is not None and not (isinstance(result, Outcome) and result.token == lease.token):
            what = (
                "another lease's outcome" if isinstance(result, Outcome) else type(result).__name__
            )
            message = (
                f"{handler.name} returned {what}; a handler returns its own lease's "
                "unlock(), relock(), advance(...), fail(...), remove() or None"
            )
            return self._settle(lease, "TypeError", message)
        if lease.held:
            try:
                result = lease.unlock()
            except LeaseLost as exc:
                self._log(logging.WARNING, f"lease lost: {exc}", lease, "lost")
                return "lost"
            except StoreError as exc:
                self._log(
                    logging.ERROR,
                    f"unlock failed, lease left to expire: {exc}",
                    lease,
                    "unrecorded",
                )
                return "unrecorded"
        if result is None:
            # The handler wrote its outcome without returning it, or it returned after
            # step_timeout took the lease back: nothing is left to write.
            self._log(logging.DEBUG, "step done; its lease was already released", lease, "done")
            return "done"
        self._log(logging.DEBUG, "step done", lease, result.action, wait=result.wait)
        return result.action

    def _settle(
        self,
        lease: Lease[Any],
        kind: str,
        message: str,
        *,
        permanent: bool = False,
        exc: BaseException | None = None,
    ) -> str:
        """Record a failed step on its document; never raises."""
        try:
            outcome = lease.record_error(kind, message, permanent=permanent)
        except LeaseLost as lost:
            self._log(
                logging.WARNING, f"{kind} in step, and the lease was lost: {lost}", lease, "lost"
            )
            return "lost"
        except Exception as inner:
            self._log(
                logging.ERROR,
                f"{kind} in step; recording it failed too ({inner!r}): "
                "the lease will expire and the step run again",
                lease,
                "unrecorded",
            )
            return "unrecorded"
        level = logging.ERROR if outcome.action == "failed" else logging.WARNING
        self._log(
            level,
            f"step raised {kind}: {message}",
            lease,
            outcome.action,
            wait=outcome.wait,
            exc_info=exc,
        )
        return outcome.action

    def _release_unstarted(self, lease: Lease[Any]) -> str:
        outcome = self._hand_back(lease, "the replica is stopping")
        if outcome == "released":
            with self._cv:
                self._released_on_stop.append(f"{lease.collection}/{lease.id}")
        return outcome

    def _hand_back(self, lease: Lease[Any], why: str) -> str:
        """Release a lease whose step will not run; counters untouched."""
        try:
            lease.release()
        except (LeaseLost, StoreError) as exc:
            self._log(
                logging.WARNING, f"could not hand back an unstarted lease: {exc}", lease, "lost"
            )
            return "lost"
        self._log(logging.INFO, f"handed back unstarted lease: {why}", lease, "released")
        return "released"

    # -- long steps -----------------------------------------------------------------------

    def heartbeat(self) -> int:
        """Extend the leases of steps running past half the lock timeout, and take back
        those past ``step_timeout``. The loop calls this on its own; returns leases extended."""
        with self._cv:
            steps = list(self._running.values())
        if not steps:
            return 0
        now = self.clock.now()
        extended = 0
        for step in steps:
            lease = step.lease
            if not lease.held:
                continue
            decision = scheduler.heartbeat(
                now,
                claimed_at=lease.claimed_at,
                locked_at=lease.locked_at,
                lock_timeout=self.settings.lock_timeout,
                step_timeout=self.settings.step_timeout,
                extend=self.settings.heartbeat,
            )
            if decision == "time_out":
                self._time_out(step)
            elif decision == "extend":
                try:
                    lease.extend()
                    extended += 1
                except (LeaseLost, StoreError) as exc:
                    self._log(logging.WARNING, f"heartbeat failed: {exc}", lease, "lost")
        if extended:
            with self._cv:
                self._stats["extended"] += extended
        return extended

    def _time_out(self, step: _Step) -> None:
        """A step that never returns must not hold its document forever: count the attempt,
        release the lease (its late writes will then raise LeaseLost), free its slot and
        put a fresh worker in the place of the one it holds."""
        message = f"step ran longer than step_timeout ({self.settings.step_timeout:g}s)"
        self._settle(step.lease, StepTimeout.__name__, message)
        with self._cv:
            if step.abandoned or step.lease.token not in self._running:
                return
            step.abandoned = True
            del self._running[step.lease.token]
            self._stats["timed_out"] += 1
            self._sched.finished("timed_out")
            self._workers -= 1
            self._top_up_workers()

    def _top_up_workers(self) -> None:
        """Top the workers up to max_concurrency (the caller holds the lock)."""
        missing = self.settings.max_concurrency - self._workers
        for _ in range(missing if self._registry.handlers and not self._sched.stopping else 0):
            self._workers += 1
            threading.Thread(
                target=self._work, name=f"orchestrator-{self.replica_id}", daemon=True
            ).start()
        self._cv.notify_all()  # a new tick: every idle worker may have work
        self._settled.notify_all()

    # -- running in the background --------------------------------------------------------

    def start(self) -> None:
        """Create indexes, then keep claiming in the background: at once whenever a worker is
        free and work is due, and every ``tick`` seconds for due relocks and expired leases."""
        with self._cv:
            if self._timer is not None:
                raise OrchestratorError("this orchestrator is already started")
        self.ensure_indexes()
        self.clock.measure()
        timer = BackgroundScheduler(
            timezone=UTC,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        timer.add_job(self._background_tick, "interval", seconds=self.settings.tick, id="tick")
        timer.add_job(
            self._safe_heartbeat, "interval", seconds=self.settings.lock_timeout / 6, id="heartbeat"
        )
        with self._cv:
            if self._timer is not None:
                raise OrchestratorError("this orchestrator is already started")
            self._timer = timer
            self._serving = True
            self._released_on_stop.clear()
            self._sched.resume()
            self._tick()
        timer.start()
        logger.info("orchestrator started", extra={**self._log_base, "outcome": "started"})

    def _background_tick(self) -> None:
        with self._cv:
            self._tick()

    def _clock_fallback(self) -> None:
        with self._cv:
            self._stats["clock_fallback"] += 1
        logger.warning(
            "the server reports no time (hello without localTime): leases are judged by this "
            f"machine's clock, {self.settings.skew_tolerance:g}s late (skew_tolerance); keep "
            "the replicas' clocks synchronised within it",
            extra={**self._log_base, "outcome": "clock-fallback"},
        )

    def _safe_heartbeat(self) -> None:
        try:
            self.heartbeat()
        except Exception:
            logger.exception("heartbeat failed", extra={**self._log_base, "outcome": "error"})

    def request_stop(self) -> None:
        """Stop claiming now, without waiting (safe from a signal handler)."""
        with self._cv:
            self._sched.stop()
            self._serving = False
            self._cv.notify_all()
            self._settled.notify_all()

    def stop(self, timeout: float = 10.0) -> StopReport:
        """Stop claiming, wait up to ``timeout`` seconds for running steps, hand back leases
        claimed but not started, and report what was still running."""
        self.request_stop()
        with self._cv:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.shutdown(wait=False)
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._sched.busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._settled.wait(remaining)
            still = [f"{s.lease.collection}/{s.lease.id}" for s in self._running.values()]
            report = StopReport(list(self._released_on_stop), still)
        level = logging.WARNING if still else logging.INFO
        left = f": {', '.join(still)} left to expire" if still else ""
        logger.log(
            level,
            f"orchestrator stopped: {len(report.released)} unstarted lease(s) handed back, "
            f"{len(still)} step(s) still running{left}",
            extra={**self._log_base, "outcome": "stopped"},
        )
        return report

    def stats(self) -> dict[str, int]:
        """Counts since construction: claimed, unlocked, relocked, advanced, retrying,
        failed, lost, released, extended, timed_out, ticks, tick_failures, ..."""
        with self._cv:
            return dict(self._stats)

    def _log(
        self,
        level: int,
        message: str,
        lease: Lease[Any],
        outcome: str,
        *,
        wait: float | None = None,
        exc_info: BaseException | bool | None = None,
    ) -> None:
        if not logger.isEnabledFor(level):
            return
        extra: dict[str, Any] = {
            **self._log_base,
            "collection": lease.collection,
            "doc_id": str(lease.id),
            "phase": lease.phase,
            "outcome": outcome,
            "handler": lease.handler.name,
        }
        if wait is not None:
            extra["wait"] = round(wait, 3)
        logger.log(level, message, extra=extra, exc_info=exc_info)


def _describe(exc: BaseException) -> str:
    """The message of ``exc``, even when its ``__str__`` itself raises."""
    try:
        return str(exc) or repr(exc)
    except Exception:
        return f"<{type(exc).__name__} with an unprintable message>"
