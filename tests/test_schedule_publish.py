"""A replica's schedules' documents are made before its first tick when asked."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator import AsyncOrchestrator, Orchestrator
from orchestrator.testing import FakeClock

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("engine", ["threaded", "async"])
async def test_ensure_indexes_makes_the_schedules_documents_on_a_clock_not_yet_measured(
    engine: str, db: Database[Any], adb: AsyncDatabase[Any], clock: FakeClock
) -> None:
    """As a deployment's migration does, before any replica starts: the documents' first
    fires are the server's time, measured then."""
    if engine == "threaded":
        orch: Orchestrator | AsyncOrchestrator = Orchestrator(db, clock=clock, replica_id="setup")
    else:
        orch = AsyncOrchestrator(adb, clock=clock, replica_id="setup")

    @orch.schedule("hourly", "reports", every=3600, overlap="allow_all")
    def hourly(fire: Any) -> dict[str, Any]:
        return {"phase": "Make"}

    if isinstance(orch, Orchestrator):
        orch.ensure_indexes()
    else:
        await orch.ensure_indexes()
    [doc] = db["orchestrator.schedules"].find()
    assert doc["_id"] == "hourly" and doc["spec"]["every"] == 3600
