"""A buffer_one schedule whose buffered fire waited for one slow run starts on time again."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.database import Database

from orchestrator.testing import FakeClock
from tests.conftest import MakeEither

pytestmark = pytest.mark.anyio


async def test_a_buffered_fire_late_once_leaves_the_next_fires_on_time(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas("pod-1")
    orch = replica.orch
    slow = ["first"]

    @replica.phase("runs", "Run")
    async def run(lease: Any) -> Any:
        if slow:
            slow.clear()
            return await lease.relock(3)  # the first run outlasts the next fire
        return await lease.advance("Done")

    @orch.schedule("every-2s", "runs", every=2, overlap="buffer_one")
    def every(fire: Any) -> dict[str, Any]:
        return {"phase": "Run"}

    for _ in range(20):
        clock.advance(1)
        await replica.run_once(heartbeat=False)
    runs = list(db.runs.find().sort("_id"))
    lags = [(r["createdAt"] - r["scheduled"]["fire"]).total_seconds() for r in runs]
    assert len(runs) >= 8 and all(r["phase"] == "Done" for r in runs)
    assert max(lags[-3:]) < 1.0, lags  # under a tick late, as the first fire
