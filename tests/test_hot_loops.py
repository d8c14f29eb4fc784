"""A buggy handler cannot spin: every outcome that frees a document at once counts against
the same per-document budget of claims per tick, and a handler never re-claims a document
it moved to the failed phase.

Every test runs on both engines. Each handler here carries a guard: past ``GUARD`` calls
it raises, which (on code without these fixes) ends what would otherwise be an endless
``run_once``; the assertions then fail on the call count instead of hanging the suite.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pymongo.database import Database

from orchestrator import Resource
from orchestrator.core.queries import operators
from orchestrator.testing import FakeClock
from tests.conftest import MakeEither

pytestmark = pytest.mark.anyio  # each test runs on both engines (the ``replicas`` fixture)

BUDGET = 5  # max_unlocks_per_tick in these tests
GUARD = 500


class Runaway(Exception):
    """Raised by a guard: the handler ran far more often than any budget allows."""


def _guarded(calls: list[Any], value: Any) -> None:
    calls.append(value)
    if len(calls) > GUARD:
        raise Runaway(f"called {len(calls)} times")


async def test_advancing_to_the_phase_it_is_in_is_held_to_the_budget(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(max_unlocks_per_tick=BUDGET)
    calls: list[Any] = []

    @orch.phase("items", "A")
    async def same(lease: Any) -> Any:
        _guarded(calls, lease.id)
        return await lease.advance("A")

    await orch.submit("items", {"phase": "A"})
    await orch.run_once()
    assert len(calls) == BUDGET + 1  # the budget, then one more that is throttled
    clock.advance(1.0)
    await orch.run_once()
    assert len(calls) == 2 * (BUDGET + 1)  # the next tick: a fresh budget, still bounded


async def test_two_handlers_passing_a_document_back_and_forth_are_held_to_the_budget(
    replicas: MakeEither, db: Database[Any]
) -> None:
    orch = await replicas(max_unlocks_per_tick=BUDGET)
    calls: list[Any] = []

    @orch.phase("items", "Ping")
    async def ping(lease: Any) -> Any:
        _guarded(calls, "ping")
        return await lease.advance("Pong")

    @orch.phase("items", "Pong")
    async def pong(lease: Any) -> Any:
        _guarded(calls, "pong")
        return await lease.advance("Ping")

    await orch.submit("items", {"phase": "Ping"})
    await orch.run_once()
    assert len(calls) == BUDGET + 1
    doc = db.items.find_one({})
    assert doc is not None and doc["lockedUntil"] > doc["updatedAt"]  # waits out the tick


async def test_a_filter_without_phase_does_not_refail_what_it_failed(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """The filter matches the failed phase too; the document it failed stays failed."""
    orch = await replicas(max_attempts=1)
    calls: list[Any] = []

    @orch.when("items", {"state": "Deleted"})
    async def delete(lease: Any) -> Any:
        _guarded(calls, lease.phase)
        raise RuntimeError("cannot delete")

    await orch.submit("items", {"phase": "Running", "state": "Deleted"})
    for _ in range(5):
        await orch.run_once()
        clock.advance(60)
    assert calls == ["Running"]
    doc = db.items.find_one({})
    assert doc is not None
    assert doc["phase"] == "Failed"
    assert doc["failedBy"] == 'items {"state": "Deleted"}'


async def test_a_document_failing_validation_is_not_claimed_again_by_a_phaseless_filter(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    class Item(Resource):
        collection: ClassVar[str] = "items"
        size: int

    orch = await replicas()
    calls: list[Any] = []

    @orch.when(Item, {"state": "Running"})
    async def run(lease: Any) -> Any:
        _guarded(calls, lease.id)
        return await lease.unlock()

    db.items.insert_one({"phase": "New", "state": "Running", "size": "huge"})
    for _ in range(3):
        await orch.run_once()
        clock.advance(60)
    doc = db.items.find_one({})
    assert doc is not None
    assert doc["phase"] == "Failed"
    assert doc["lastError"]["type"] == "ValidationError"
    assert calls == []  # never ran: validation fails before the handler


async def test_a_handler_on_the_failed_phase_that_raises_gives_up_after_its_attempts(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(max_attempts=3)
    calls: list[Any] = []

    @orch.phase("items", "Failed")
    async def notify(lease: Any) -> Any:
        _guarded(calls, lease.id)
        raise RuntimeError("pager is down")

    await orch.submit("items", {"phase": "Failed"})
    for _ in range(20):
        await orch.run_once()
        clock.advance(600)
    assert len(calls) == 3
    doc = db.items.find_one({})
    assert doc is not None
    assert doc["phase"] == "Failed" and doc["attempts"] == 3


async def test_another_handler_on_the_failed_phase_still_gets_what_one_failed(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """``failedBy`` only keeps the failing handler away: a cleanup handler runs at once."""
    orch = await replicas(max_attempts=1)
    cleaned: list[Any] = []

    @orch.phase("items", "Running")
    async def work(lease: Any) -> Any:
        raise RuntimeError("boom")

    @orch.phase("items", "Failed")
    async def cleanup(lease: Any) -> Any:
        cleaned.append(lease.id)
        return await lease.advance("Archived")

    doc = await orch.submit("items", {"phase": "Running"})
    await orch.run_once()
    assert cleaned == [doc["_id"]]
    archived = db.items.find_one({})
    assert archived is not None
    assert archived["phase"] == "Archived"
    assert "failedBy" not in archived  # an advance clears it
    assert archived["previousError"]["message"] == "boom"


async def test_an_operator_retry_lets_the_failing_handler_try_again(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(max_attempts=1)
    calls: list[Any] = []

    @orch.when("items", {"state": "Deleted", "phase": {"$ne": "Deleted"}})
    async def delete(lease: Any) -> Any:
        calls.append(lease.phase)
        if len(calls) == 1:
            raise RuntimeError("first try fails")
        return await lease.advance("Deleted")

    await orch.submit("items", {"phase": "Running", "state": "Deleted"})
    await orch.run_once()
    db.items.update_one({}, operators.operator_move_update("Running", orch.clock.now()))
    await orch.run_once()
    assert calls == ["Running", "Running"]
    doc = db.items.find_one({})
    assert doc is not None and doc["phase"] == "Deleted"
