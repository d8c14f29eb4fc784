"""The async engine's hand-written part: plain ``def`` handlers run on daemon threads, with
a ``ThreadLease`` whose blocking outcomes run the ``AsyncLease``'s writes on the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar

from orchestrator.core.documents import Document
from orchestrator.core.errors import LeaseLost, OrchestratorError
from orchestrator.core.lease_values import Outcome
from orchestrator.core.outcomes import LeaseWrite
from orchestrator.core.registry import Handler, Target
from orchestrator.core.resource import Resource
from orchestrator.core.trees import Owner, Signal
from orchestrator.mongo import AsyncLease

__all__ = ["LOOP_CHECK", "HandlerThreads", "ThreadLease"]

R = TypeVar("R")
T = TypeVar("T")

LOOP_CHECK = 1.0
"""Seconds between a waiting ``ThreadLease``'s looks at whether its event loop still runs:
a loop stopped without cancelling the write would otherwise keep the handler's thread
waiting forever."""


class HandlerThreads:
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
    two share is what a handler calls, the ``BlockingLease`` protocol both satisfy:
    annotate a ``def`` handler ``BlockingLease[R]``, whichever engine runs it.
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

    def progress(self, fraction: float, note: str | None = None) -> None:
        self._run(self._lease.progress(fraction, note))

    @property
    def cancel_requested(self) -> bool:
        return self._lease.cancel_requested

    @property
    def owner(self) -> Owner | None:
        return self._lease.owner

    @property
    def signals(self) -> list[Signal]:
        return self._lease.signals

    def signal(self, name: str) -> Signal | None:
        return self._lease.signal(name)

    def create_child(
        self, target: Target, name: str, doc: Mapping[str, Any] | Resource
    ) -> Document:
        return self._run(self._lease.create_child(target, name, doc))

    def children(self) -> list[Document]:
        return self._run(self._lease.children())

    def move_children(self, phase: str) -> int:
        return self._run(self._lease.move_children(phase))

    def wait_for(
        self, name: str, *, then: str, timeout: Any = None, on_timeout: str | None = None
    ) -> Outcome:
        return self._run(
            self._lease.wait_for(name, then=then, timeout=timeout, on_timeout=on_timeout)
        )

    def wait_for_children(
        self,
        *,
        then: str,
        need: Any = "all",
        on_failure: str | None = None,
        cancel_siblings: bool = False,
        timeout: Any = None,
        on_timeout: str | None = None,
    ) -> Outcome:
        return self._run(
            self._lease.wait_for_children(
                then=then,
                need=need,
                on_failure=on_failure,
                cancel_siblings=cancel_siblings,
                timeout=timeout,
                on_timeout=on_timeout,
            )
        )

    def __repr__(self) -> str:
        return f"<ThreadLease of {self._lease!r}>"
