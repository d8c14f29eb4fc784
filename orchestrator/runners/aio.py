"""The asyncio runner: ``AsyncOrchestrator``, on the application's own event loop.

It uses only the async driver (``AsyncStore`` over an ``AsyncDatabase``): no second, sync
client. ``max_concurrency`` worker tasks ask the scheduler for actions and carry them out
by awaiting the shared plans of ``orchestrator.runners.base``. A step is awaited in its
worker's task: ``async def`` handlers are awaited there; plain ``def`` handlers (blocking
SDKs) run on daemon threads (``_HandlerThreads``), in the step's context, and get a
``ThreadLease``, whose methods run the ``AsyncLease``'s coroutines on the loop and wait
for them. step_timeout cancels the step's task and puts a fresh worker in its place at
once, as the threaded runner replaces a stuck thread: a step that ignores the
cancellation keeps its task, never the slot.

Cancellations are told apart by ``Task.cancelling()``: a ``CancelledError`` while the
task is not being cancelled is the handler's own error, recorded like any other; the
task's own cancellation is step_timeout's (the step was counted then) or the loop's end
(the step leaves the books and its lease is left to expire).

Ticks and heartbeats come from APScheduler's ``AsyncIOScheduler``, the async twin of the
threaded runner's ``BackgroundScheduler``: the same coalescing, one-instance jobs, with
coroutine jobs run on the application's loop, and one scheduler library for both runners.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import queue
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core.errors import LeaseLost, OrchestratorError
from orchestrator.core.lease import Outcome
from orchestrator.core.outcomes import LeaseWrite, StepOutcome
from orchestrator.core.registry import Handler, Target
from orchestrator.core.resource import Resource
from orchestrator.mongo import AsyncLease, AsyncStore
from orchestrator.mongo._async.clock import measure
from orchestrator.mongo.common import Document
from orchestrator.runners.base import TIMER_DEFAULTS, Runner, Step, StopReport, adrive, logger

__all__ = ["AsyncOrchestrator", "ThreadLease"]

R = TypeVar("R")
T = TypeVar("T")

LOOP_CHECK = 1.0
"""Seconds between a waiting ``ThreadLease``'s looks at whether its event loop still runs:
a loop stopped without cancelling the write would otherwise keep the handler's thread
waiting forever."""


class AsyncOrchestrator(Runner[AsyncDatabase[Document]]):
    """Register handlers with ``phase``/``when`` (``async def`` or plain ``def``), then
    ``await start()`` in every replica, e.g. in a FastAPI lifespan.

    ``db`` is a PyMongo ``AsyncDatabase`` (or ``orchestrator.testing.async_memory_database()``).
    Settings and ``clock`` are ``Orchestrator``'s.

    It runs on one event loop at a time: the one its methods are awaited on. A loop that
    ends cancels its workers, and a step cancelled so leaves the books (counted
    ``interrupted``, its lease left to expire); the next call on another loop then moves
    the replica there (a ``start()`` without ``stop()`` ended with its loop). A call from
    another loop raises ``OrchestratorError`` while the first still runs, while it is
    stopped but open with this replica's work on it (it may run again), or when it was
    closed without cancelling that work (``loop.close()``, unlike ``asyncio.run``). PyMongo's
    ``AsyncMongoClient`` binds to its first loop for good: on a server, make the client and
    the orchestrator per loop.
    """

    _engine = "async"
    _database_help = (
        "an AsyncDatabase (pymongo's AsyncMongoClient, or orchestrator.testing's"
        " async_memory_database() or async_view(db))"
    )
    _store_type = AsyncStore
    _lease_type = AsyncLease
    _measure = staticmethod(measure)
    _pool: _HandlerThreads | None = None  # for plain def handlers, made on need

    def _setup(self) -> None:
        self._changed = asyncio.Event()  # workers wait here; set, and replaced, on news
        self._settled_event = asyncio.Event()  # run_once and stop wait here; the same
        self._tasks: set[asyncio.Task[Any]] = set()  # the workers, kept from the collector
        # Workers whose step step_timeout took back: no longer counted, kept till they end.
        self._abandoned: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # where the tasks and events live

    def _enter_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, which this replica is on from now on (see the class docstring)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return loop
        with self._cv:
            old = self._loop
            if old is not None and old is not loop:
                self._leave_loop(old)
            self._loop = loop
            self._changed, self._settled_event = asyncio.Event(), asyncio.Event()
        return loop

    def _leave_loop(self, old: asyncio.AbstractEventLoop) -> None:
        """Move off ``old`` (the caller holds ``_cv``), or refuse to while it may still run
        this replica's work, or was closed with work on it."""
        if old.is_running():
            raise OrchestratorError(
                "this AsyncOrchestrator runs on another event loop, which is still running: "
                "make one AsyncOrchestrator per event loop"
            )
        live = any(not t.done() for t in self._tasks | self._abandoned)
        if live or self._running or self._sched.busy:
            if old.is_closed():
                raise OrchestratorError(
                    "the event loop this AsyncOrchestrator ran on was closed with its steps or "
                    "workers still on it (asyncio.run cancels them first; loop.close() does "
                    "not): make a new AsyncOrchestrator"
                )
            raise OrchestratorError(
                "this AsyncOrchestrator has work on another event loop, stopped but not "
                "closed (it may run again): stop() it on that loop, or cancel its tasks, first"
            )
        if self._timer is None:
            return
        if not old.is_closed():
            raise OrchestratorError(
                "this AsyncOrchestrator was started on another event loop, stopped but not "
                "closed: stop() it on that loop first"
            )
        # start() without stop(), and the loop ended: its timer can never run again.
        self._timer, self._serving = None, False
        logger.warning(
            "the event loop this replica was started on ended without stop(); it serves no "
            "more (start() it again on this loop)",
            extra={**self._log_base, "outcome": "stopped"},
        )

    def _notify(self, *, more_work: bool, everyone: bool = False) -> None:
        """Wake the idle workers when there may be work, and the waiters of run_once and
        stop when the replica may have settled (``_settling``): a waiter woken for nothing
        costs a turn of the loop and a new wait each time, at every step."""
        settling = everyone or self._settling()
        if more_work or settling:
            self._changed.set()
            self._changed = asyncio.Event()
        if settling:
            self._settled_event.set()
            self._settled_event = asyncio.Event()

    @staticmethod
    async def _until(event: asyncio.Event, timeout: float | None = None) -> None:
        """Wait until ``event`` is set, at most ``timeout`` seconds (``asyncio.timeout``:
        no task per wait, as ``wait_for`` makes on Python 3.11)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    # -- documents ------------------------------------------------------------------------

    async def submit(
        self,
        target: Target,
        doc: Mapping[str, Any] | Resource,
        *,
        unique: str | Iterable[str] | None = None,
    ) -> Document:
        """``Orchestrator.submit``, awaited: idempotent by the unique keys."""
        self._enter_loop()
        return await adrive(self._submit(target, doc, unique))

    async def ensure_indexes(self) -> None:
        """The claim index on every registered collection, and the unique keys of submit."""
        self._enter_loop()
        await adrive(self._ensure_indexes())

    async def measure_clock(self) -> None:
        """Measure the server's clock if a measurement is due (workers do before each
        action, and the heartbeat); with no estimate yet a failure raises ``StoreError``."""
        self._enter_loop()
        await adrive(self._measure_if_due())

    # -- the loop -------------------------------------------------------------------------

    async def run_once(self) -> dict[str, int]:
        """One tick: claim and run steps until no handler finds work and every step started
        has finished. Returns the outcome counts of this tick."""
        loop = self._enter_loop()
        before = self._begin_once()
        interval = min(self.settings.tick, self.settings.lock_timeout / 6)
        beat = loop.time() + interval
        while not self._once_over():
            await self._until(self._settled_event, max(beat - loop.time(), 0.0))
            if loop.time() >= beat:  # long steps' leases are kept alive meanwhile
                await self._safe_heartbeat()
                beat = loop.time() + interval
        return self._end_once(before)

    def _spawn_worker(self) -> None:
        task = asyncio.get_running_loop().create_task(
            self._work(), name=f"orchestrator-{self.replica_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._abandoned.discard(task)

    async def _work(self) -> None:
        """A worker: take actions until there are none and the replica is not serving, or
        until step_timeout takes its step back (a fresh worker has its place then)."""
        try:
            while True:
                with self._cv:
                    action = self._sched.next()
                    leave = action is None and self._worker_exit()
                if leave:
                    return
                if action is None:
                    await self._until(self._changed)
                    continue
                if not await adrive(self._act(action)):
                    return
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                self._worker_failed(exc)  # nobody's cancellation: a bug, as below
                return
            with self._cv:  # the loop is ending, or the application cancelled the worker
                if task not in self._abandoned:
                    self._workers -= 1
                self._notify(more_work=False)
            raise
        except GeneratorExit:  # the task's coroutine discarded with its closed loop
            raise
        except BaseException as exc:  # not a StoreError: a bug
            self._worker_failed(exc)

    async def _run_step(self, step: Step, stopping: bool) -> str | None:
        """The step, in the worker's own task: a task per step cost two more turns of the
        event loop per step. step_timeout cancels that task (``_abandon``), which then
        ends (None: the time-out counted the step). Any other cancellation of the task (the
        loop ending, the application) takes the step off the books (``_cancelled``) and
        ends the worker; a ``CancelledError`` nobody asked for that reaches here is the
        step's, as SystemExit is (``_interrupted``)."""
        task = step.task = asyncio.current_task()
        try:
            outcome = await adrive(self._step(step, stopping))
        except asyncio.CancelledError:
            if task is None:
                raise
            if step.abandoned:
                if task.uncancel():  # cancelled by someone else too: it ends cancelled
                    raise
                return None
            if task.cancelling():
                self._cancelled(step)
                raise
            outcome = self._interrupted(step)
        except GeneratorExit:  # the task's coroutine discarded with its closed loop
            raise
        except BaseException:
            outcome = self._interrupted(step)
        if step.abandoned:
            self._log(
                logging.WARNING,
                f"step returned ({outcome}) after step_timeout had cancelled it and taken its "
                "lease and slot back; it ignored the cancellation; nothing more is counted",
                step.lease,
                "abandoned",
            )
        return outcome

    def _cancelled(self, step: Step) -> None:
        """The step's worker was cancelled, not by step_timeout: the loop is ending (or the
        application cancelled it). The step leaves the books at once (its slot is free,
        the heartbeat no longer extends its lease), and its lease is left to expire rather
        than handed back: the step stopped part-way (a ``def`` step's thread may even run
        on), so no other replica may start it before its lease runs out; and a write now
        would hold up the loop's end, which may never run it."""
        with self._cv:
            if self._running.pop(step.lease.token, None) is None:
                return
            self._stats["interrupted"] += 1
            self._sched.finished(StepOutcome.INTERRUPTED)
            self._notify(more_work=False)
        self._log(
            logging.WARNING,
            "step cancelled with its worker (the event loop is ending?); lease left to expire",
            step.lease,
            "interrupted",
        )
        if self._events.active:
            self._step_finished(step, "interrupted")

    def _call_handler(self, step: Step) -> Any:
        func = step.lease.handler.func
        if inspect.iscoroutinefunction(func):
            return func(step.lease)
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = _HandlerThreads(
                f"orchestrator-{self.replica_id}-step", self.settings.max_concurrency
            )
        # The step's context goes with it (copied here, in the step's await): a run_once
        # the thread asks the loop for is refused as re-entrant, as on the loop itself.
        context = contextvars.copy_context()
        return self._pool.submit(loop, context.run, func, ThreadLease(step.lease, loop))

    async def _all_at_once(self, calls: list[Callable[[], Any]]) -> list[Any]:
        """The calls' coroutines, awaited together."""
        return await asyncio.gather(*(call() for call in calls), return_exceptions=True)

    def _abandon(self, step: Step) -> None:
        # The step's task is cancelled and a fresh worker takes its place at once: an async
        # step ends at the cancellation, a thread step's await does (the thread returns on
        # its own), and one that ignores it keeps its task but not the slot. Whatever it
        # writes later raises LeaseLost; the task ends with the step, counted no more.
        task = step.task
        if task is not None and not task.done():
            self._abandoned.add(task)
            self._workers -= 1
            task.cancel()
        self._top_up_workers()

    # -- long steps -----------------------------------------------------------------------

    async def heartbeat(self) -> int:
        """Extend the leases of steps running past half the lock timeout, take back those
        past ``step_timeout``, and refresh this replica's record while it is started. The
        loop calls this on its own; returns leases extended."""
        self._enter_loop()
        return await adrive(self._heartbeat())

    async def _safe_heartbeat(self) -> None:
        try:
            await self.heartbeat()
        except Exception:
            logger.exception("heartbeat failed", extra={**self._log_base, "outcome": "error"})

    # -- running in the background --------------------------------------------------------

    async def start(self) -> None:
        """Create indexes, then keep claiming on this event loop: at once whenever a worker
        is free and work is due, and every ``tick`` seconds for due relocks and expired
        leases."""
        loop = self._enter_loop()
        self._refuse_restart()
        await self.ensure_indexes()
        await measure(self.clock, self._store)  # raises if the server's clock cannot be read
        await adrive(self._begin_record())
        self._serve(AsyncIOScheduler(event_loop=loop, timezone=UTC, job_defaults=TIMER_DEFAULTS))

    async def _background_tick(self) -> None:
        with self._cv:
            self._tick()

    async def stop(self, timeout: float = 10.0) -> StopReport:
        """Stop claiming, wait up to ``timeout`` seconds for running steps, hand back leases
        claimed but not started, and report what was still running (left to expire)."""
        loop = self._enter_loop()
        self._stop_serving()
        deadline = loop.time() + timeout
        while self._sched.busy and loop.time() < deadline:
            await self._until(self._settled_event, deadline - loop.time())
        if self._pool is not None:
            self._pool.close()  # a thread step still running keeps its (daemon) thread
            self._pool = None
        await adrive(self._forget_replica())
        return self._stop_report()


class _HandlerThreads:
    """The daemon threads that run plain ``def`` handlers, one step per thread at a time.

    Not a ``ThreadPoolExecutor``: the interpreter joins an executor's threads at exit, so
    a step that never returns would keep the process alive after ``stop`` gave up on it
    (SIGTERM would not end it). A daemon thread is left behind instead, and the step's
    lease expires. Nor a fixed number of threads: a step abandoned past step_timeout keeps
    its thread, and the next step must not queue behind it, so a step with no idle thread
    gets a new one (as the threaded runner replaces a stuck worker). At most ``keep`` idle
    threads wait for the next step; ``close`` lets them go.
    """

    def __init__(self, name: str, keep: int) -> None:
        self._name = name
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None] | None]] = []
        self._closed = False

    def submit(
        self, loop: asyncio.AbstractEventLoop, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run ``func(*args)`` on an idle thread, or a new one; its result as a future of
        ``loop``. What it raises arrives as it is: ``asyncio.wrap_future`` would turn a
        ``concurrent.futures.CancelledError`` into the awaiting task's cancellation."""
        future: asyncio.Future[T] = loop.create_future()

        def deliver(setter: Callable[[Any], None], value: Any) -> None:
            def settle() -> None:
                if not future.done():  # cancelled: its worker went on without it
                    setter(value)

            # RuntimeError: the loop is closed, and no one waits for this step any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle)

        def job() -> None:
            if future.cancelled():
                return  # cancelled while it waited
            try:
                result = func(*args)
            except StopIteration as exc:  # a future cannot hold it; PEP 479's RuntimeError
                error = RuntimeError(f"the handler raised StopIteration: {exc}")
                error.__cause__ = exc
                deliver(future.set_exception, error)
            except BaseException as exc:  # SystemExit too: the step's await classifies it
                deliver(future.set_exception, exc)
            else:
                deliver(future.set_result, result)

        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name=self._name, daemon=True
            ).start()
        inbox.put(job)
        return future

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (job := inbox.get()) is not None:
            job()
            del job  # nothing of the finished step is kept alive by an idle thread
            with self._lock:
                if self._closed or len(self._idle) >= self._keep:
                    return
                self._idle.append(inbox)

    def close(self) -> None:
        """Let the idle threads go; a busy one ends after its step."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


class ThreadLease(Generic[R]):
    """What a plain ``def`` handler gets in the ``AsyncOrchestrator``: the ``Lease`` API,
    each outcome run as the ``AsyncLease``'s coroutine on the event loop while the
    handler's thread waits for it. Its outcomes are the ``AsyncLease``'s own.

    Deliberately not a ``Lease`` (``isinstance(lease, Lease)`` is False): it has no state
    of its own but is a view on the ``AsyncLease`` the runner judges the step by, and a
    ``Lease`` writes through a sync ``Store``, which the async engine (the async driver
    only) does not have; a subclass would inherit writes that must never run. What the
    two share is what a handler calls, so annotate a ``def`` handler of the async engine
    ``ThreadLease[R]``, and one run by both engines ``Lease[R] | ThreadLease[R]``.
    """

    def __init__(self, lease: AsyncLease[R], loop: asyncio.AbstractEventLoop) -> None:
        self._lease = lease
        self._loop = loop

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the step's loop and wait for it; ``LeaseLost`` at once when
        that loop is closed or not running (nothing would ever run the write), or when it
        stops, or cancels the write as it ends, while this waits."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coroutine.close()
            raise OrchestratorError(
                "a ThreadLease waits for the event loop: on the loop, await the AsyncLease"
            )
        if loop.is_closed() or not loop.is_running():
            coroutine.close()
            raise self._gone("is not running")
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        except RuntimeError as exc:  # closed since the look above
            coroutine.close()
            raise self._gone("is closed") from exc
        while not concurrent.futures.wait((future,), LOOP_CHECK).done:
            if not loop.is_running():
                if not loop.is_closed():
                    future.cancel()  # should the loop run again, the write does not
                raise self._gone("stopped while the write waited")
        if future.cancelled():
            raise self._gone("cancelled the write as it ended")
        return future.result()

    def _gone(self, why: str) -> LeaseLost:
        lease = self._lease
        return LeaseLost(
            lease.collection, lease.id, lease.token, LeaseWrite.WRITE, f"its event loop {why}"
        )

    @property
    def doc(self) -> dict[str, Any]:
        return self._lease.doc

    @property
    def resource(self) -> R:
        return self._lease.resource

    @property
    def handler(self) -> Handler:
        return self._lease.handler

    @property
    def token(self) -> str:
        return self._lease.token

    @property
    def id(self) -> Any:
        return self._lease.id

    @property
    def collection(self) -> str:
        return self._lease.collection

    @property
    def phase(self) -> str | None:
        return self._lease.phase

    @property
    def held(self) -> bool:
        return self._lease.held

    @property
    def lost(self) -> bool:
        return self._lease.lost

    @property
    def outcome(self) -> Outcome | None:
        return self._lease.outcome

    @property
    def claimed_at(self) -> datetime:
        return self._lease.claimed_at

    @property
    def locked_at(self) -> datetime:
        return self._lease.locked_at

    @property
    def expires_at(self) -> datetime:
        return self._lease.expires_at

    def expired(self, now: datetime) -> bool:
        return self._lease.expired(now)

    def unlock(self, **fields: Any) -> Outcome:
        return self._run(self._lease.unlock(**fields))

    def relock(self, wait: float | None = None, **fields: Any) -> Outcome:
        return self._run(self._lease.relock(wait, **fields))

    def advance(self, phase: str, **fields: Any) -> Outcome:
        return self._run(self._lease.advance(phase, **fields))

    def fail(self, reason: str) -> Outcome:
        return self._run(self._lease.fail(reason))

    def remove(self) -> Outcome:
        return self._run(self._lease.remove())

    def extend(self) -> None:
        self._run(self._lease.extend())

    def __repr__(self) -> str:
        return f"<ThreadLease of {self._lease!r}>"
