"""Replicas of either engine behind one async face, so a behaviour is tested once for both.

``Replica`` gives the threaded ``Orchestrator`` and the ``AsyncOrchestrator`` the same
awaitable methods (the threaded ones run in a worker thread, so a step held in one replica
never blocks the event loop the others run on). A step is written once as an
``async def`` taking a lease whose outcomes are awaited: the async engine awaits it as its
handler; the threaded engine runs it with ``asyncio.run`` in its worker thread, over an
``AwaitableLease`` around the sync ``Lease``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio.to_thread

from orchestrator import (
    AsyncOrchestrator,
    BlockingLease,
    Delivered,
    Lease,
    Orchestrator,
    Outcome,
    Settings,
    StopReport,
)
from orchestrator.core.clock import Clock, ServerClock
from orchestrator.core.registry import Target

Body = Callable[[Any], Awaitable[Any]]
MODES = ("threaded", "async", "mixed")
"""The engines a test runs on; ``mixed``: threaded and async replicas in turn on one database."""


class AwaitableLease:
    """A ``BlockingLease`` (the sync ``Lease`` here) with the ``AsyncLease``'s awaitable
    outcomes: a test's step is written once, as an ``async def``, for both engines."""

    def __init__(self, lease: BlockingLease[Any]) -> None:
        self._lease = lease

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lease, name)

    async def unlock(self, **fields: Any) -> Outcome:
        return self._lease.unlock(**fields)

    async def relock(self, wait: float | None = None, **fields: Any) -> Outcome:
        return self._lease.relock(wait, **fields)

    async def advance(self, phase: str, **fields: Any) -> Outcome:
        return self._lease.advance(phase, **fields)

    async def fail(self, reason: str) -> Outcome:
        return self._lease.fail(reason)

    async def remove(self) -> Outcome:
        return self._lease.remove()

    async def extend(self) -> None:
        self._lease.extend()

    async def progress(self, fraction: float, note: str | None = None) -> None:
        self._lease.progress(fraction, note)

    async def create_child(self, target: Target, name: str, doc: Any) -> dict[str, Any]:
        return self._lease.create_child(target, name, doc)

    async def children(self) -> list[dict[str, Any]]:
        return self._lease.children()

    async def move_children(self, phase: str) -> int:
        return self._lease.move_children(phase)

    async def wait_for(self, name: str, **given: Any) -> Outcome:
        return self._lease.wait_for(name, **given)

    async def wait_for_children(self, **given: Any) -> Outcome:
        return self._lease.wait_for_children(**given)


class Replica:
    """One replica of either engine, with awaitable methods."""

    def __init__(self, orch: Orchestrator | AsyncOrchestrator) -> None:
        self.orch = orch
        self.threaded = isinstance(orch, Orchestrator)

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.orch, name)
        if self.threaded:
            return await anyio.to_thread.run_sync(partial(method, *args, **kwargs))
        return await method(*args, **kwargs)

    async def submit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await self._call("submit", *args, **kwargs)  # type: ignore[no-any-return]

    async def run_once(self, *, heartbeat: bool = True) -> dict[str, int]:
        return await self._call("run_once", heartbeat=heartbeat)  # type: ignore[no-any-return]

    async def signal(self, *args: Any, **kwargs: Any) -> Delivered:
        return await self._call("signal", *args, **kwargs)  # type: ignore[no-any-return]

    async def measure_clock(self) -> None:
        await self._call("measure_clock")

    async def heartbeat(self) -> int:
        return await self._call("heartbeat")  # type: ignore[no-any-return]

    async def start(self) -> None:
        await self._call("start")

    async def stop(self, timeout: float = 5) -> StopReport:
        return await self._call("stop", timeout)  # type: ignore[no-any-return]

    @property
    def clock(self) -> ServerClock:
        return self.orch.clock

    @property
    def settings(self) -> Settings:
        return self.orch.settings

    def request_stop(self) -> None:
        self.orch.request_stop()

    def stats(self) -> dict[str, int]:
        return self.orch.stats()

    def phase(self, target: Target, phase: str, **opts: Any) -> Callable[[Body], Body]:
        """Register ``body`` as this replica's step for ``target`` in ``phase``."""
        return self._register(self.orch.phase(target, phase, **opts))

    def when(self, target: Target, match: dict[str, Any], **opts: Any) -> Callable[[Body], Body]:
        """Register ``body`` as this replica's step for documents of ``target`` matching."""
        return self._register(self.orch.when(target, match, **opts))

    def schedule(self, name: str, target: Target, **opts: Any) -> Callable[[Any], Any]:
        """Declare a schedule: its function is a plain ``def`` (both engines run one)."""
        return self.orch.schedule(name, target, **opts)

    def _register(self, decorator: Callable[[Any], Any]) -> Callable[[Body], Body]:
        def register(body: Body) -> Body:
            if self.threaded:

                def step(lease: Lease[Any]) -> Any:
                    return asyncio.run(_awaited(body, AwaitableLease(lease)))

                step.__module__, step.__qualname__ = body.__module__, body.__qualname__
                decorator(step)
            else:
                decorator(body)
            return body

        return register


def new_replica(
    mode: str, index: int, db: Any, adb: Any, local: Clock, replica_id: str, **options: Any
) -> Replica:
    """The ``index``-th replica of a test in ``mode`` (``MODES``) on ``db`` (sync) or
    ``adb`` (its async view), with the tests' default settings; its local clock is
    ``local`` unless ``options`` name another."""
    options.setdefault("lock_timeout", 30)
    options.setdefault("tick", 1.0)
    options.setdefault("clock_refresh", 1e6)
    options.setdefault("clock", local)
    if mode == "threaded" or (mode == "mixed" and index % 2 == 0):
        return Replica(Orchestrator(db, replica_id=replica_id, **options))
    return Replica(AsyncOrchestrator(adb, replica_id=replica_id, **options))


async def _awaited(body: Body, lease: AwaitableLease) -> Any:
    return await body(lease)


async def wait(event: threading.Event, timeout: float = 10) -> bool:
    """Wait for a thread-safe event without blocking the event loop (abandoned if the
    waiting task is cancelled, as step_timeout does to an async step)."""
    return await anyio.to_thread.run_sync(event.wait, timeout, abandon_on_cancel=True)


def hold(replica: Replica, action: str = "advance", phase: str = "Running") -> dict[str, Any]:
    """A step that signals ``claimed``, waits for ``go``, then tries ``action`` (advance to
    "Done"); a ``LeaseLost`` is kept as ``lost``, a cancellation as ``cancelled``."""
    box: dict[str, Any] = {
        "claimed": threading.Event(),
        "go": threading.Event(),
        "returned": threading.Event(),
    }

    @replica.phase("jobs", phase)
    async def held(lease: Any) -> Any:
        box["lease"] = lease
        box["claimed"].set()
        try:
            await wait(box["go"])
        except asyncio.CancelledError:
            box["cancelled"] = True
            raise
        try:
            if action == "advance":
                return await lease.advance("Done")
            return await getattr(lease, action)()
        except Exception as exc:
            box["lost"] = exc
            raise
        finally:
            box["returned"].set()

    return box
