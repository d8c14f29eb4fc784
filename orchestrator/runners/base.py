"""What the threaded and the asyncio runner share: registration, submission, and the life of
a step, written once.

The step's life (measure the clock when due, probe, claim, run or hand back, classify the
result by the step's own lease, settle errors, heartbeat, time out) is written as *plans*:
generators that yield the I/O they need as zero-argument calls (``lease.unlock``,
``partial(store.claim, ...)``) and get each call's result, or its exception, back. The
threaded runner carries a plan out with ``drive`` (it calls each call), the asyncio runner
with ``adrive`` (it calls, then awaits what a coroutine method returned). The same code
thus decides for ``Lease`` and ``AsyncLease``, and for the sync and the async store, which
have the same method names; the runners keep only threads or tasks, waiting, and their
timers. The scheduling decisions themselves are ``orchestrator.core.scheduler``'s.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import secrets
import socket
import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.core import queries, replicas, scheduler
from orchestrator.core.clock import Clock, ServerClock, SystemClock
from orchestrator.core.errors import ConfigError, LeaseLost, OrchestratorError, StoreError
from orchestrator.core.events import (
    AttemptFailedEvent,
    ClockMeasuredEvent,
    IdleProbeEvent,
    LeaseExtendedEvent,
    LeaseLostEvent,
    Listener,
    Listeners,
    StepClaimedEvent,
    StepFinishedEvent,
)
from orchestrator.core.extras import library_version
from orchestrator.core.lease import Outcome
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.redact import RedactingFilter
from orchestrator.core.registry import Handler, Registry, Target, options, resolve
from orchestrator.core.resource import Resource
from orchestrator.core.scheduler import Claim, Probe, Scheduler
from orchestrator.core.settings import Settings
from orchestrator.core.validation import explain
from orchestrator.mongo.common import Document, database_kind

logger = logging.getLogger("orchestrator")
logger.addFilter(RedactingFilter())

F = TypeVar("F", bound=Callable[..., Any])

TIMER_DEFAULTS = {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
"""The APScheduler job defaults of both runners' ticks and heartbeats."""
T = TypeVar("T")
DB = TypeVar("DB")

Call = Callable[[], Any]
Plan = Generator[Call, Any, T]
"""A piece of the runner's logic: it yields the calls it needs made and returns a T."""


def _resume(plan: Plan[T], value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand a call's result (or exception) back to ``plan``: (True, what it returned) when
    it is over, else (False, the next call)."""
    try:
        return False, (plan.throw(error) if error is not None else plan.send(value))
    except StopIteration as stop:
        return True, stop.value


def drive(plan: Plan[T]) -> T:
    """Carry out ``plan`` here, synchronously. A ``CancelledError`` a call raises here is
    nobody's cancellation of the plan (no task runs it): the plan gets it like any error."""
    try:
        over, got = _resume(plan, None, None)
        while not over:
            error: BaseException | None
            try:
                value, error = got(), None
            except (Exception, asyncio.CancelledError) as exc:
                value, error = None, exc
            over, got = _resume(plan, value, error)
        return got  # type: ignore[no-any-return]
    finally:
        plan.close()


async def adrive(plan: Plan[T]) -> T:
    """Carry out ``plan`` on the event loop: what a call returns is awaited when awaitable.
    A ``CancelledError`` while this task is not being cancelled (``cancelling()`` is 0) was
    raised by the call itself, e.g. a handler awaiting a future another task cancelled:
    the plan gets it like any error. The task's own cancellation ends the plan."""
    try:
        over, got = _resume(plan, None, None)
        while not over:
            error: BaseException | None
            try:
                value, error = got(), None
                if inspect.isawaitable(value):
                    value = await value
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                value, error = None, exc
            except Exception as exc:
                value, error = None, exc
            over, got = _resume(plan, value, error)
        return got  # type: ignore[no-any-return]
    finally:
        plan.close()


@dataclass(frozen=True)
class StopReport:
    """What ``stop`` left behind: leases handed back unstarted, steps still running."""

    released: list[str] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)


class StepTimeout(OrchestratorError):
    """A step ran past ``step_timeout``: its lease was taken back and the attempt counted."""


@dataclass
class Step:
    """A claimed lease and its step (``task``: the asyncio runner's task running it).

    ``number`` names it in this replica's events, ``started`` is the local monotonic time
    of its claim, ``latency`` how long its document had been due (when known), ``wait``
    the wait its outcome set (a relock's, a retry's)."""

    lease: Any  # Lease or AsyncLease
    number: int = 0
    started: float = 0.0
    latency: float | None = None
    wait: float | None = None
    abandoned: bool = False
    task: Any = None


_IN_STEP: ContextVar[object | None] = ContextVar("orchestrator_in_step", default=None)
"""The runner whose step this thread or task is running (a step's context: ``run_once``
from inside it would wait for itself)."""


class Runner(Generic[DB]):
    """Registration, submission, statistics, logging and the plans of a step's life.

    ``db`` is the runner's database (``Database`` or ``AsyncDatabase``); subclasses set
    ``_store_type`` (``Store`` or ``AsyncStore``), ``_lease_type`` (``Lease`` or
    ``AsyncLease``) and ``_measure`` (the matching ``measure``) and carry the plans out.
    Settings come as keyword options (``lock_timeout=30, tick=1.0, ...``) or as a built
    ``Settings``; ``clock`` is this replica's local clock (tests pass a ``FakeClock``).
    ``_cv`` guards the scheduler and the counters; only the threaded runner waits on it.
    """

    _engine: str
    """What the replica records as its engine: "threaded" or "async"."""
    _store_type: Callable[..., Any]
    _lease_type: Callable[..., Any]
    _measure: Callable[..., Any]
    _background_tick: Callable[[], Any]
    _safe_heartbeat: Callable[[], Any]

    def __init__(
        self,
        db: DB,
        settings: Settings | None = None,
        *,
        clock: Clock | None = None,
        listeners: Iterable[Listener] = (),
        **given: Any,
    ) -> None:
        if settings is not None and given:
            raise ConfigError("pass either a Settings object or keyword settings, not both")
        self._check_database(db)
        self.settings = settings if settings is not None else Settings.build(**given)
        self._events = Listeners(self.settings.replica_id, listeners)
        self._step_numbers = itertools.count(1)
        self.db = db
        """The database this replica works on (``orchestrator run`` checks it is reachable)."""
        self._store = self._store_type(db, self.settings.write_concern, self.settings.write_timeout)
        self._local = clock if clock is not None else SystemClock()
        self.clock = ServerClock(
            self._local,
            self.settings.clock_refresh,
            self.settings.skew_tolerance,
            on_fallback=self._clock_fallback,
            on_measured=self._clock_measured,
        )
        self._registry = Registry(self.settings)
        # One lock; the conditions wait on it. A step's path takes ``_lock`` itself: entering
        # a Condition costs a Python-level call, entering the lock none.
        self._lock = lock = threading.RLock()
        self._cv = threading.Condition(lock)  # threaded workers wait here for an action
        self._settled = threading.Condition(lock)  # threaded run_once and stop wait here
        self._sched = Scheduler(
            [],
            max_concurrency=self.settings.max_concurrency,
            budget=self.settings.max_unlocks_per_tick,
        )
        self._running: dict[str, Step] = {}
        self._workers = 0  # workers that will take another action
        self._serving = False  # workers stay for the next tick (start() until stop())
        self._stats: Counter[str] = Counter()
        self._released_on_stop: list[str] = []
        self._errors: list[BaseException] = []  # what workers met during run_once
        self._timer: Any = None  # the APScheduler of ticks and heartbeats, while started
        self._log_base = {"replica": self.settings.replica_id}
        self._recording = False  # the replica's record is kept (start() until stop())
        self._instance = secrets.token_hex(8)  # this process's record, not a namesake's
        self._started_at: datetime | None = None
        self._replica_index = False  # the records' TTL index was made
        self._recorded = False  # the record was written since start()
        self._setup()

    def _setup(self) -> None:
        """What a runner keeps beside the shared state (the asyncio runner: its event)."""

    _database_help: str
    """Which database this runner needs, and where to get one: its refusal's words."""

    def _check_database(self, db: object) -> None:
        """Refuse at construction a database of the other driver, or none at all: it would
        fail only later, at the first claim, with a TypeError."""
        kind = database_kind(db)
        if kind is (self._engine == "async"):
            return
        what = {True: "an AsyncDatabase", False: "a sync Database", None: type(db).__name__}
        other = {True: ": use AsyncOrchestrator", False: ": use Orchestrator", None: ""}
        raise ConfigError(
            f"{type(self).__name__} runs on {self._database_help}, not {what[kind]}{other[kind]}"
        )

    @property
    def replica_id(self) -> str:
        return self.settings.replica_id

    @property
    def handlers(self) -> list[Handler]:
        return list(self._registry.handlers)

    def add_listener(self, listener: Listener) -> None:
        """Receive this replica's events from now on (``orchestrator.Listener``)."""
        self._events.add(listener)

    def _notify(self, *, more_work: bool, everyone: bool = False) -> None:
        """Something happened (the caller holds ``_cv``): ``more_work``, there may be work
        for one more worker; ``everyone``, every idle worker may have work (a tick, a
        submit, a stop). The runner wakes whom it concerns."""
        raise NotImplementedError

    def _settling(self) -> bool:
        """Whether the waiters of run_once and stop may be done (the caller holds ``_cv``):
        the tick is over, no worker is left, or a stop has no step left running. Only then
        are they woken: waking them whenever no step runs, which at concurrency 1 is after
        every step, cost each step a wake-up of a waiter that went back to sleep."""
        sched = self._sched
        return sched.quiet or not self._workers or (sched.stopping and not sched.busy)

    def _check_handler(self, func: Callable[..., Any]) -> None:
        """Refuse a handler this runner cannot run (the threaded one: ``async def``)."""

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
            self._check_handler(func)
            self._registry.add(func, target, match, phase, handler_options)
            with self._cv:
                self._sched.register(self._registry.handlers)
            return func

        return decorate

    # -- documents ------------------------------------------------------------------------

    def _submit(
        self,
        target: Target,
        doc: Mapping[str, Any] | Resource,
        unique: str | Iterable[str] | None,
    ) -> Plan[Document]:
        """Create a document in its first phase, unlocked; with ``unique`` keys, idempotent.

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
        yield from self._measure_if_due()
        new = queries.new_document(fields, self.clock.now())
        stored: Document = yield partial(self._store.insert, collection, new, keys)
        with self._cv:  # idle workers look again at once, not at the next tick
            self._sched.wake()
            self._notify(more_work=True, everyone=True)
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
            raise ConfigError(explain(exc, f"{model.__name__} to submit", model)) from exc

    def _ensure_indexes(self) -> Plan[None]:
        """The claim index on every registered collection, and the unique keys of submit."""
        for collection in self._registry.collections:
            yield partial(self._store.ensure_claim_index, collection)
        for collection, key_sets in self._registry.unique.items():
            for keys in key_sets:
                yield partial(self._store.ensure_unique, collection, keys)

    # -- the server's clock ---------------------------------------------------------------

    def _measure_if_due(self) -> Plan[None]:
        """Measure the server's clock when a measurement is due (``ServerClock`` does no
        I/O itself); with no estimate yet a failure raises."""
        if self.clock.due:
            yield partial(self._measure, self.clock, self._store)

    def _judgement_time(self) -> datetime:
        """When leases are judged: the server's time, less what this estimate may be off by
        (nothing while the server reports its time), so no skew steals a live lease."""
        return self.clock.now() - timedelta(seconds=self.clock.uncertainty)

    def _clock_measured(self, clock: ServerClock, round_trip: float) -> None:
        if self._events.active:
            event = ClockMeasuredEvent(
                self.settings.replica_id,
                clock.offset.total_seconds(),
                round_trip,
                clock.server_time,
            )
            self._events.emit(event)

    def _clock_fallback(self) -> None:
        with self._cv:
            self._stats["clock_fallback"] += 1
        logger.warning(
            "the server reports no time (hello without localTime): leases are judged by this "
            f"machine's clock, {self.settings.skew_tolerance:g}s late (skew_tolerance); keep "
            "the replicas' clocks synchronised within it",
            extra={**self._log_base, "outcome": "clock-fallback"},
        )

    # -- one worker action ----------------------------------------------------------------

    def _act(self, action: Probe | Claim) -> Plan[bool]:
        """Carry out one action of the scheduler's; False when the worker's step was taken
        back by step_timeout (a threaded worker stuck in it is replaced)."""
        try:
            yield from self._measure_if_due()
        except Exception as exc:
            # No estimate yet and the server unreachable (or answering nonsense: whatever
            # the store raises ends this action, never the worker, whose action would
            # stay in flight and wedge the tick): nothing is claimed by a clock that was
            # never measured; the next action tries again.
            what = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            logger.warning(
                f"cannot measure the server's clock; nothing is claimed until it can: {what}",
                extra={**self._log_base, "outcome": "error"},
            )
            with self._cv:
                self._stats["claim_errors"] += 1
                if isinstance(action, Probe):
                    self._sched.probed(action, None)
                else:
                    self._sched.claimed(action, None)
                self._notify(more_work=False)
            return True
        if isinstance(action, Probe):
            yield from self._probe(action)
            return True
        return (yield from self._claim_and_run(action))

    def _probe(self, probe: Probe) -> Plan[None]:
        found: bool | None = None  # on a StoreError the claims meet it too and report it
        started = self._local.monotonic()
        try:
            found = yield partial(
                self._store.has_claimable,
                probe.collection,
                [(h.match, h.exclusion) for h in probe.handlers],
                self._judgement_time(),
                self.settings.horizon,
            )
        except StoreError:
            pass
        finally:
            with self._cv:
                self._sched.probed(probe, found)
                self._notify(more_work=found is not False)
        if self._events.active:
            event = IdleProbeEvent(
                self.settings.replica_id,
                probe.collection,
                tuple(h.name for h in probe.handlers),
                found,
                self._local.monotonic() - started,
            )
            self._events.emit(event)

    def _claim_and_run(self, claim: Claim) -> Plan[bool]:
        try:
            step = yield from self._claim(claim.handler)
        except BaseException:
            with self._cv:
                self._sched.claimed(claim, None)
            raise
        with self._lock:
            throttled = self._sched.claimed(claim, None if step is None else str(step.lease.id))
            if step is not None:
                self._stats["claimed"] += 1
                step.lease.throttled = throttled
                self._running[step.lease.token] = step
                stopping = self._sched.stopping
            self._notify(more_work=step is not None)
        if step is None:
            return True
        lease = step.lease
        if self._events.active:
            self._events.emit(
                StepClaimedEvent(
                    *self._about(lease),
                    step.number,
                    step.latency,
                ),
            )
        outcome: str | None = yield partial(self._run_step, step, stopping)
        with self._lock:
            if outcome is None or step.abandoned:
                return False  # step_timeout counted it and freed its slot: not counted again
            self._stats[outcome] += 1
            del self._running[lease.token]
            self._sched.finished(StepOutcome(outcome))
            self._notify(more_work=False)  # this worker takes the next action itself
        if self._events.active:
            self._step_finished(step, outcome)
        return True

    def _step_finished(self, step: Step, outcome: str) -> None:
        """The one ``StepFinishedEvent`` of a claimed step (the caller checked for
        listeners): from its worker, or from the time-out that took it back."""
        lease = step.lease
        self._events.emit(
            StepFinishedEvent(
                *self._about(lease),
                step.number,
                StepOutcome(outcome),
                self._local.monotonic() - step.started,
                step.wait,
            ),
        )

    def _run_step(self, step: Step, stopping: bool) -> Any:
        """Run ``_step(step, stopping)`` in a step's context; returns its outcome (or an
        awaitable of it). ``interrupted`` when the process is being torn down under it,
        None when step_timeout cancelled it."""
        raise NotImplementedError

    def _interrupted(self, step: Step) -> str:
        """SystemExit and the like from a handler: the lease is left to expire, so another
        replica takes the step over; the worker carries on."""
        self._log(
            logging.CRITICAL,
            "step interrupted; lease left to expire",
            step.lease,
            "interrupted",
            exc_info=True,
        )
        return "interrupted"

    def _claim(self, handler: Handler) -> Plan[Step | None]:
        """Claim a document for ``handler``: its step, not started, or None."""
        token = secrets.token_hex(8)
        now = self.clock.now()
        until = now + timedelta(seconds=self.settings.lock_timeout)
        due: list[datetime | None] = []
        try:
            doc = yield partial(
                self._store.claim,
                handler.collection,
                handler.match,
                now - timedelta(seconds=self.clock.uncertainty),
                self.settings.horizon,
                handler.exclusion,
                queries.claim_update(now, until, token, self.settings.replica_id),
                # How long it was due is read from its fields before the claim, if listened to.
                (lambda before: due.append(queries.due_since(before)))
                if self._events.active
                else None,
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
        started = self._local.monotonic()
        lease = self._lease_type(
            store=self._store,
            clock=self.clock,
            settings=self.settings,
            handler=handler,
            doc=doc,
            token=token,
            claimed_at=now,
            expires_at=until,
        )
        since = due[0] if due else None
        # A lockedUntil ahead of now is a bogus lease the claim took as free: no latency.
        latency = (now - since).total_seconds() if since is not None and since <= now else None
        return Step(lease, next(self._step_numbers), started, latency)

    # -- a step ---------------------------------------------------------------------------

    def _step(self, step: Step, stopping: bool) -> Plan[str]:
        """A claimed lease's step: run it, or hand the lease back unstarted."""
        lease = step.lease
        if stopping:
            outcome = yield from self._hand_back(lease, "the replica is stopping")
            if outcome == "released":
                with self._cv:
                    self._released_on_stop.append(f"{lease.collection}/{lease.id}")
            return outcome
        if lease.expired(self.clock.now()):
            # It waited longer than its lease lasted: another replica may run the step
            # now. Hand it back (fenced: a no-op if it was taken) rather than run it.
            return (yield from self._hand_back(lease, "its lease expired before it started"))
        inside = _IN_STEP.set(self)
        try:
            return (yield from self._execute(step))
        finally:
            _IN_STEP.reset(inside)

    def _call_handler(self, step: Step) -> Any:
        """Call the step's handler with its lease: its result, or an awaitable of it."""
        raise NotImplementedError

    def _execute(self, step: Step) -> Plan[str]:
        lease = step.lease
        handler = lease.handler
        if handler.model is not None:
            try:
                lease.resource = handler.model.model_validate(lease.doc)
            except ValidationError as exc:
                why = explain(exc, handler.model.__name__, handler.model)
                return (yield from self._settle(step, "ValidationError", why, True))
        try:
            result = yield partial(self._call_handler, step)
        except (Exception, asyncio.CancelledError) as exc:  # a cancellation the handler raised
            # Judged by the step's own lease, not by the exception: a LeaseLost raised by
            # another lease object, or by a second outcome, is the handler's error. A step
            # step_timeout took back has had its attempt recorded: nothing is written over it.
            if lease.lost or step.abandoned:
                self._lost(f"lease lost: {_describe(exc)}", lease)
                return "lost"
            return (yield from self._settle(step, type(exc).__name__, _describe(exc), exc=exc))
        if result is not None and not (isinstance(result, Outcome) and result.token == lease.token):
            what = (
                "another lease's outcome" if isinstance(result, Outcome) else type(result).__name__
            )
            message = (
                f"{handler.name} returned {what}; a handler returns its own lease's "
                "unlock(), relock(), advance(...), fail(...), remove() or None"
            )
            return (yield from self._settle(step, "TypeError", message))
        if lease.held:
            try:
                result = yield lease.unlock
            except LeaseLost as exc:
                self._lost(f"lease lost: {exc}", lease)
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
        step.wait = result.wait
        return str(result.action)

    def _settle(
        self,
        step: Step,
        kind: str,
        message: str,
        permanent: bool = False,
        *,
        exc: BaseException | None = None,
        after: bool = True,
    ) -> Plan[str]:
        """Record a failed step on its document; never raises. ``after``: the handler's
        own error, which after the step's own outcome is only noted (that outcome stands
        and is returned); a time-out records only on a lease still held."""
        lease = step.lease
        try:
            outcome = yield partial(
                lease.record_error, kind, message, permanent=permanent, after=after
            )
        except LeaseLost as lost:
            if not lease.lost:
                # The step's own outcome, or its attempt's record, landed first: it stands.
                first = lease.outcome
                self._log(
                    logging.INFO,
                    f"{kind} in step not recorded: {lost}",
                    lease,
                    "superseded",
                )
                return str(first.action) if first is not None else "lost"
            self._lost(f"{kind} in step, and the lease was lost: {lost}", lease)
            action = "lost"
        except Exception as inner:
            self._log(
                logging.ERROR,
                f"{kind} in step; recording it failed too ({inner!r}): "
                "the lease will expire and the step run again",
                lease,
                "unrecorded",
            )
            action = "unrecorded"
        else:
            action = str(outcome.action)
            step.wait = outcome.wait
            if action not in {"retrying", "failed"}:
                message = f"{message} (after its own outcome, {action}, which stands)"
            level = logging.ERROR if action == "failed" else logging.WARNING
            self._log(
                level,
                f"step raised {kind}: {message}",
                lease,
                action,
                wait=outcome.wait,
                exc_info=exc,
            )
        if self._events.active:
            event = AttemptFailedEvent(
                *self._about(lease),
                kind,
                message,
                StepOutcome(action),
                step.wait,
                action == "failed",
            )
            self._events.emit(event)
        return action

    def _lost(self, message: str, lease: Any) -> None:
        """A write found ``lease`` lost: logged, and reported to the listeners."""
        self._log(logging.WARNING, message, lease, "lost")
        if self._events.active:
            event = LeaseLostEvent(
                *self._about(lease),
                message,
                self._held_for(lease),
            )
            self._events.emit(event)

    def _about(self, lease: Any) -> tuple[str, str, Any, str | None, str]:
        """What every step event says first: this replica, and the step's document,
        phase and handler."""
        return (
            self.settings.replica_id,
            lease.collection,
            lease.id,
            lease.phase,
            lease.handler.name,
        )

    def _held_for(self, lease: Any) -> float:
        """Seconds since ``lease`` was claimed, by the server clock's estimate."""
        return float((self.clock.now() - lease.claimed_at).total_seconds())

    def _hand_back(self, lease: Any, why: str) -> Plan[str]:
        """Release a lease whose step will not run; counters untouched."""
        try:
            yield lease.release
        except LeaseLost as exc:
            self._lost(f"could not hand back an unstarted lease: {exc}", lease)
            return "lost"
        except StoreError as exc:
            self._log(
                logging.WARNING, f"could not hand back an unstarted lease: {exc}", lease, "lost"
            )
            return "lost"
        self._log(logging.INFO, f"handed back unstarted lease: {why}", lease, "released")
        return "released"

    # -- long steps -----------------------------------------------------------------------

    def _heartbeat(self) -> Plan[int]:
        """Extend the leases of steps running past half the lock timeout, take back those
        past ``step_timeout``, and refresh the replica's record; returns the leases extended."""
        yield from self._measure_if_due()
        with self._cv:
            steps = list(self._running.values())
        if not self.clock.measured:
            return 0
        now = self.clock.now()
        due: list[Any] = []
        late: list[Step] = []
        for step in steps:
            lease = step.lease
            # A step whose lease is gone (released early, or lost) is never extended, but
            # it still times out: a handler that hangs after unlock() must free its slot.
            decision = scheduler.heartbeat(
                now,
                claimed_at=lease.claimed_at,
                locked_at=lease.locked_at,
                lock_timeout=self.settings.lock_timeout,
                step_timeout=self.settings.step_timeout,
                extend=self.settings.heartbeat and lease.held,
            )
            if decision == "time_out":
                late.append(step)
            elif decision == "extend":
                due.append(lease)
        # Every extension is sent at once, before any time-out's record: one slow write
        # must not hold the others back until their leases expire.
        results = (yield partial(self._all_at_once, [lease.extend for lease in due])) if due else []
        extended = 0
        for lease, result in zip(due, results, strict=True):
            if isinstance(result, LeaseLost):
                self._lost(f"heartbeat failed: {result}", lease)
            elif isinstance(result, StoreError):
                self._log(logging.WARNING, f"heartbeat failed: {result}", lease, "lost")
            elif isinstance(result, BaseException):
                raise result
            else:
                extended += 1
                if self._events.active:
                    event = LeaseExtendedEvent(
                        *self._about(lease),
                        self._held_for(lease),
                    )
                    self._events.emit(event)
        for step in late:
            yield from self._time_out(step)
        if extended:
            with self._cv:
                self._stats["extended"] += extended
        yield from self._refresh_replica()
        return extended

    # -- the replica's record -------------------------------------------------------------

    def _replica_record(self, now: datetime) -> replicas.ReplicaRecord:
        """This replica as it records itself at ``now``, with the steps it runs."""
        with self._cv:
            steps = [
                replicas.RunningStep(
                    collection=step.lease.collection,
                    id=str(step.lease.id),
                    phase=step.lease.phase,
                    since=step.lease.claimed_at,
                )
                for step in self._running.values()
            ]
            started = self._started_at or now
        settings = self.settings
        return replicas.new_record(
            replica_id=settings.replica_id,
            instance=self._instance,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=library_version(),
            engine=self._engine,
            started=started,
            now=now,
            lock_timeout=settings.lock_timeout,
            tick=settings.tick,
            max_concurrency=settings.max_concurrency,
            steps=steps,
        )

    def _begin_record(self) -> Plan[None]:
        """``start()``'s first record, written before the first tick: a started replica is
        listed before it runs any step."""
        with self._cv:
            self._recording = True
            self._recorded = False
            self._started_at = self.clock.now()
        yield from self._refresh_replica()

    def _refresh_replica(self) -> Plan[None]:
        """Write this replica's record (while it serves: ``start()`` until ``stop()``).

        Never raises: the record is for operators, and a replica that cannot write it
        still runs its steps. A failure is logged and counted (``replica_errors``), and
        the next heartbeat writes again.
        """
        with self._cv:
            recording = self._recording
        if not recording or not self.clock.measured:
            return
        name = self.settings.replicas_collection
        try:
            if not self._replica_index:
                yield partial(self._store.ensure_replica_index, name)
                self._replica_index = True
            record = self._replica_record(self.clock.now())
            previous = yield partial(self._store.record_replica, record, name)
        except OrchestratorError as exc:
            with self._cv:
                self._stats["replica_errors"] += 1
            logger.warning(
                f"could not record this replica in {name} (the next heartbeat tries again): {exc}",
                extra={**self._log_base, "outcome": "replica-unrecorded"},
            )
            return
        with self._cv:
            self._stats["replica_records"] += 1
            stopped = not self._recording
            # Another process wrote under this replica id since this one's last record
            # (a dead namesake cannot: its record is only there before the first write).
            namesake = self._recorded and previous not in (None, self._instance)
            self._recorded = True
            if namesake:
                self._stats["replica_namesakes"] += 1
        if namesake:
            logger.warning(
                f"another live process records itself as replica {self.replica_id!r}: give "
                "each replica its own replica_id (leases name their holder by it)",
                extra={**self._log_base, "outcome": "replica-namesake"},
            )
        if stopped:  # stop() removed the record while this write was on its way
            yield from self._remove_replica()

    def _forget_replica(self) -> Plan[None]:
        """Stop keeping the record, and delete it: a stopped replica is not listed."""
        with self._cv:
            if not self._recording:
                return
            self._recording = False
        yield from self._remove_replica()

    def _remove_replica(self) -> Plan[None]:
        name, replica_id = self.settings.replicas_collection, self.settings.replica_id
        try:
            yield partial(self._store.remove_replica, replica_id, self._instance, name)
        except OrchestratorError as exc:
            with self._cv:
                self._stats["replica_errors"] += 1
            logger.warning(
                f"could not remove this replica's record from {name}; it expires on its own: {exc}",
                extra={**self._log_base, "outcome": "replica-unrecorded"},
            )

    def _time_out(self, step: Step) -> Plan[None]:
        """A step that never returns must not hold its document forever: count the attempt,
        release the lease (its late writes will then raise LeaseLost) and free its slot.
        A lease the step no longer holds is not written: only the slot is freed."""
        message = f"step ran longer than step_timeout ({self.settings.step_timeout:g}s)"
        if step.lease.held:
            yield from self._settle(step, StepTimeout.__name__, message, after=False)
        else:
            self._log(
                logging.WARNING, f"{message}, its lease already gone", step.lease, "timed_out"
            )
        with self._cv:
            if step.abandoned or step.lease.token not in self._running:
                return
            step.abandoned = True
            del self._running[step.lease.token]
            self._stats["timed_out"] += 1
            self._sched.finished(StepOutcome.TIMED_OUT)
            self._abandon(step)
            self._notify(more_work=True)
        if self._events.active:
            self._step_finished(step, "timed_out")

    def _all_at_once(self, calls: list[Call]) -> Any:
        """Make ``calls`` concurrently; each one's result or exception, in order (or an
        awaitable of that list). The heartbeat's extensions: none waits for another."""
        raise NotImplementedError

    def _abandon(self, step: Step) -> None:
        """Let go of a timed-out step's worker (the caller holds ``_cv``)."""
        raise NotImplementedError

    # -- ticks, run_once, stop ------------------------------------------------------------

    def _tick(self) -> None:
        """A new tick (the caller holds the lock): fresh budgets, and workers to use them."""
        self._stats["ticks"] += 1
        self.clock.watch(self._store.primary())  # a failover: re-measure at once
        self._sched.tick()
        self._top_up_workers()

    def _top_up_workers(self) -> None:
        """Top the workers up to max_concurrency (the caller holds the lock)."""
        missing = self.settings.max_concurrency - self._workers
        for _ in range(missing if self._registry.handlers and not self._sched.stopping else 0):
            self._workers += 1
            self._spawn_worker()
        self._notify(more_work=True, everyone=True)  # a new tick: every idle worker may have work

    def _spawn_worker(self) -> None:
        raise NotImplementedError

    def _worker_exit(self) -> bool:
        """A worker with nothing to do leaves when the replica is not serving and the tick
        is over (the caller holds the lock); True when it leaves."""
        if self._serving or not self._sched.quiet:
            return False
        self._workers -= 1
        self._notify(more_work=False)
        return True

    def _worker_failed(self, exc: BaseException) -> None:
        """A worker met something that is not a StoreError: a bug, or the process dying."""
        with self._cv:
            self._workers -= 1  # the next tick puts a fresh worker in its place
            self._stats["tick_failures"] += 1
            self._errors.append(exc)
            self._notify(more_work=True)
        logger.error(
            "a worker failed; the next tick replaces it",
            exc_info=exc,
            extra={**self._log_base, "outcome": "tick-failed"},
        )

    def _begin_once(self) -> dict[str, int]:
        """``run_once``'s start: refused from inside a step; a tick; the counts before it."""
        if _IN_STEP.get() is self:
            raise OrchestratorError(
                "run_once() called from inside a step: it would wait for that step to end"
            )
        before = self.stats()
        with self._cv:
            self._errors.clear()
            if not self._serving:  # a stopped replica runs a tick by hand, as a new one does
                self._sched.resume()
            self._tick()
        return before

    def _once_over(self) -> bool:
        """The tick is over, or every worker failed (their errors are raised by run_once)."""
        return self._sched.quiet or not self._workers

    def _end_once(self, before: dict[str, int]) -> dict[str, int]:
        with self._cv:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]
        after = self.stats()
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    def _refuse_restart(self) -> None:
        with self._cv:
            if self._timer is not None:
                raise OrchestratorError("this orchestrator is already started")

    def _serve(self, timer: Any) -> None:
        """Claim in the background from now on: ``timer`` (an APScheduler scheduler) runs
        the ticks and the heartbeat. Coalesced, one instance at a time: a heartbeat slower
        than its interval is never run twice at once, and missed runs are not made up."""
        timer.add_job(self._background_tick, "interval", seconds=self.settings.tick, id="tick")
        timer.add_job(
            self._safe_heartbeat,
            "interval",
            seconds=replicas.refresh_interval(self.settings.lock_timeout),
            id="heartbeat",
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

    def _stop_serving(self) -> None:
        """Claim nothing more and stop the timer; running steps go on."""
        self.request_stop()
        with self._cv:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.shutdown(wait=False)

    def request_stop(self) -> None:
        """Stop claiming now, without waiting (safe from a signal handler; in the asyncio
        runner, call it on the event loop's thread)."""
        with self._cv:
            self._sched.stop()
            self._serving = False
            self._notify(more_work=True, everyone=True)

    def _stop_report(self) -> StopReport:
        with self._cv:
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
        failed, lost, released, extended, timed_out, ticks, tick_failures, listener_errors
        (calls of a listener that raised), ..."""
        with self._cv:
            counts = dict(self._stats)
        if self._events.errors:
            counts["listener_errors"] = self._events.errors
        return counts

    def _log(
        self,
        level: int,
        message: str,
        lease: Any,
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
