"""The engine: ``AsyncOrchestrator``, written once; ``Orchestrator`` is generated from it.

``scripts/synchro.py`` turns this module into ``orchestrator/runners/_sync/engine.py``
(``async``/``await`` removed, async names mapped to their sync twins), as PyMongo 4 makes
its synchronous API. What differs between the two is in the hand-written pairs it uses
(``workers.AsyncWorkers``/``Workers``: tasks or threads, events or conditions, the timer;
``calls.AsyncHandlerCalls``/``HandlerCalls``: how a handler is called) and in the few
places ``_IS_SYNC`` marks. A step's life is ``steps``'s, the replica's record
``replica``'s, the state they change the ``Books``'.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core import replicas, sharding, starts
from orchestrator.core.clock import Clock, ServerClock, SystemClock
from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError, OrchestratorError
from orchestrator.core.events import Listener, Listeners
from orchestrator.core.queries import submissions
from orchestrator.core.registry import Handler, Registry, Target
from orchestrator.core.resource import EPOCH, Resource
from orchestrator.core.retention import NO_RETENTION, Retention
from orchestrator.core.settings import Settings
from orchestrator.core.steps import StopReport, stop_summary
from orchestrator.core.trees import Delivered
from orchestrator.mongo import AsyncLease, AsyncStore
from orchestrator.mongo._async.clock_probe import measure
from orchestrator.mongo._async.contract import AsyncLeaseStore
from orchestrator.mongo.connection import database_kind
from orchestrator.runners._async.controls import AsyncPauseWatch
from orchestrator.runners._async.parts import AsyncReplicaParts
from orchestrator.runners._async.replica import AsyncReplicaRecorder
from orchestrator.runners._async.schedules import AsyncSchedules, FireFunc
from orchestrator.runners._async.steps import AsyncSteps
from orchestrator.runners.books import Books
from orchestrator.runners.calls import AsyncHandlerCalls
from orchestrator.runners.registration import Registration
from orchestrator.runners.reporter import Reporter, logger
from orchestrator.runners.step import IN_STEP
from orchestrator.runners.workers import AsyncWorkers, WorkerEnd

__all__ = ["AsyncOrchestrator"]

_IS_SYNC = False

F = TypeVar("F", bound=Callable[..., Any])


class AsyncOrchestrator:
    """Register handlers with ``phase``/``when``, then ``start()`` in every replica (on the
    async engine, ``await start()``, e.g. in a FastAPI lifespan).

    ``Orchestrator`` runs on a PyMongo ``Database`` (or ``orchestrator.testing``'s
    ``memory_database()``) and calls plain functions on its worker threads;
    ``AsyncOrchestrator`` runs on an ``AsyncDatabase`` (or ``async_memory_database()``),
    awaits ``async def`` handlers and runs plain ``def`` ones (blocking SDKs) on threads
    with a ``ThreadLease``. Settings come as keyword options (``lock_timeout=30,
    tick=1.0, ...``) or as a built ``Settings``; ``clock`` is this replica's local clock
    (tests pass a ``FakeClock``).

    The async engine runs on one event loop at a time: the one its methods are awaited
    on. A loop that ends cancels its workers, and a step cancelled so leaves the books
    (counted ``interrupted``, its lease left to expire); the next call on another loop
    then moves the replica there (a ``start()`` without ``stop()`` ended with its loop). A
    call from another loop raises ``OrchestratorError`` while the first still runs, while
    it is stopped but open with this replica's work on it (it may run again), or when it
    was closed without cancelling that work (``loop.close()``, unlike ``asyncio.run``).
    PyMongo's ``AsyncMongoClient`` binds to its first loop for good: on a server, make the
    client and the orchestrator per loop.
    """

    def __init__(
        self,
        db: AsyncDatabase[Document],
        settings: Settings | None = None,
        *,
        clock: Clock | None = None,
        listeners: Iterable[Listener] = (),
        **given: Any,
    ) -> None:
        if settings is not None and given:
            raise ConfigError("pass either a Settings object or keyword settings, not both")
        _check_database(db, type(self).__name__)
        self.settings = settings if settings is not None else Settings.build(**given)
        self.db = db
        """The database this replica works on (``orchestrator run`` checks it is reachable)."""
        name = self.settings.replica_id
        local = clock if clock is not None else SystemClock()
        self.clock = ServerClock(
            local,
            self.settings.clock_refresh,
            self.settings.skew_tolerance,
            on_fallback=self._clock_fallback,
            on_measured=self._clock_measured,
        )
        self._report = Reporter(name, Listeners(name, listeners), local, self.clock)
        self._store: AsyncLeaseStore = AsyncStore(
            db,
            self.settings.write_concern,
            self.settings.write_timeout,
            legacy_lock_timeout=self.settings.legacy_lock_timeout,
            watch=self._report.database,
        )
        self._books: Books[AsyncLease[Any]] = Books(
            self.settings.max_concurrency, self.settings.max_unlocks_per_tick
        )
        self._crew = AsyncWorkers(self._books, self._work, name)
        self._books.hire(self._crew)
        self._calls = AsyncHandlerCalls(name, self.settings.max_concurrency)
        self._pauses = AsyncPauseWatch(
            store=self._store,
            settings=self.settings,
            report=self._report,
            apply=self._books.pause,
        )
        registry = Registry(self.settings)
        self._registration = Registration(registry, self._calls.check, self._registered)
        parts = AsyncReplicaParts(
            store=self._store,
            clock=self.clock,
            settings=self.settings,
            books=self._books,
            report=self._report,
            retention=registry.retention,
        )
        self._steps = AsyncSteps(
            parts,
            engine=self,
            local=local,
            crew=self._crew,
            calls=self._calls,
            on_due=self._come_due,
            reading_pauses=self._pauses.probing,
            registration=self._registration,
        )
        self._record = AsyncReplicaRecorder(
            parts,
            engine="threaded" if _IS_SYNC else "async",
            registry=self._registration.registry,
            paused=lambda: self._pauses.scopes,
            schedules=lambda: [
                (name, declared.spec.stored())
                for name, declared in list(self._schedules.declared.items())
            ],
        )

        self._schedules = AsyncSchedules(self, self._store, self._report)

    def _registered(self, handlers: list[Handler]) -> None:
        self._books.register(handlers)
        self._pauses.registered(handlers)

    @property
    def replica_id(self) -> str:
        return self.settings.replica_id

    @property
    def handlers(self) -> list[Handler]:
        return list(self._registration.registry.handlers)

    @property
    def retention(self) -> dict[str, Retention]:
        """Per collection, how long documents stay in each retained phase (``retain``)."""
        return {name: dict(kept) for name, kept in self._registration.registry.retention.items()}

    def add_listener(self, listener: Listener) -> None:
        """Receive this replica's events from now on (``orchestrator.Listener``)."""
        self._report.events.add(listener)

    # -- registration -------------------------------------------------------------------

    def phase(self, target: Target, phase: str, **opts: Any) -> Callable[[F], F]:
        """Register the decorated function for documents of ``target`` in ``phase``.

        Options: ``max_attempts``, ``failed_phase``, ``relock_policy``, ``retry_policy``,
        ``to`` (the phases it may advance to; any other advance is refused), ``shard_key``
        (the collection's shard key, on a sharded cluster: every claim and write then
        targets one shard), ``global_limit`` (at most that many of its steps run at once
        across every replica), ``rate_limit`` (at most that many start per second, minute
        or hour across every replica: ``"10/minute"``).
        """
        return self._registration.phase(target, phase, **opts)

    def when(self, target: Target, match: Mapping[str, Any], **opts: Any) -> Callable[[F], F]:
        """Register the decorated function for documents of ``target`` matching a filter,
        e.g. a desired ``state`` that differs from the observed ``phase``."""
        return self._registration.when(target, match, **opts)

    def schedule(  # noqa: PLR0913  the documented keywords (README, "Schedules")
        self,
        name: str,
        target: Target,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        timezone: str = "UTC",
        overlap: str = "skip",
        catch_up: float | timedelta = 3600.0,
        coalesce: bool = False,
        jitter: float | timedelta = 0.0,
    ) -> Callable[[FireFunc], FireFunc]:
        """Run the decorated function at each fire time, once across every replica, and
        submit the document it returns (or nothing for None) to ``target``.

        ``cron`` (five fields, or six with seconds first, in ``timezone``, an IANA name) or
        ``every`` (seconds or a timedelta, at least 1 s). The function gets the fire time
        (aware, UTC: the time scheduled, not the time it runs) and returns a document (a
        dict or a Resource) or None; its document's ``_id`` is the schedule's
        (``name@fire``), so a fire time starts one document, even when a replica dies
        mid-fire. ``overlap`` (its previous runs still in a phase a handler of ``target``
        takes): ``skip`` (the default), ``buffer_one``, ``allow_all`` or
        ``cancel_previous``. ``catch_up`` (seconds, default an hour): missed fires younger
        than this start late (all of them, or only the latest with ``coalesce``); older
        ones are recorded missed. ``jitter`` (seconds): each fire starts up to this much
        late, the same on every replica.
        """
        return self._schedules.declare(
            name,
            target,
            cron=cron,
            every=every,
            timezone=timezone,
            overlap=overlap,
            catch_up=catch_up,
            coalesce=coalesce,
            jitter=jitter,
            check=self._calls.check,
        )

    # -- documents ----------------------------------------------------------------------

    async def submit(
        self,
        target: Target,
        doc: Mapping[str, Any] | Resource,
        *,
        unique: str | Iterable[str] | None = None,
        not_before: datetime | float | None = None,
        priority: int = 0,
    ) -> Document:
        """Create a document in its first phase, unlocked; with ``unique`` keys, idempotent:
        concurrent submits of one key create one document and all return it. On a started
        replica with a worker free for its first phase's handler (and nothing of that
        handler's waiting), it is created already leased to that worker, whose step starts
        at once with no claim (the document returned shows that lease).

        ``unique`` defaults to the keys the model declares (``Resource.unique``; for a
        collection name, those of the model registered on it), else to ``_id`` when the
        document has one. Listeners may store a trace context on it (``SubmittingEvent``):
        the trace its steps' spans join.

        ``not_before`` (an aware datetime, or seconds from now): nothing claims the
        document before then. It is a wait like a relock's (its ``lockedUntil``, judged by
        the server's clock), bounded like one: more than ``max_wait`` ahead is refused
        (``ConfigError``), not cut short. ``priority`` (0 to ``claims.MAX_PRIORITY``,
        default 0): among the documents of a handler due at once, higher is claimed
        first, then the longest free. A document with the default stores no priority
        field, so one written without (before priorities, or by other code) ranks as 0.
        A second submit of an existing key changes neither.
        """
        self._crew.enter()
        new = self._registration.submission(target, doc, unique)
        self._registration.register_unique_keys(new)
        start = starts.check_not_before(not_before)
        rank = starts.check_priority(priority)
        await self._steps.measure_if_due()
        trace = self._report.submitting(new.collection, new.fields)
        now = self.clock.now()
        until = starts.start_time(start, now, self.settings.max_wait)
        doc = submissions.new_document(new.fields, now, trace, until=until, priority=rank)
        kept = self._registration.registry.retention.get(new.collection, NO_RETENTION)
        return await self._steps.insert(
            new.collection,
            submissions.expiring(doc, now, kept),
            new.keys,
            due_now=until == EPOCH,
        )

    async def signal(
        self, target: Target, doc_id: Any, name: str, payload: Any = None
    ) -> Delivered:
        """Send the signal ``name`` (with ``payload``, anything MongoDB stores) to the
        document ``doc_id`` of ``target``: stored in its inbox (the latest
        ``trees.MAX_SIGNALS`` kept, oldest dropped and counted), and if it waits for that
        name (``lease.wait_for``), due at once (claimed here at once when this replica's
        handlers take it). Fenced like every write: a step running on it keeps its lease
        (its wait, stored next, finds the signal). ``DocumentNotFound`` for no such
        document; ``ConfigError`` for a bad name or a payload MongoDB cannot store."""
        self._crew.enter()
        return await self._steps.trees.signal(target, doc_id, name, payload)

    def retain(self, target: Target, phases: Mapping[str, Any]) -> None:
        """Keep documents of ``target`` in each phase named for as long as it says (``"30d"``,
        ``"12h"``, ``"90m"``, ``"45s"``, seconds or a ``timedelta``), then let the server
        delete them: e.g. ``retain("reports", {"Done": "30d", "Failed": "90d"})``. The
        write entering such a phase stores the date (``orchestratorExpiresAt``), which a
        TTL index made by ``ensure_indexes`` deletes by (within about a minute)."""
        self._registration.retain(target, phases)

    async def ensure_indexes(self) -> None:
        """The claim index on every registered collection, the unique keys of submit, the
        TTL index of each collection with a retention, and the slots of the handlers'
        cluster-wide limits."""
        self._crew.enter()
        self._schedules.register()
        collections, unique = self._registration.indexes()
        registry = self._registration.registry
        for collection in collections:
            refusal = sharding.problem(
                collection,
                registry.shard_key_for(collection),
                await self._store.shard_state(collection),
            )
            if refusal is not None:
                raise refusal  # at start(), before any claim: a sharded collection's key
            await self._store.ensure_claim_index(collection)
            await self._store.ensure_errors_index(collection)
        for collection, keys in unique:
            await self._store.ensure_unique(collection, keys)
        for collection in registry.retention:
            await self._store.ensure_retention_index(collection)
        for handler in registry.handlers:
            for limit in handler.limits:
                await self._store.ensure_slots(self.settings.slots_collection, handler.key, limit)
        for collection in self._schedules.collections:
            await self._store.ensure_schedule_runs_index(collection)
        if self._schedules.unpublished:
            await self._steps.measure_if_due()  # the documents' first fires are the server's
            await self._schedules.publish()

    async def measure_clock(self) -> None:
        """Measure the server's clock if a measurement is due (workers do before each
        action, and the heartbeat); with no estimate yet a failure raises ``StoreError``."""
        self._crew.enter()
        await self._steps.measure_if_due()

    def _clock_measured(self, clock: ServerClock, round_trip: float) -> None:
        self._report.clock_measured(clock, round_trip)

    def _clock_fallback(self) -> None:
        self._books.count("clock_fallback")
        self._report.line(
            logging.WARNING,
            "the server reports no time (hello without localTime): leases are judged by this "
            f"machine's clock, {self.settings.skew_tolerance:g}s late (skew_tolerance); keep "
            "the replicas' clocks synchronised within it",
            "clock-fallback",
        )

    # -- the workers --------------------------------------------------------------------

    async def run_once(self, *, heartbeat: bool = True) -> dict[str, int]:
        """One tick: claim and run steps until no handler finds work and every step started
        has finished. Returns the outcome counts of this tick. On a replica not started, its
        workers have left by then: nothing runs until the next call (a document submitted
        in between is run, and counted, by that one).

        Meanwhile a heartbeat keeps long steps' leases alive, every interval of real time.
        ``heartbeat=False``: none; the caller calls ``heartbeat()`` when it means to (a
        harness on a fake clock, whose run a seed must replay: a heartbeat fired because a
        loaded machine made this wait longer would read the clock and the pauses, or take
        a step back, at a moment no seed decides)."""
        self._crew.enter()
        if IN_STEP.get() is self:
            raise OrchestratorError(
                "run_once() called from inside a step: it would wait for that step to end"
            )
        self._schedules.register()
        if self._schedules.unpublished:
            await self._steps.measure_if_due()  # the documents' first fires are the server's
            await self._schedules.publish()
        before = self.stats()
        self._watch_for_failover()
        self._books.begin_once()
        # Long steps' leases are kept alive meanwhile: a heartbeat every interval, not at
        # every wake-up (a test's own heartbeat calls stay its own).
        interval = min(self.settings.tick, self.settings.lock_timeout / 6)
        beat = time.monotonic() + interval if heartbeat else None
        while not await self._crew.settled(
            self._books.once_over, None if beat is None else max(beat - time.monotonic(), 0.0)
        ):
            if beat is not None and time.monotonic() >= beat:
                await self._safe_heartbeat()
                beat = time.monotonic() + interval
        errors = self._books.end_once()
        if errors:
            raise errors[0]
        after = self.stats()
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    async def _work(self) -> None:
        """A worker: take actions until there are none and the replica is not serving, or
        until step_timeout takes its step back (a fresh worker has its place then)."""
        try:
            while True:
                action = await self._crew.next_action()
                if action is None or not await self._steps.act(action):
                    return
        except BaseException as exc:
            end = self._crew.worker_end(exc)
            if end is WorkerEnd.RAISE:
                raise
            if end is WorkerEnd.FAILED:  # not a StoreError: a bug, or the process dying
                self._books.worker_failed(exc)
                logger.error(
                    "a worker failed; the next tick replaces it",
                    exc_info=exc,
                    extra={**self._report.base, "outcome": "tick-failed"},
                )
                return
            self._books.worker_cancelled(counted=end is WorkerEnd.CANCELLED)
            raise

    def _watch_for_failover(self) -> None:
        """Tell the clock which server the driver sends to now (no I/O): after a failover
        the new primary's clock is measured at once, not at the next refresh."""
        self.clock.watch(self._store.primary())

    # -- long steps ---------------------------------------------------------------------

    async def heartbeat(self) -> int:
        """Extend the leases of steps running past half the lock timeout, take back those
        past ``step_timeout``, read the operators' pauses, and write this replica's record
        while it is started (when it changed, or every ``RECORD_INTERVAL``). The loop
        calls this on its own; returns leases extended."""
        return await self._heartbeat(unless_probed=False)

    async def _heartbeat(self, *, unless_probed: bool) -> int:
        """``heartbeat``; ``unless_probed`` (the loop's): the pauses are not read again if a
        tick's probe read them since the last heartbeat."""
        self._crew.enter()
        # The pauses first: a step taken back below frees its worker at once, and what
        # claims there next honours them; and nothing of this heartbeat's reads then runs
        # beside that worker's claim (a seeded run draws its faults in one order).
        await self._pauses.read(unless_probed=unless_probed)
        extended = await self._steps.heartbeat()
        await self._record.refresh()
        return extended

    async def _safe_heartbeat(self) -> None:
        """The loop's heartbeat (its timer's job, and ``run_once``'s while it waits)."""
        try:
            await self._heartbeat(unless_probed=True)
        except Exception as exc:
            logger.log(
                self._report.trouble(logging.ERROR, exc),
                "heartbeat failed",
                exc_info=exc,
                extra={**self._report.base, "outcome": "error"},
            )

    # -- running in the background ------------------------------------------------------

    async def start(self) -> None:
        """Create indexes, then keep claiming in the background: at once whenever a worker
        is free and work is due, and every ``tick`` seconds for due relocks and expired
        leases. Ticks and heartbeats come from APScheduler, coalesced, one at a time."""
        self._crew.enter()
        if self._books.timer is not None:
            raise OrchestratorError("this orchestrator is already started")
        await self.ensure_indexes()
        await measure(self.clock, self._store)  # raises if the server's clock cannot be read
        await self._pauses.read()  # a replica starting never claims paused work
        await self._record.begin()
        timer = self._crew.timer()
        tick = self.settings.tick
        timer.add_job(
            self._background_tick,
            "interval",
            seconds=tick,
            jitter=tick * self.settings.tick_jitter,
            start_date=datetime.now(UTC) + timedelta(seconds=random.uniform(0, tick)),
            id="tick",
        )
        timer.add_job(
            self._safe_heartbeat,
            "interval",
            seconds=replicas.refresh_interval(self.settings.lock_timeout),
            id="heartbeat",
        )
        self._watch_for_failover()
        if not self._books.serve(timer):
            raise OrchestratorError("this orchestrator is already started")
        timer.start()
        self._report.line(logging.INFO, "orchestrator started", "started")

    async def _background_tick(self) -> None:
        self._watch_for_failover()
        self._books.tick()

    async def _come_due(self, handlers: Sequence[Handler]) -> None:
        """A due time came for work ``handlers`` may claim (a probe announced it, or a
        rate limit's next slot): they claim now rather than at the next tick."""
        self._books.came_due(handlers)

    def request_stop(self) -> None:
        """Stop claiming now, without waiting (safe from a signal handler; in the async
        engine, call it on the event loop's thread)."""
        self._books.request_stop()

    async def stop(self, timeout: float = 10.0) -> StopReport:
        """Stop claiming, wait up to ``timeout`` seconds for running steps, hand back leases
        claimed but not started, and report what was still running (left to expire)."""
        self._crew.enter()
        self.request_stop()
        timer = self._books.take_timer()
        if timer is not None:
            timer.shutdown(wait=False)
        deadline = time.monotonic() + timeout
        while (
            not await self._crew.settled(self._books.idle, max(deadline - time.monotonic(), 0.0))
            and time.monotonic() < deadline
        ):
            pass
        self._calls.close()
        await self._record.forget()
        report = self._books.stop_report()
        level, message = stop_summary(report.released, report.still_running)
        self._report.line(level, message, "stopped")
        return report

    def stats(self) -> dict[str, int]:
        """Counts since construction: claimed, unlocked, relocked, advanced, retrying,
        failed, lost, released, extended, timed_out, ticks, tick_failures, listener_errors
        (calls of a listener that raised), ..."""
        counts = self._books.stats()
        if self._report.events.errors:
            counts["listener_errors"] = self._report.events.errors
        return counts


def _check_database(db: object, owner: str) -> None:
    """Refuse at construction a database of the other driver, or none at all: it would
    fail only later, at the first claim, with a TypeError."""
    kind = database_kind(db)
    if kind is (not _IS_SYNC):
        return
    what = {True: "an AsyncDatabase", False: "a sync Database", None: type(db).__name__}
    other = {True: ": use AsyncOrchestrator", False: ": use Orchestrator", None: ""}
    needs = (
        "a sync Database (pymongo's MongoClient, or orchestrator.testing.memory_database())"
        if _IS_SYNC
        else "an AsyncDatabase (pymongo's AsyncMongoClient, or orchestrator.testing's"
        " async_memory_database() or async_view(db))"
    )
    raise ConfigError(f"{owner} runs on {needs}, not {what[kind]}{other[kind]}")
