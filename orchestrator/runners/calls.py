"""How each engine calls a handler, hand-written in a pair mapped by name
(``AsyncHandlerCalls`` becomes ``HandlerCalls`` in the generated sync engine).

The async engine awaits an ``async def`` handler in the step's task and runs a plain
``def`` one (a blocking SDK) on a daemon thread with a ``ThreadLease``; the sync engine
calls a plain function on its worker thread with its ``Lease`` and refuses an ``async
def`` one. Either way a ``def`` handler is handed a ``BlockingLease`` (checked here).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable
from typing import Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.lease_api import BlockingLease
from orchestrator.mongo import AsyncLease, Lease
from orchestrator.runners.threads import HandlerThreads, ThreadLease

__all__ = ["AsyncHandlerCalls", "HandlerCalls"]


class AsyncHandlerCalls:
    """``async def`` handlers awaited; plain ones on ``HandlerThreads``, made on need,
    keeping at most ``keep`` idle threads."""

    def __init__(self, name: str, keep: int) -> None:
        self._name = name
        self._keep = keep
        self._threads: HandlerThreads | None = None

    @staticmethod
    def check(func: Callable[..., Any]) -> None:
        """Both kinds of function run here."""

    async def call(self, func: Callable[..., Any], lease: AsyncLease[Any]) -> object:
        if inspect.iscoroutinefunction(func):
            result: object = await func(lease)
            return result
        loop = asyncio.get_running_loop()
        if self._threads is None:
            self._threads = HandlerThreads(f"orchestrator-{self._name}-step", self._keep)
        # The step's context goes with it (copied here, in the step's await): a run_once
        # the thread asks the loop for is refused as re-entrant, as on the loop itself.
        context = contextvars.copy_context()
        handed: BlockingLease[Any] = ThreadLease(lease, loop)
        return await self._threads.submit(loop, context.run, func, handed)

    def close(self) -> None:
        """Let the idle threads go (a thread step still running keeps its daemon thread)."""
        if self._threads is not None:
            self._threads.close()
            self._threads = None


class HandlerCalls:
    """Plain functions, called on the worker's thread."""

    def __init__(self, name: str, keep: int) -> None:
        del name, keep  # no threads of its own: the worker runs the step

    @staticmethod
    def check(func: Callable[..., Any]) -> None:
        if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigError(
                f"{getattr(func, '__qualname__', func)!s} is async; the threaded Orchestrator "
                "runs plain functions (AsyncOrchestrator awaits async ones)"
            )

    @staticmethod
    def call(func: Callable[..., Any], lease: Lease[Any]) -> object:
        handed: BlockingLease[Any] = lease
        result: object = func(handed)
        return result

    def close(self) -> None:
        """Nothing to let go."""
