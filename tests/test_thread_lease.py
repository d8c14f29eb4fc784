"""A ``ThreadLease`` (what a plain ``def`` handler gets in the ``AsyncOrchestrator``) runs
each outcome on the event loop and waits for it: called on that loop's own thread it would
wait for the loop it blocks, for ever. It raises a clear ``OrchestratorError`` at once
instead, writes nothing, and the lease stays the handler's.

The loop runs in a thread of its own, so that a regression fails the test (the loop is
then stuck) instead of hanging the suite. ``HANG_GUARD`` bounds that: it measures nothing.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from orchestrator import AsyncOrchestrator, LeaseLost, OrchestratorError, ThreadLease
from orchestrator.testing import FakeClock, async_view, memory_database

HANG_GUARD = 30.0
"""Seconds before the test calls the loop hung (a bound, not a timing)."""


def test_a_thread_lease_called_on_its_event_loop_raises_at_once_and_writes_nothing(
    clock: FakeClock,
) -> None:
    db = memory_database(clock=clock)
    orch = AsyncOrchestrator(
        async_view(db), replica_id="pod-a", clock=clock, clock_refresh=1e6, tick=30
    )
    loops: list[asyncio.AbstractEventLoop] = []
    refused: list[OrchestratorError] = []

    async def on_the_loop(lease: ThreadLease[Any]) -> None:
        """What a callback the handler hands to the loop might do with its lease."""
        try:
            lease.advance("Elsewhere")
        except OrchestratorError as exc:
            refused.append(exc)

    @orch.phase("jobs", "Running")
    def step(lease: ThreadLease[Any]) -> Any:
        asyncio.run_coroutine_threadsafe(on_the_loop(lease), loops[0]).result(HANG_GUARD)
        assert lease.held
        return lease.advance("Done")

    async def main() -> dict[str, int]:
        loops.append(asyncio.get_running_loop())
        await orch.submit("jobs", {"phase": "Running"})
        try:
            return await orch.run_once()
        finally:
            await orch.stop()

    ended: dict[str, Any] = {}

    def run() -> None:
        try:
            ended["counts"] = asyncio.run(main())
        except BaseException as exc:
            ended["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(HANG_GUARD)
    assert not runner.is_alive(), "the event loop hung on a ThreadLease called on it"
    if "error" in ended:
        raise ended["error"]

    assert len(refused) == 1 and not isinstance(refused[0], LeaseLost)
    assert "a ThreadLease waits for the event loop" in str(refused[0])
    assert "await the AsyncLease" in str(refused[0])
    assert ended["counts"].get("advanced") == 1
    doc = db.jobs.find_one({})
    assert doc is not None and doc["phase"] == "Done" and "lastError" not in doc
