"""What a step's end does to its document, judged by the step's own lease: wrong outcomes
are counted errors, bad policy answers are counted errors, a step whose lease is gone does
not start, an outside writer's phase change wins, and ``lastError`` means the latest
attempt failed."""

from __future__ import annotations

import math
import threading
from datetime import timedelta
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import EPOCH, Lease, LeaseLost, Orchestrator, Outcome
from orchestrator.queries import as_utc
from orchestrator.status import collect
from orchestrator.testing import FakeClock
from orchestrator.testing.faults import Faults
from tests.conftest import MakeReplica
from tests.holding import hold_step

GUARD = 500


def _doc(db: Database[Any]) -> dict[str, Any]:
    doc = db.jobs.find_one({})
    assert doc is not None
    return doc


# -- defect 4: a LeaseLost or an outcome that is not the step's own ----------------------


def test_returning_an_older_leases_outcome_is_a_counted_error(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(max_attempts=3)
    kept: list[Outcome] = []

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        if not kept:
            kept.append(lease.unlock())
            return kept[0]
        return kept[0]  # a cached outcome of the first step

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    doc = _doc(db)
    assert doc["attempts"] == 1
    assert doc["lastError"]["type"] == "TypeError"
    assert "another lease's outcome" in doc["lastError"]["message"]
    assert "lockToken" not in doc  # released, not held until it expires
    assert orch.stats().get("lost", 0) == 0


def test_a_leaselost_from_another_lease_is_the_handlers_error(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make()
    leases: list[Lease[Any]] = []

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        leases.append(lease)
        if len(leases) == 1:
            return lease.unlock()
        return leases[0].advance("Done")  # the first step's lease, long released

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    doc = _doc(db)
    assert len(leases) == 2
    assert doc["phase"] == "Running"
    assert doc["attempts"] == 1 and doc["lastError"]["type"] == "LeaseLost"
    assert "lockToken" not in doc and doc["lockedUntil"] > as_utc(EPOCH).replace(tzinfo=None)


def test_two_outcomes_in_one_step_count_attempts_until_the_failed_phase(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """unlock() then advance(): the unlock lands, the second outcome is a counted error,
    and the streak reaches the failed phase instead of repeating forever."""
    orch = make(max_attempts=3)
    calls: list[Any] = []

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        calls.append(lease.id)
        assert len(calls) <= GUARD
        lease.unlock()
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    for _ in range(10):
        orch.run_once()
        clock.advance(60)
    doc = _doc(db)
    assert len(calls) == 3
    assert doc["phase"] == "Failed" and doc["attempts"] == 3
    assert "already gave an outcome" in doc["lastError"]["message"]


def test_a_genuinely_lost_lease_is_still_filed_as_lost_without_a_record(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    first = make("first", heartbeat=False)
    second = make("second")
    box = hold_step(first)
    taken: list[Any] = []

    @second.phase("jobs", "Running")
    def take(lease: Lease[Any]) -> Any:
        taken.append(lease.id)
        return lease.relock(wait=600)

    first.submit("jobs", {"phase": "Running"})
    tick = threading.Thread(target=first.run_once)
    tick.start()
    assert box["claimed"].wait(10)
    clock.advance(31)
    second.run_once()
    box["go"].set()
    tick.join(10)
    assert isinstance(box["lost"], LeaseLost)
    assert first.stats()["lost"] == 1
    doc = _doc(db)
    assert doc["attempts"] == 0 and "lastError" not in doc and doc["relocks"] == 1


# -- defect 5: policies that answer nonsense ---------------------------------------------


class Answers:
    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> Any:
        return self.value


BAD_WAITS = [math.nan, None, -1.0, math.inf, "5", True]


@pytest.mark.parametrize("value", BAD_WAITS, ids=repr)
def test_a_retry_policy_answering_nonsense_still_counts_the_attempt(
    make: MakeReplica, db: Database[Any], clock: FakeClock, value: Any
) -> None:
    orch = make(retry_policy=Answers(value))

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        raise RuntimeError("boom")

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    doc = _doc(db)
    assert doc["attempts"] == 1
    assert "retry_policy returned" in doc["lastError"]["message"]
    waited = (as_utc(doc["lockedUntil"]) - clock.now()).total_seconds()
    assert waited == pytest.approx(30)  # the safe wait: one lock timeout


@pytest.mark.parametrize("value", BAD_WAITS, ids=repr)
def test_a_relock_policy_answering_nonsense_is_a_counted_error(
    make: MakeReplica, db: Database[Any], value: Any
) -> None:
    orch = make(relock_policy=Answers(value))

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        return lease.relock()

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    doc = _doc(db)
    assert doc["attempts"] == 1 and doc["lastError"]["type"] == "PolicyError"
    assert "relock_policy returned" in doc["lastError"]["message"]


# -- defect 8: a step whose lease is gone before it starts -------------------------------


def test_a_step_whose_lease_expired_before_it_started_is_handed_back(
    db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(delay=clock.advance, clock=clock)
    orch = Orchestrator(faults.wrap(db), replica_id="slow", clock=clock, lock_timeout=30)
    ran: list[Any] = []

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        ran.append(lease.id)
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    faults.delay_next("find_one_and_update", 31)  # the claim's reply arrives after 31 s
    counts = orch.run_once()
    # The late lease was handed back unrun; a fresh claim in the same tick ran the step.
    assert counts == {"claimed": 2, "released": 1, "advanced": 1, "ticks": 1}
    assert len(ran) == 1
    assert _doc(db)["phase"] == "Done"


# -- defect 9: "failed" in status means the latest attempt failed ------------------------


@pytest.mark.parametrize("recovery", ["unlock", "relock", "advance"])
def test_a_success_after_a_failure_is_no_longer_counted_failed(
    make: MakeReplica, db: Database[Any], clock: FakeClock, recovery: str
) -> None:
    orch = make()
    calls: list[Any] = []

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        calls.append(lease.id)
        if len(calls) == 1:
            raise RuntimeError("flaky")
        if recovery == "advance":
            return lease.advance("Running")
        return getattr(lease, recovery)()

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    assert collect(db).phases[0].failed == 1
    clock.advance(5)
    orch.run_once()
    doc = _doc(db)
    assert "lastError" not in doc and doc["attempts"] == 0
    assert doc["previousError"]["message"] == "flaky"
    assert collect(db).phases[0].failed == 0
    assert collect(db).errors == []


# -- defect 10: an outside writer changes the phase under a held lease -------------------


def test_an_outside_phase_change_wins_over_the_steps_advance(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make(heartbeat=False)
    box = hold_step(orch)
    cancelled: list[Any] = []

    @orch.phase("jobs", "Cancelled")
    def cancel(lease: Lease[Any]) -> Any:
        cancelled.append(lease.id)
        return lease.advance("Gone")

    doc = orch.submit("jobs", {"phase": "Running"})
    tick = threading.Thread(target=orch.run_once)
    tick.start()
    assert box["claimed"].wait(10)
    db.jobs.update_one({"_id": doc["_id"]}, {"$set": {"phase": "Cancelled"}})  # the API
    box["go"].set()
    tick.join(10)
    assert isinstance(box["lost"], LeaseLost)
    assert cancelled == [doc["_id"]]  # released at once, handled in its new phase
    assert _doc(db)["phase"] == "Gone"


def test_an_outside_phase_change_also_wins_over_a_recorded_failure(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(heartbeat=False, max_attempts=1)
    started, go = threading.Event(), threading.Event()

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        started.set()
        go.wait(10)
        raise RuntimeError("gives up")

    doc = orch.submit("jobs", {"phase": "Running"})
    tick = threading.Thread(target=orch.run_once)
    tick.start()
    assert started.wait(10)
    db.jobs.update_one({"_id": doc["_id"]}, {"$set": {"phase": "Cancelled"}})
    go.set()
    tick.join(10)
    stored = _doc(db)
    assert stored["phase"] == "Cancelled" and "lastError" not in stored
    assert "lockToken" not in stored
    assert as_utc(stored["lockedUntil"]) <= clock.now() + timedelta(seconds=0)
