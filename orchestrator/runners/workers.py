"""The primitives the two engines do differently, hand-written in pairs and mapped by name.

``scripts/synchro.py`` generates the sync engine from the async one, turning
``AsyncWorkers`` into ``Workers`` (as PyMongo pairs ``lock.py``'s and
``periodic_executor.py``'s primitives). Each pair has the same methods: start a worker
(a task, a daemon thread), wake the idle ones and the waiters of ``run_once`` and
``stop`` (events, conditions), wait, make calls all at once (``gather``, threads), the
ticks' timer (APScheduler's ``AsyncIOScheduler``, ``BackgroundScheduler``), and how a
worker's or a step's end is read (the async engine tells cancellations apart by
``Task.cancelling()``; a thread is never cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from enum import Enum
from typing import Any, TypeVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.scheduler import Action
from orchestrator.runners.books import Books, Leave
from orchestrator.runners.reporter import logger
from orchestrator.runners.step import Step

__all__ = [
    "TIMER_DEFAULTS",
    "TIMER_LOGGER",
    "AsyncWorkers",
    "StepEnd",
    "WorkerEnd",
    "Workers",
    "best_effort",
]

T = TypeVar("T")

TIMER_DEFAULTS = {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
"""The APScheduler job defaults of the ticks and heartbeats: coalesced, one instance at a
time (a heartbeat slower than its interval never runs twice at once; missed runs are not
made up), and no grace time (a run that starts late runs, and no "missed by" line says
so)."""


class _SkipsOfOneInstance(logging.Filter):
    """Drops APScheduler's "skipped: maximum number of running instances reached": a
    heartbeat slower than its interval (the database unreachable) is skipped on purpose
    (``max_instances=1``), and said every interval it drowned the replica's own line
    saying the database is unreachable."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in str(record.msg)


TIMER_LOGGER = logging.getLogger("apscheduler.scheduler.orchestrator")
"""The logger of the replicas' timers: below APScheduler's own (its level and handlers
apply), with the skips of one instance dropped; the application's other schedulers log as
they did."""
TIMER_LOGGER.addFilter(_SkipsOfOneInstance())


def best_effort() -> contextlib.AbstractContextManager[None]:
    """Around a write whose failure leaves what it would free (a slot, a lease) to expire
    at its time: nothing it raises escapes, a cancellation included, so a worker winding
    up after a cancellation ends as it was going to."""
    return contextlib.suppress(Exception, asyncio.CancelledError)


class WorkerEnd(Enum):
    """How a worker that raised ends."""

    FAILED = "failed"
    """A bug, or the process dying: counted, and replaced at the next tick."""
    CANCELLED = "cancelled"
    """Its task was cancelled (the loop ends): it leaves the count and re-raises."""
    UNCOUNTED = "uncounted"
    """Its task, already let go by step_timeout, was cancelled: it re-raises."""
    RAISE = "raise"
    """Its coroutine was discarded with its closed loop: nothing is left to do."""


class StepEnd(Enum):
    """How a step that raised out of its engine ends."""

    INTERRUPTED = "interrupted"
    """SystemExit and the like: the lease is left to expire, the worker carries on."""
    CANCELLED = "cancelled"
    """Its worker's task was cancelled, not by step_timeout: the step leaves the books."""
    TIMED_OUT = "timed_out"
    """step_timeout cancelled it, and counted it then."""
    RAISE = "raise"
    """Not the step's to handle: re-raised."""


class AsyncWorkers:
    """Worker tasks on one event loop (the one the replica's methods are awaited on)."""

    def __init__(
        self, books: Books[Any], work: Callable[[], Coroutine[Any, Any, None]], name: str
    ) -> None:
        self._books = books
        self._work = work
        self._name = name
        self._changed = asyncio.Event()  # workers wait here; set, and replaced, on news
        self._settled = asyncio.Event()  # run_once and stop wait here; the same
        self._tasks: set[asyncio.Task[None]] = set()  # the workers, kept from the collector
        # Workers whose step step_timeout took back: no longer counted, kept till they end.
        self._abandoned: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the event loop -----------------------------------------------------------------

    def enter(self) -> None:
        """The running loop, which this replica is on from now on. A call from another
        loop moves it there once the first one ended, else it is refused (the
        ``AsyncOrchestrator`` docstring says when)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        with self._books.lock:
            old = self._loop
            if old is not None and old is not loop:
                self._leave(old)
            self._loop = loop
            self._changed, self._settled = asyncio.Event(), asyncio.Event()

    def _leave(self, old: asyncio.AbstractEventLoop) -> None:
        if old.is_running():
            raise OrchestratorError(
                "this AsyncOrchestrator runs on another event loop, which is still running: "
                "make one AsyncOrchestrator per event loop"
            )
        live = any(not t.done() for t in self._tasks | self._abandoned)
        if live or self._books.has_work():
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
        if self._books.timer is None:
            return
        if not old.is_closed():
            raise OrchestratorError(
                "this AsyncOrchestrator was started on another event loop, stopped but not "
                "closed: stop() it on that loop first"
            )
        # start() without stop(), and the loop ended: its timer can never run again.
        self._books.take_timer()
        logger.warning(
            "the event loop this replica was started on ended without stop(); it serves no "
            "more (start() it again on this loop)",
            extra={"replica": self._name, "outcome": "stopped"},
        )

    def timer(self) -> BaseScheduler:
        return AsyncIOScheduler(
            event_loop=asyncio.get_running_loop(),
            timezone=UTC,
            job_defaults=TIMER_DEFAULTS,
            logger=TIMER_LOGGER,
        )

    # -- workers ------------------------------------------------------------------------

    def spawn(self) -> None:
        task = asyncio.get_running_loop().create_task(
            self._work(), name=f"orchestrator-{self._name}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._abandoned.discard(task)

    def wake(self, *, more_work: bool, settling: bool) -> None:
        """Wake the idle workers when there may be work, and the waiters of run_once and
        stop when the replica may have settled: a waiter woken for nothing costs a turn of
        the loop and a new wait each time."""
        if more_work or settling:
            self._changed.set()
            self._changed = asyncio.Event()
        if settling:
            self._settled.set()
            self._settled = asyncio.Event()

    async def next_action(self) -> Action | Step[Any] | None:
        """The worker's next action, waiting for news meanwhile; None: it leaves."""
        while True:
            with self._books.lock:
                got = self._books.next_action()
                changed = self._changed
            if isinstance(got, Leave):
                return None
            if got is not None:
                return got
            await changed.wait()

    async def settled(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``ready()`` (checked under the lock), at most ``timeout`` seconds
        (``asyncio.timeout``: no task per wait); whether it is."""
        with self._books.lock:
            if ready():
                return True
            settled = self._settled
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await settled.wait()
        with self._books.lock:
            return ready()

    @staticmethod
    async def all_at_once(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T | BaseException]:
        """The calls' coroutines, awaited together: each one's result or exception."""
        return await asyncio.gather(*(call() for call in calls), return_exceptions=True)

    # -- how things end -----------------------------------------------------------------

    @staticmethod
    def begin_step(step: Step[Any]) -> None:
        """The step runs in this worker's task (a task per step cost two more turns of the
        loop per step): step_timeout cancels that task."""
        step.task = asyncio.current_task()

    def let_go(self, step: Step[Any]) -> bool:
        """step_timeout took ``step`` back: its task is cancelled (an async step ends at the
        cancellation, a thread step's await does, and one that ignores it keeps its task
        but not the slot); True when its worker no longer counts."""
        task = step.task
        if task is None or task.done():
            return False
        self._abandoned.add(task)
        task.cancel()
        return True

    @staticmethod
    def cancelling(exc: BaseException) -> bool:
        """``exc`` is this task's own cancellation, not an error a call raised (a handler
        awaiting a future another task cancelled raises one while nobody cancels it)."""
        if not isinstance(exc, asyncio.CancelledError):
            return False
        task = asyncio.current_task()
        return task is None or task.cancelling() > 0

    def worker_end(self, exc: BaseException) -> WorkerEnd:
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                return WorkerEnd.FAILED  # nobody's cancellation: a bug
            return WorkerEnd.UNCOUNTED if task in self._abandoned else WorkerEnd.CANCELLED
        if isinstance(exc, GeneratorExit):
            return WorkerEnd.RAISE
        return WorkerEnd.FAILED

    @staticmethod
    def step_end(exc: BaseException, step: Step[Any]) -> StepEnd:
        if isinstance(exc, asyncio.CancelledError):
            task = step.task
            if task is None:
                return StepEnd.RAISE
            if step.abandoned:  # cancelled by someone else too: it ends cancelled
                return StepEnd.RAISE if task.uncancel() else StepEnd.TIMED_OUT
            return StepEnd.CANCELLED if task.cancelling() else StepEnd.INTERRUPTED
        if isinstance(exc, GeneratorExit):
            return StepEnd.RAISE
        return StepEnd.INTERRUPTED


class Workers:
    """Worker threads; they wait on conditions of the books' lock."""

    def __init__(self, books: Books[Any], work: Callable[[], None], name: str) -> None:
        self._books = books
        self._work = work
        self._name = name
        self._changed = threading.Condition(books.lock)  # workers wait here for an action
        self._settled = threading.Condition(books.lock)  # run_once and stop wait here

    def enter(self) -> None:
        """Threads have no loop to be bound to."""

    @staticmethod
    def timer() -> BaseScheduler:
        return BackgroundScheduler(timezone=UTC, job_defaults=TIMER_DEFAULTS, logger=TIMER_LOGGER)

    def spawn(self) -> None:
        threading.Thread(target=self._work, name=f"orchestrator-{self._name}", daemon=True).start()

    def wake(self, *, more_work: bool, settling: bool) -> None:
        """Wake one more worker when there may be work for it (it wakes the next in turn
        if it finds some), everyone when the replica may have settled: waking every thread
        at every step cost a context switch each under the GIL. The caller holds the lock."""
        if settling:
            self._changed.notify_all()  # idle workers of run_once leave when quiet
            self._settled.notify_all()
        elif more_work:
            self._changed.notify()

    def next_action(self) -> Action | Step[Any] | None:
        with self._books.lock:
            while True:
                got = self._books.next_action()
                if isinstance(got, Leave):
                    return None
                if got is not None:
                    return got
                self._changed.wait()

    def settled(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        with self._books.lock:
            if ready():
                return True
            self._settled.wait(timeout)
            return ready()

    def all_at_once(self, calls: Sequence[Callable[[], T]]) -> list[T | BaseException]:
        """Each call on a thread of its own (one here), all waited for."""
        if len(calls) == 1:
            return [_result_of(calls[0])]
        with ThreadPoolExecutor(len(calls), f"orchestrator-{self._name}-beat") as pool:
            return list(pool.map(_result_of, calls))

    @staticmethod
    def begin_step(step: Step[Any]) -> None:
        """The step runs on this worker's thread."""

    @staticmethod
    def let_go(step: Step[Any]) -> bool:
        """Its worker thread is stuck in the step: a fresh worker takes its place."""
        return True

    @staticmethod
    def cancelling(exc: BaseException) -> bool:
        """Nobody cancels a thread: a ``CancelledError`` here is the call's own error."""
        return False

    @staticmethod
    def worker_end(exc: BaseException) -> WorkerEnd:
        return WorkerEnd.FAILED

    @staticmethod
    def step_end(exc: BaseException, step: Step[Any]) -> StepEnd:
        return StepEnd.INTERRUPTED


def _result_of(call: Callable[[], T]) -> T | BaseException:
    """What ``call`` returned, or the exception it raised."""
    try:
        return call()
    except Exception as exc:
        return exc
