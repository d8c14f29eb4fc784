"""The asyncio runner: ``AsyncOrchestrator``, on the application's own event loop.

It uses only the async driver (``AsyncStore`` over an ``AsyncDatabase``): no second, sync
client. ``max_concurrency`` worker tasks ask the scheduler for actions and carry them out
by awaiting the shared plans of ``orchestrator.runners.base``. A step is awaited in its
worker's task, which step_timeout cancels to free the slot (the worker outlives that
cancellation and takes the next action): ``async def`` handlers are awaited there; plain
``def`` handlers (blocking SDKs) run on daemon threads (``_HandlerThreads``), in the
step's context, and get a ``ThreadLease``, whose methods run the ``AsyncLease``'s
coroutines on the loop and wait for them.

Ticks and heartbeats come from APScheduler's ``AsyncIOScheduler``, the async twin of the
threaded runner's ``BackgroundScheduler``: the same coalescing, one-instance jobs, with
coroutine jobs run on the application's loop, and one scheduler library for both runners.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import queue
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.lease import Outcome
from orchestrator.core.registry import Handler, Target
from orchestrator.core.resource import Resource
from orchestrator.mongo import AsyncLease, AsyncStore
from orchestrator.mongo._async.clock import measure
from orchestrator.mongo.common import Document
from orchestrator.runners.base import TIMER_DEFAULTS, Runner, Step, StopReport, adrive, logger

__all__ = ["AsyncOrchestrator", "ThreadLease"]

R = TypeVar("R")
T = TypeVar("T")


class AsyncOrchestrator(Runner[AsyncDatabase[Document]]):
    """Register handlers with ``phase``/``when`` (``async def`` or plain ``def``), then
    ``await start()`` in every replica, e.g. in a FastAPI lifespan.

    ``db`` is a PyMongo ``AsyncDatabase`` (or ``orchestrator.testing.async_memory_database()``).
    Settings and ``clock`` are ``Orchestrator``'s.
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
        return await adrive(self._submit(target, doc, unique))

    async def ensure_indexes(self) -> None:
        """The claim index on every registered collection, and the unique keys of submit."""
        await adrive(self._ensure_indexes())

    async def measure_clock(self) -> None:
        """Measure the server's clock if a measurement is due (workers do before each
        action, and the heartbeat); with no estimate yet a failure raises ``StoreError``."""
        await adrive(self._measure_if_due())

    # -- the loop -------------------------------------------------------------------------

    async def run_once(self) -> dict[str, int]:
        """One tick: claim and run steps until no handler finds work and every step started
        has finished. Returns the outcome counts of this tick."""
        before = self._begin_once()
        loop = asyncio.get_running_loop()
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
        task.add_done_callback(self._tasks.discard)

    async def _work(self) -> None:
        """A worker: take actions until there are none and the replica is not serving."""
        while True:
            with self._cv:
                action = self._sched.next()
                leave = action is None and self._worker_exit()
            if leave:
                return
            if action is None:
                await self._until(self._changed)
                continue
            try:
                await adrive(self._act(action))
            except asyncio.CancelledError:
                with self._cv:
                    self._workers -= 1
                raise
            except BaseException as exc:  # not a StoreError: a bug
                self._worker_failed(exc)
                return

    async def _run_step(self, step: Step, stopping: bool) -> str | None:
        """The step, in the worker's own task: a task per step cost two more turns of the
        event loop per step. step_timeout cancels that task (``_abandon``); its
        cancellation ends the step here, and the worker carries on: None then (the
        time-out counted it). A cancellation from anyone else ends the worker."""
        task = step.task = asyncio.current_task()
        try:
            outcome = await adrive(self._step(step, stopping))
        except asyncio.CancelledError:
            if step.abandoned and task is not None and task.uncancel() == 0:
                return None
            raise
        except BaseException:
            outcome = self._interrupted(step)
        if step.abandoned and task is not None and task.cancelling():
            task.uncancel()  # the step swallowed the time-out's cancellation and returned
        return outcome

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
        call = self._pool.submit(context.run, func, ThreadLease(step.lease, loop))
        return asyncio.wrap_future(call, loop=loop)

    async def _all_at_once(self, calls: list[Callable[[], Any]]) -> list[Any]:
        """The calls' coroutines, awaited together."""
        return await asyncio.gather(*(call() for call in calls), return_exceptions=True)

    def _abandon(self, step: Step) -> None:
        # The step's await is cancelled: an async step ends there; a thread step is left
        # to return on its own (its late writes raise LeaseLost). Either way its worker is
        # free at once.
        if step.task is not None:
            step.task.cancel()

    # -- long steps -----------------------------------------------------------------------

    async def heartbeat(self) -> int:
        """Extend the leases of steps running past half the lock timeout, take back those
        past ``step_timeout``, and refresh this replica's record while it is started. The
        loop calls this on its own; returns leases extended."""
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
        self._refuse_restart()
        await self.ensure_indexes()
        await measure(self.clock, self._store)  # raises if the server's clock cannot be read
        await adrive(self._begin_record())
        loop = asyncio.get_running_loop()
        self._serve(AsyncIOScheduler(event_loop=loop, timezone=UTC, job_defaults=TIMER_DEFAULTS))

    async def _background_tick(self) -> None:
        with self._cv:
            self._tick()

    async def stop(self, timeout: float = 10.0) -> StopReport:
        """Stop claiming, wait up to ``timeout`` seconds for running steps, hand back leases
        claimed but not started, and report what was still running (left to expire)."""
        self._stop_serving()
        loop = asyncio.get_running_loop()
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

    def submit(self, func: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``func(*args)`` on an idle thread, or a new one; its future result."""
        future: Future[T] = Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return  # cancelled while it waited
            try:
                result = func(*args)
            except BaseException as exc:  # SystemExit too: the step's await classifies it
                future.set_exception(exc)
            else:
                future.set_result(result)

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
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coroutine.close()
            raise OrchestratorError(
                "a ThreadLease waits for the event loop: on the loop, await the AsyncLease"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

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
