"""What a step's end does to its document, judged by the step's own lease: wrong outcomes
are counted errors, bad policy answers are counted errors, a step whose lease is gone does
not start, an outside writer's phase change wins, and ``lastError`` means the latest
attempt failed. The tests through ``replicas`` run on both engines."""

from __future__ import annotations

import math
import threading
from datetime import timedelta
from typing import Any

import anyio
import pytest
from pymongo.database import Database

from orchestrator import EPOCH, Lease, LeaseLost, Operations, Orchestrator, Outcome
from orchestrator.core.clock import as_utc
from orchestrator.testing import FakeClock, memory_database
from orchestrator.testing.faults import Faults
from tests.conftest import MakeEither
from tests.engines import hold, wait

GUARD = 500


def _doc(db: Database[Any]) -> dict[str, Any]:
    doc = db.jobs.find_one({})
    assert doc is not None
    return doc


# -- a LeaseLost or an outcome that is not the step's own --------------------------------


@pytest.mark.anyio
async def test_returning_an_older_leases_outcome_is_a_counted_error(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(max_attempts=3)
    kept: list[Outcome] = []

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        if not kept:
            kept.append(await lease.unlock())
            return kept[0]
        return kept[0]  # a cached outcome of the first step

    await orch.submit("jobs", {"phase": "Running"})
    await orch.run_once()
    doc = _doc(db)
    assert doc["attempts"] == 1
    assert doc["lastError"]["type"] == "TypeError"
    assert "another lease's outcome" in doc["lastError"]["message"]
    assert "lockToken" not in doc  # released, not held until it expires
    assert orch.stats().get("lost", 0) == 0


@pytest.mark.anyio
async def test_a_leaselost_from_another_lease_is_the_handlers_error(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas()
    leases: list[Any] = []

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        leases.append(lease)
        if len(leases) == 1:
            return await lease.unlock()
        return await leases[0].advance("Done")  # the first step's lease, long released

    await orch.submit("jobs", {"phase": "Running"})
    await orch.run_once()
    doc = _doc(db)
    assert len(leases) == 2
    assert doc["phase"] == "Running"
    assert doc["attempts"] == 1 and doc["lastError"]["type"] == "LeaseLost"
    assert "lockToken" not in doc and doc["lockedUntil"] > as_utc(EPOCH).replace(tzinfo=None)


@pytest.mark.anyio
async def test_two_outcomes_in_one_step_count_attempts_until_the_failed_phase(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """unlock() then advance(): the unlock lands, the second outcome is a counted error,
    and the streak reaches the failed phase instead of repeating forever.

    One step at a time: the unlock frees the document while the step still runs, and with a
    free slot the loop may claim it again before the second outcome's attempt is recorded
    (that record then finds the new lease and is dropped). On a server that answers
    concurrent requests in any order, that race is real; it is not what this test is about."""
    orch = await replicas(max_attempts=3, max_concurrency=1)
    calls: list[Any] = []

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        calls.append(lease.id)
        assert len(calls) <= GUARD
        await lease.unlock()
        return await lease.advance("Done")

    await orch.submit("jobs", {"phase": "Running"})
    for _ in range(10):
        await orch.run_once()
        clock.advance(60)
    doc = _doc(db)
    assert len(calls) == 3
    assert doc["phase"] == "Failed" and doc["attempts"] == 3
    assert "already gave an outcome" in doc["lastError"]["message"]


@pytest.mark.anyio
async def test_a_genuinely_lost_lease_is_still_filed_as_lost_without_a_record(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    first = await replicas("first", heartbeat=False, max_concurrency=1)
    second = await replicas("second")
    box = hold(first)
    taken: list[Any] = []

    @second.phase("jobs", "Running")
    async def take(lease: Any) -> Any:
        taken.append(lease.id)
        return await lease.relock(wait=600)

    await first.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(first.run_once)
        assert await wait(box["claimed"])
        clock.advance(31)
        await second.run_once()
        box["go"].set()
    assert isinstance(box["lost"], LeaseLost)
    assert first.stats()["lost"] == 1
    doc = _doc(db)
    assert doc["attempts"] == 0 and "lastError" not in doc and doc["relocks"] == 1


# -- policies that answer nonsense -------------------------------------------------------


class Answers:
    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> Any:
        return self.value


BAD_WAITS = [math.nan, None, -1.0, math.inf, "5", True]


@pytest.mark.parametrize("value", BAD_WAITS, ids=repr)
@pytest.mark.anyio
async def test_a_retry_policy_answering_nonsense_still_counts_the_attempt(
    replicas: MakeEither, db: Database[Any], clock: FakeClock, value: Any
) -> None:
    orch = await replicas(retry_policy=Answers(value))

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        raise RuntimeError("boom")

    await orch.submit("jobs", {"phase": "Running"})
    await orch.run_once()
    doc = _doc(db)
    assert doc["attempts"] == 1
    assert "retry_policy returned" in doc["lastError"]["message"]
    waited = (as_utc(doc["lockedUntil"]) - orch.clock.now()).total_seconds()
    assert waited == pytest.approx(30)  # the safe wait: one lock timeout


@pytest.mark.parametrize("value", BAD_WAITS, ids=repr)
@pytest.mark.anyio
async def test_a_relock_policy_answering_nonsense_is_a_counted_error(
    replicas: MakeEither, db: Database[Any], value: Any
) -> None:
    orch = await replicas(relock_policy=Answers(value))

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        return await lease.relock()

    await orch.submit("jobs", {"phase": "Running"})
    await orch.run_once()
    doc = _doc(db)
    assert doc["attempts"] == 1 and doc["lastError"]["type"] == "PolicyError"
    assert "relock_policy returned" in doc["lastError"]["message"]


# -- a step whose lease is gone before it starts -----------------------------------------


def test_a_step_whose_lease_expired_before_it_started_is_handed_back(
    db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(delay=clock.advance, clock=clock)
    # One worker: the late lease has expired for every claim, so a second worker of this
    # replica could take it over before the hand-back (lost, taken_over), as the loaded
    # suite's timing sometimes had it. No heartbeat either: one falling due in real time
    # would find the lease past half its timeout and lose it extending it.
    orch = Orchestrator(
        faults.wrap(db), replica_id="slow", clock=clock, lock_timeout=30, max_concurrency=1
    )
    ran: list[Any] = []

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        ran.append(lease.id)
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    faults.delay_next("find_one_and_update", 31)  # the claim's reply arrives after 31 s
    counts = orch.run_once(heartbeat=False)
    # The late lease was handed back unrun; a fresh claim in the same tick ran the step.
    assert counts == {"claimed": 2, "released": 1, "advanced": 1, "ticks": 1}
    assert len(ran) == 1
    assert _doc(db)["phase"] == "Done"


# -- "failed" in status means the latest attempt failed ----------------------------------


@pytest.mark.parametrize("recovery", ["unlock", "relock", "advance"])
@pytest.mark.anyio
async def test_a_success_after_a_failure_is_no_longer_counted_failed(
    replicas: MakeEither, db: Database[Any], clock: FakeClock, recovery: str
) -> None:
    orch = await replicas()
    calls: list[Any] = []

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        calls.append(lease.id)
        if len(calls) == 1:
            raise RuntimeError("flaky")
        if recovery == "advance":
            return await lease.advance("Running")
        return await getattr(lease, recovery)()

    await orch.submit("jobs", {"phase": "Running"})
    await orch.run_once()
    # Still being retried: counted retrying, not failed (given up on).
    assert (
        Operations(db).status().phases[0].retrying,
        Operations(db).status().phases[0].failed,
    ) == (1, 0)
    clock.advance(5)
    await orch.run_once()
    doc = _doc(db)
    assert "lastError" not in doc and doc["attempts"] == 0
    assert doc["previousError"]["message"] == "flaky"
    assert (
        Operations(db).status().phases[0].retrying,
        Operations(db).status().phases[0].failed,
    ) == (0, 0)
    assert Operations(db).status().errors == []


# -- an outside writer changes the phase under a held lease ------------------------------


@pytest.mark.anyio
async def test_an_outside_phase_change_wins_over_the_steps_advance(
    replicas: MakeEither, db: Database[Any]
) -> None:
    orch = await replicas(heartbeat=False)
    box = hold(orch)
    cancelled: list[Any] = []

    @orch.phase("jobs", "Cancelled")
    async def cancel(lease: Any) -> Any:
        cancelled.append(lease.id)
        return await lease.advance("Gone")

    doc = await orch.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(orch.run_once)
        assert await wait(box["claimed"])
        db.jobs.update_one({"_id": doc["_id"]}, {"$set": {"phase": "Cancelled"}})  # the API
        box["go"].set()
    assert isinstance(box["lost"], LeaseLost)
    assert cancelled == [doc["_id"]]  # released at once, handled in its new phase
    assert _doc(db)["phase"] == "Gone"


@pytest.mark.anyio
async def test_an_outside_phase_change_also_wins_over_a_recorded_failure(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(heartbeat=False, max_attempts=1)
    started, go = threading.Event(), threading.Event()

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        started.set()
        await wait(go)
        raise RuntimeError("gives up")

    doc = await orch.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(orch.run_once)
        assert await wait(started)
        db.jobs.update_one({"_id": doc["_id"]}, {"$set": {"phase": "Cancelled"}})
        go.set()
    stored = _doc(db)
    assert stored["phase"] == "Cancelled" and "lastError" not in stored
    assert "lockToken" not in stored
    assert as_utc(stored["lockedUntil"]) <= orch.clock.now() + timedelta(seconds=0)


def test_stats_are_counted_by_plain_names() -> None:
    """``stats()`` keys are plain strings: they print, log and serialise as names, not as
    enum members, whichever vocabulary counted them."""
    clock = FakeClock()
    orch = Orchestrator(memory_database(clock=clock), clock=clock, max_concurrency=1)

    @orch.phase("jobs", "Running")
    def step(lease: Lease[object]) -> object:
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    counts = orch.run_once()
    assert counts["advanced"] == 1
    assert all(type(key) is str for key in orch.stats())
    assert "StepOutcome" not in repr(orch.stats())
