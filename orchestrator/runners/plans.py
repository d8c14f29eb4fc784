"""Generator plans for the operators' tools: yield zero-argument calls, get results back;
``drive`` carries one out synchronously, ``adrive`` on the event loop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")

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
