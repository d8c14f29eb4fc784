"""The threads that run plain ``def`` steps in the ``AsyncOrchestrator``: a step abandoned
past step_timeout keeps its thread and the next step gets a new one, yet once the steps
end at most ``max_concurrency`` threads stay idle for the next steps, and ``stop`` lets
those go. Observed by the threads' names (``orchestrator-<replica_id>-step``).

Time comes from the FakeClock. ``HANG_GUARD`` bounds the waits for threads to end, so a
regression fails the test instead of hanging the suite: it measures nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.to_thread
import pytest

from orchestrator import AsyncOrchestrator, ThreadLease
from orchestrator.testing import FakeClock, async_view, memory_database

pytestmark = pytest.mark.anyio

HANG_GUARD = 30.0
"""Seconds to wait for threads to end before the test calls them kept (a bound)."""

CONCURRENCY = 3


def step_threads(replica_id: str) -> list[threading.Thread]:
    """The live threads of ``replica_id``'s ``def`` steps, by name."""
    prefix = f"orchestrator-{replica_id}-step"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


class Ends:
    """Counts the given threads as they end (one watcher joins each)."""

    def __init__(self, threads: Iterable[threading.Thread]) -> None:
        self._ended = threading.Condition()
        self.count = 0
        for thread in threads:
            threading.Thread(target=self._watch, args=(thread,), daemon=True).start()

    def _watch(self, thread: threading.Thread) -> None:
        thread.join()
        with self._ended:
            self.count += 1
            self._ended.notify_all()

    async def at_least(self, count: int) -> bool:
        """Whether ``count`` of them have ended, waiting up to ``HANG_GUARD`` for it."""

        def until() -> bool:
            with self._ended:
                return self._ended.wait_for(lambda: self.count >= count, HANG_GUARD)

        return await anyio.to_thread.run_sync(until)


async def test_at_most_max_concurrency_step_threads_stay_idle_and_stop_ends_them(
    clock: FakeClock,
) -> None:
    db = memory_database(clock=clock)
    aorch = AsyncOrchestrator(
        async_view(db),
        replica_id="pod-cap",
        clock=clock,
        clock_refresh=1e6,
        tick=30,
        step_timeout=60,
        max_attempts=1,
        max_concurrency=CONCURRENCY,
    )
    stuck_claimed = threading.Semaphore(0)
    go = threading.Event()
    together = threading.Barrier(CONCURRENCY, timeout=HANG_GUARD)

    @aorch.phase("jobs", "Stuck")
    def stuck(lease: ThreadLease[Any]) -> Any:
        stuck_claimed.release()
        go.wait(HANG_GUARD)
        return None

    @aorch.phase("jobs", "Quick")
    def quick(lease: ThreadLease[Any]) -> Any:
        together.wait()  # every slot's step at once: each on a thread of its own
        return lease.advance("Done")

    async def all_stuck_claimed() -> bool:
        return all(
            [
                await anyio.to_thread.run_sync(stuck_claimed.acquire, True, HANG_GUARD)
                for _ in range(CONCURRENCY)
            ]
        )

    for n in range(CONCURRENCY):
        await aorch.submit("jobs", {"name": f"stuck-{n}", "phase": "Stuck"})
    try:
        # Every slot's step gets stuck; step_timeout abandons them, each keeping its thread.
        async with anyio.create_task_group() as group:
            group.start_soon(aorch.run_once)
            assert await all_stuck_claimed()
            for _ in range(3):
                clock.advance(20)
                await aorch.heartbeat()
        assert aorch.stats()["timed_out"] == CONCURRENCY
        # The next steps, all at once, each get a new thread: none of the stuck ones is idle.
        for n in range(CONCURRENCY):
            await aorch.submit("jobs", {"name": f"quick-{n}", "phase": "Quick"})
        with anyio.fail_after(HANG_GUARD):
            assert (await aorch.run_once()).get("advanced") == CONCURRENCY
        threads = step_threads("pod-cap")
        assert len(threads) == 2 * CONCURRENCY
        # The stuck steps return too: past max_concurrency idle threads, the rest end.
        ends = Ends(threads)
        go.set()
        assert await ends.at_least(CONCURRENCY), "more idle step threads than max_concurrency"
        assert len(step_threads("pod-cap")) == CONCURRENCY
    finally:
        go.set()
        await aorch.stop()
    assert await Ends(threads).at_least(len(threads)), "stop() left idle step threads"
    assert step_threads("pod-cap") == []
