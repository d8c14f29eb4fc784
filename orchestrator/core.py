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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from apscheduler.schedulers.background import BackgroundScheduler
from pydantic import BaseModel, ValidationError
from pymongo.database import Database

from orchestrator import queries
from orchestrator.clock import Clock, ServerClock, SystemClock
from orchestrator.errors import ConfigError, LeaseLost, OrchestratorError, StoreError
from orchestrator.lease import Lease, Outcome
from orchestrator.redact import RedactingFilter
from orchestrator.registry import Handler, Registry, Target, options, resolve
from orchestrator.resource import Resource
from orchestrator.settings import Settings
from orchestrator.store import Document, Store

logger = logging.getLogger("orchestrator")
logger.addFilter(RedactingFilter())

F = TypeVar("F", bound=Callable[..., Any])

# Outcomes after which something may be claimable at once (by this or another handler);
# "lost" too: a step whose phase was changed from outside releases its document.
_FREES_WORK = frozenset({"unlocked", "advanced", "failed", "released", "timed_out", "done", "lost"})


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
        self._cv = threading.Condition()
        self._running: dict[str, _Step] = {}
        self._generation = 0  # bumped whenever a finished step may have freed work
        self._claims_this_tick: Counter[tuple[str, str]] = Counter()
        self._draining = 0
        self._stats: Counter[str] = Counter()
        self._rotation = 0
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._released_on_stop: list[str] = []
        self._pool: ThreadPoolExecutor | None = None
        self._scheduler: Any = None
        self._loop_thread: threading.Thread | None = None
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
        with self._cv:  # a running drain claims it now, and an idle loop wakes at once
            self._generation += 1
            self._cv.notify_all()
        self._wake.set()
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

    def run_once(self) -> dict[str, int]:
        """One tick, synchronously: claim and run steps until no handler finds work and
        every step started has finished. Returns the outcome counts of this tick."""
        before = self.stats()
        with self._cv:
            self._draining += 1
            self._claims_this_tick.clear()
        try:
            if self._registry.handlers and not self._stopping.is_set():
                self._drain()
        finally:
            self._wait_for(lambda: not self._running)
            with self._cv:
                self._draining -= 1
                self._stats["ticks"] += 1
                self._cv.notify_all()
        after = self.stats()
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    def _drain(self) -> None:
        handlers = self._registry.handlers
        count = len(handlers)
        with self._cv:
            start = self._rotation % count
            self._rotation += 1
            seen = self._generation
        order = handlers[start:] + handlers[:start]  # fairness: a new first handler each tick
        idle = self._idle_by_probe(order)
        limit = self.settings.max_concurrency
        while not self._stopping.is_set():
            for index, handler in enumerate(order):
                if index in idle:
                    continue
                self._wait_for(lambda: len(self._running) < limit or self._stopping.is_set())
                if self._stopping.is_set():
                    return
                lease = self._claim(handler)
                if lease is None:
                    idle.add(index)
                elif self._stopping.is_set():
                    self._release_unstarted(lease)
                    return
                else:
                    self._dispatch(lease)
            with self._cv:
                changed, seen = self._generation != seen, self._generation
            if changed:
                idle.clear()
            elif len(idle) == count:
                # Nothing claimable now; a running step may free more when it finishes.
                self._wait_for(partial(self._quiet_or_changed, seen))
                with self._cv:
                    if self._generation == seen:
                        return

    def _idle_by_probe(self, order: list[Handler]) -> set[int]:
        """Handlers of collections where one read finds nothing to claim: an idle tick then
        costs one read per collection, not one claim per handler."""
        by_collection: dict[str, list[int]] = {}
        for index, handler in enumerate(order):
            by_collection.setdefault(handler.collection, []).append(index)
        idle: set[int] = set()
        for collection, indexes in by_collection.items():
            if len(indexes) < 2:
                continue  # a lone handler's claim costs what the probe would
            try:
                judged = self._judgement_time()
                found = self._store.has_claimable(
                    collection,
                    [(order[i].match, order[i].name) for i in indexes],
                    judged,
                    self.settings.horizon,
                )
            except StoreError:
                continue  # the claims meet the same trouble and report it
            if not found:
                idle.update(indexes)
        return idle

    def _quiet_or_changed(self, seen: int) -> bool:
        return not self._running or self._generation != seen or self._stopping.is_set()

    def _judgement_time(self) -> datetime:
        """When leases are judged: the server's time, less what this estimate may be off by
        (nothing while the server reports its time), so no skew steals a live lease."""
        return self.clock.now() - timedelta(seconds=self.clock.uncertainty)

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
            key = (handler.collection, str(doc.get("_id")))
            self._claims_this_tick[key] += 1
            throttled = self._claims_this_tick[key] > self.settings.max_unlocks_per_tick
        return Lease(
            store=self._store,
            clock=self.clock,
            settings=self.settings,
            handler=handler,
            doc=doc,
            token=token,
            claimed_at=now,
            expires_at=until,
            throttled=throttled,
        )

    def _dispatch(self, lease: Lease[Any]) -> None:
        step = _Step(lease)
        with self._cv:
            self._running[lease.token] = step
            if self._pool is None:
                self._pool = self._new_pool()
            pool = self._pool
        try:
            pool.submit(self._run_step, step)
        except RuntimeError:  # stop() timed out and shut the pool: hand the lease back
            self._finish(step, self._release_unstarted(lease))

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            max_workers=self.settings.max_concurrency,
            thread_name_prefix=f"orchestrator-{self.settings.replica_id}",
        )

    def _run_step(self, step: _Step) -> None:
        outcome = "interrupted"
        try:
            if self._stopping.is_set():
                outcome = self._release_unstarted(step.lease)
            elif step.lease.expired(self.clock.now()):
                # It waited longer than its lease lasted: another replica may run the step
                # now. Hand it back (fenced: a no-op if it was taken) rather than run it.
                outcome = self._hand_back(step.lease, "its lease expired before it started")
            else:
                outcome = self._execute(step.lease)
        except BaseException:
            # The process is going down (SystemExit and the like): leave the lease to
            # expire so another replica takes the step over.
            self._log(
                logging.CRITICAL,
                "step interrupted; lease left to expire",
                step.lease,
                "interrupted",
                exc_info=True,
            )
            raise
        finally:
            self._finish(step, outcome)

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

    def _finish(self, step: _Step, outcome: str) -> None:
        with self._cv:
            if not step.abandoned:
                self._running.pop(step.lease.token, None)
                if outcome in _FREES_WORK:
                    self._generation += 1
            self._stats[outcome] += 1
            self._cv.notify_all()

    def _wait_for(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()``, keeping long steps' leases alive meanwhile."""
        interval = min(self.settings.tick, self.settings.lock_timeout / 6)
        while True:
            with self._cv:
                if ready():
                    return
                self._cv.wait(interval)
                if ready():
                    return
            self._safe_heartbeat()  # an error here must not leave run_once half-finished

    # -- long steps -----------------------------------------------------------------------

    def heartbeat(self) -> int:
        """Extend the leases of steps running past half the lock timeout, and take back
        those past ``step_timeout``. The loop calls this on its own; returns leases extended."""
        with self._cv:
            steps = list(self._running.values())
        if not steps:
            return 0
        now = self.clock.now()
        half = self.settings.lock_timeout / 2
        extended = 0
        for step in steps:
            lease = step.lease
            if not lease.held:
                continue
            timeout = self.settings.step_timeout
            if timeout is not None and (now - lease.claimed_at).total_seconds() >= timeout:
                self._time_out(step, timeout)
            elif self.settings.heartbeat and (now - lease.locked_at).total_seconds() >= half:
                try:
                    lease.extend()
                    extended += 1
                except (LeaseLost, StoreError) as exc:
                    self._log(logging.WARNING, f"heartbeat failed: {exc}", lease, "lost")
        if extended:
            with self._cv:
                self._stats["extended"] += extended
        return extended

    def _time_out(self, step: _Step, timeout: float) -> None:
        """A step that never returns must not hold its document forever: count the attempt,
        release the lease (its late writes will then raise LeaseLost) and free its slot."""
        message = f"step ran longer than step_timeout ({timeout:g}s)"
        self._settle(step.lease, StepTimeout.__name__, message)
        with self._cv:
            if step.abandoned:
                return
            step.abandoned = True
            self._running.pop(step.lease.token, None)
            self._stats["timed_out"] += 1
            self._generation += 1
            # The stuck thread keeps its pool worker; later steps get a fresh pool.
            stuck, self._pool = self._pool, None
            self._cv.notify_all()
        if stuck is not None:
            stuck.shutdown(wait=False)

    # -- running in the background --------------------------------------------------------

    def start(self) -> None:
        """Create indexes, then run the loop every ``tick`` seconds in the background."""
        with self._cv:
            if self._scheduler is not None:
                raise OrchestratorError("this orchestrator is already started")
            self._stopping.clear()
            self._released_on_stop.clear()
        self.ensure_indexes()
        self.clock.measure()
        scheduler = BackgroundScheduler(
            timezone=UTC,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        # The interval job only wakes the loop thread, so a long drain never makes the
        # scheduler skip (and warn about) ticks; submit() wakes it the same way.
        scheduler.add_job(self._wake.set, "interval", seconds=self.settings.tick, id="tick")
        scheduler.add_job(
            self._safe_heartbeat, "interval", seconds=self.settings.lock_timeout / 6, id="heartbeat"
        )
        self._loop_thread = threading.Thread(
            target=self._loop, name=f"orchestrator-loop-{self.replica_id}", daemon=True
        )
        self._scheduler = scheduler
        self._loop_thread.start()
        scheduler.start()
        self._wake.set()
        logger.info("orchestrator started", extra={**self._log_base, "outcome": "started"})

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.run_once()
            except Exception:
                with self._cv:
                    self._stats["tick_failures"] += 1
                logger.exception(
                    "tick failed; the next tick runs as usual",
                    extra={**self._log_base, "outcome": "tick-failed"},
                )

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
        self._stopping.set()
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> StopReport:
        """Stop claiming, wait up to ``timeout`` seconds for running steps, hand back leases
        claimed but not started, and report what was still running."""
        self.request_stop()
        with self._cv:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.shutdown(wait=False)
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._running or self._draining:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
            still = [f"{s.lease.collection}/{s.lease.id}" for s in self._running.values()]
            report = StopReport(list(self._released_on_stop), still)
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        level = logging.WARNING if still else logging.INFO
        logger.log(
            level,
            f"orchestrator stopped: {len(report.released)} unstarted lease(s) handed back, "
            f"{len(still)} step(s) still running {still}",
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
