"""How each engine calls a handler (``orchestrator/runners/calls.py``): which functions it
refuses at decoration time, where a handler runs (the step's task, a step thread, the
worker's thread), what lease it gets, and the step's context going with it to a thread.
A stand-in lease: nothing here writes.

``HANG_GUARD`` bounds a thread's join, so a regression fails instead of hanging the
suite: it measures nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from orchestrator import ConfigError, ThreadLease
from orchestrator.runners.calls import AsyncHandlerCalls, HandlerCalls
from orchestrator.runners.step import IN_STEP

HANG_GUARD = 30.0
"""Seconds a thread may take before the test calls it hung (a bound, not a timing)."""


class Held:
    """A stand-in for the step's lease: what a handler reads of it here."""

    token = "t" * 32
    collection = "jobs"
    id = 7


async def awaited(lease: Any) -> Any:
    return lease


def plain(lease: Any) -> Any:
    return lease


async def generator(lease: Any) -> AsyncIterator[None]:
    yield None


@pytest.fixture
def calls() -> Iterator[AsyncHandlerCalls]:
    made = AsyncHandlerCalls("pod-1", keep=1)
    yield made
    made.close()


# -- which functions each engine runs -------------------------------------------------------


def test_the_async_engine_runs_both_kinds_of_function() -> None:
    AsyncHandlerCalls.check(awaited)
    AsyncHandlerCalls.check(plain)


@pytest.mark.parametrize("func", [awaited, generator], ids=["async def", "async generator"])
def test_the_threaded_engine_refuses_an_async_function_naming_it(func: Any) -> None:
    with pytest.raises(ConfigError, match=rf"{func.__qualname__} is async.*AsyncOrchestrator"):
        HandlerCalls.check(func)


def test_the_threaded_engine_runs_a_plain_function() -> None:
    HandlerCalls.check(plain)


# -- the async engine -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_async_handler_is_awaited_in_the_step_s_own_task_with_the_lease_itself(
    calls: AsyncHandlerCalls,
) -> None:
    lease: Any = Held()
    seen: list[asyncio.Task[Any] | None] = []

    async def step(given: Any) -> str:
        seen.append(asyncio.current_task())
        assert given is lease
        return "outcome"

    assert await calls.call(step, lease) == "outcome"
    assert seen == [asyncio.current_task()]


@pytest.mark.anyio
async def test_a_plain_handler_runs_on_a_step_thread_with_a_thread_lease(
    calls: AsyncHandlerCalls,
) -> None:
    lease: Any = Held()
    seen: list[tuple[threading.Thread, Any]] = []

    def step(given: Any) -> str:
        seen.append((threading.current_thread(), given))
        return "outcome"

    assert await calls.call(step, lease) == "outcome"
    ((thread, given),) = seen
    assert thread is not threading.current_thread()
    assert thread.name == "orchestrator-pod-1-step" and thread.daemon
    assert isinstance(given, ThreadLease)
    assert (given.token, given.collection, given.id) == (Held.token, "jobs", 7)


@pytest.mark.anyio
async def test_a_plain_handler_s_thread_carries_the_step_s_context(
    calls: AsyncHandlerCalls,
) -> None:
    """The thread knows it runs a step (``IN_STEP``), so a ``run_once`` it asks the loop
    for is refused as re-entrant, as it is on the loop itself."""
    engine = object()
    seen: list[object | None] = []

    def step(lease: Any) -> None:
        seen.append(IN_STEP.get())

    token = IN_STEP.set(engine)
    try:
        await calls.call(step, Held())  # type: ignore[arg-type]
    finally:
        IN_STEP.reset(token)
    assert seen == [engine]


@pytest.mark.anyio
async def test_what_a_plain_handler_raises_reaches_the_step_as_it_is(
    calls: AsyncHandlerCalls,
) -> None:
    boom = ValueError("upstream said no")

    def step(lease: Any) -> None:
        raise boom

    with pytest.raises(ValueError) as raised:
        await calls.call(step, Held())  # type: ignore[arg-type]
    assert raised.value is boom


@pytest.mark.anyio
async def test_closing_lets_the_idle_step_threads_go_and_the_next_call_makes_a_new_one(
    calls: AsyncHandlerCalls,
) -> None:
    threads: list[threading.Thread] = []

    def step(lease: Any) -> None:
        threads.append(threading.current_thread())

    await calls.call(step, Held())  # type: ignore[arg-type]
    calls.close()
    await asyncio.to_thread(threads[0].join, HANG_GUARD)
    assert not threads[0].is_alive()
    await calls.call(step, Held())  # type: ignore[arg-type]
    assert threads[1] is not threads[0] and threads[1].is_alive()


def test_closing_calls_that_made_no_thread_is_harmless() -> None:
    AsyncHandlerCalls("pod-1", keep=1).close()
    HandlerCalls("pod-1", keep=1).close()


# -- the threaded engine --------------------------------------------------------------------


def test_the_threaded_engine_calls_a_handler_on_the_worker_s_own_thread_with_its_lease() -> None:
    lease: Any = Held()
    seen: list[tuple[threading.Thread, Any]] = []

    def step(given: Any) -> str:
        seen.append((threading.current_thread(), given))
        return "outcome"

    assert HandlerCalls("pod-1", keep=1).call(step, lease) == "outcome"
    assert seen == [(threading.current_thread(), lease)]
