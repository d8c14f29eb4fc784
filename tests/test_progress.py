"""Inside a long step: its progress on the document (fenced, rate-limited, carried by its
outcome), and an operator's cancel seen at the next heartbeat rather than at the next
write, on both engines and every store."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from pymongo.database import Database

from orchestrator import ConfigError, LeaseLost
from orchestrator.core.queries.operators import operator_move_update
from orchestrator.core.trees import PROGRESS_FIELD
from orchestrator.testing import FakeClock
from tests.conftest import MakeEither
from tests.engines import hold, wait

pytestmark = pytest.mark.anyio


async def test_progress_is_written_at_most_once_an_interval_and_the_latest_goes_with_the_outcome(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas(progress_interval=5)
    seen: list[Any] = []

    @replica.phase("jobs", "Running")
    async def running(lease: Any) -> Any:
        await lease.progress(0.25, "a quarter")
        seen.append(db.jobs.find_one({})[PROGRESS_FIELD])
        await lease.progress(0.5)  # within the interval: kept, not written
        seen.append(db.jobs.find_one({})[PROGRESS_FIELD])
        clock.advance(5)
        await lease.progress(0.75, "most")
        seen.append(db.jobs.find_one({})[PROGRESS_FIELD])
        await lease.progress(0.9, "nearly")
        return await lease.advance("Done")

    await replica.submit("jobs", {"_id": "j1", "phase": "Running"})
    await replica.run_once(heartbeat=False)
    assert [(p["fraction"], p["note"]) for p in seen] == [
        (0.25, "a quarter"),
        (0.25, "a quarter"),
        (0.75, "most"),
    ]
    done = db.jobs.find_one({"_id": "j1"})
    assert done["phase"] == "Done"
    assert (done[PROGRESS_FIELD]["fraction"], done[PROGRESS_FIELD]["phase"]) == (0.9, "Running")


@pytest.mark.parametrize(
    ("fraction", "note"),
    [(1.5, None), (-0.1, None), (float("nan"), None), (True, None), ("half", None), (0.5, 7)],
)
async def test_a_bad_progress_is_refused_in_one_line_and_writes_nothing(
    replicas: MakeEither, db: Database[Any], fraction: Any, note: Any
) -> None:
    replica = await replicas()
    said: list[str] = []

    @replica.phase("jobs", "Running")
    async def running(lease: Any) -> Any:
        try:
            await lease.progress(fraction, note)
        except ConfigError as exc:
            said.append(str(exc))
        return await lease.advance("Done")

    await replica.submit("jobs", {"_id": "j1", "phase": "Running"})
    await replica.run_once(heartbeat=False)
    assert len(said) == 1 and "\n" not in said[0]
    assert PROGRESS_FIELD not in db.jobs.find_one({"_id": "j1"})


async def test_an_operators_cancel_is_seen_by_the_running_step_at_the_next_heartbeat(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas(max_concurrency=1)
    box = hold(replica)
    await replica.submit("jobs", {"_id": "j1", "phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: replica.run_once(heartbeat=False))
        assert await wait(box["claimed"])
        lease = box["lease"]
        await replica.heartbeat()
        assert lease.cancel_requested is False  # nothing happened
        db.jobs.update_one({"_id": "j1"}, operator_move_update("Cancelled", replica.clock.now()))
        assert lease.cancel_requested is False  # not until the heartbeat looks
        await replica.heartbeat()
        assert lease.cancel_requested is True
        box["go"].set()
    assert isinstance(box["lost"], LeaseLost)  # its write stays fenced, as before
    assert db.jobs.find_one({"_id": "j1"})["phase"] == "Cancelled"


async def test_another_replicas_claim_is_no_cancel(replicas: MakeEither, db: Database[Any]) -> None:
    replica = await replicas(max_concurrency=1)
    box = hold(replica)
    await replica.submit("jobs", {"_id": "j1", "phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: replica.run_once(heartbeat=False))
        assert await wait(box["claimed"])
        db.jobs.update_one({"_id": "j1"}, {"$set": {"lockToken": "pod-other"}})
        await replica.heartbeat()
        assert box["lease"].cancel_requested is False
        box["go"].set()
    assert isinstance(box["lost"], LeaseLost)
