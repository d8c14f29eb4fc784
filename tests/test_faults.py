"""The fault-injecting wrapper, and the defined behaviour of each network fault."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import AutoReconnect, ServerSelectionTimeoutError

from orchestrator import Lease, Orchestrator
from orchestrator.testing import FakeClock
from orchestrator.testing.faults import TRANSIENT, Faults, ReplicaCrashed


def _replica(
    db: Database[Any], faults: Faults, clock: FakeClock, name: str, **options: Any
) -> Orchestrator:
    orch = Orchestrator(
        faults.wrap(db),
        replica_id=name,
        clock=clock,
        lock_timeout=30,
        clock_refresh=1e6,
        **options,
    )
    orch.measure_clock()  # before any clock.advance: see tests/conftest.py
    return orch


def _runs(orch: Orchestrator, ran: list[str], nxt: str = "Done") -> None:
    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        ran.append(orch.replica_id)
        return lease.advance(nxt)


def test_transient_errors_are_the_drivers_and_the_same_seed_gives_the_same_faults(
    db: Database[Any], clock: FakeClock
) -> None:
    def errors(seed: int) -> list[str]:
        faults = Faults(seed=seed, rate=0.5, clock=clock)
        jobs = faults.wrap(db).get_collection("jobs")
        seen = []
        for _ in range(40):
            try:
                jobs.find_one({})
                seen.append("ok")
            except TRANSIENT as exc:
                seen.append(type(exc).__name__)
        assert faults.injected.total() == 40 - seen.count("ok")
        return seen

    first = errors(7)
    assert first == errors(7)
    assert first != errors(8)
    assert {"AutoReconnect", "NetworkTimeout", "NotPrimaryError", "ok"} == set(first)


def test_rates_per_operation_and_slow_operations_through_the_injected_delay(
    db: Database[Any], clock: FakeClock
) -> None:
    waits: list[float] = []
    faults = Faults(
        rate=1.0, rates={"insert_one": 0.0}, slow=1.0, slow_seconds=10, delay=waits.append
    )
    jobs = faults.wrap(db)["jobs"]
    jobs.insert_one({"n": 1})  # never fails, always slow
    with pytest.raises(AutoReconnect):
        jobs.find_one({})
    assert len(waits) == 1 and 0 <= waits[0] <= 10
    assert faults.operations == {"insert_one": 1, "find_one": 1}
    with faults.quiet():
        assert jobs.find_one({})["n"] == 1  # type: ignore[index]


def test_an_outage_window_is_judged_by_the_fake_clock(db: Database[Any], clock: FakeClock) -> None:
    faults = Faults(clock=clock)
    jobs = faults.wrap(db)["jobs"]
    faults.cut_off(20)
    with pytest.raises(ServerSelectionTimeoutError):
        jobs.insert_one({"n": 1})
    clock.advance(19.9)
    with pytest.raises(ServerSelectionTimeoutError):
        jobs.find_one({})
    clock.advance(0.2)
    jobs.insert_one({"n": 1})
    assert faults.injected == {"outage": 2}


def test_a_lost_claim_reply_leaves_the_lease_until_it_expires_and_nothing_is_lost(
    db: Database[Any], clock: FakeClock
) -> None:
    """The defined behaviour: the server applied the claim, the replica never learnt its
    token, so nobody runs the step until the lease expires; then it runs once."""
    faults = Faults(clock=clock)
    unlucky, other = _replica(db, faults, clock, "pod-1"), _replica(db, Faults(), clock, "pod-2")
    ran: list[str] = []
    _runs(unlucky, ran)
    _runs(other, ran)
    unlucky.submit("jobs", {"phase": "Running"})
    faults.fail_next("find_one_and_update", applied=True)

    assert unlucky.run_once() == {"claim_errors": 1, "ticks": 1}  # the tick goes on
    held = db.jobs.find_one({})
    assert held is not None and held["lockedBy"] == "pod-1" and held["lockToken"]
    clock.advance(29.9)
    other.run_once()
    unlucky.run_once()
    assert ran == []
    clock.advance(0.2)
    other.run_once()
    assert ran == ["pod-2"]
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


def test_a_lost_reply_to_an_advance_is_not_run_again(db: Database[Any], clock: FakeClock) -> None:
    faults = Faults(clock=clock)
    orch = _replica(db, faults, clock, "pod-1")
    ran: list[str] = []
    _runs(orch, ran)
    orch.submit("jobs", {"phase": "Running"})
    faults.fail_next("update_one", applied=True)
    counts = orch.run_once()
    # The advance landed; recording the "error" then found the lease gone: no retry.
    assert counts.get("lost") == 1
    clock.advance(600)
    orch.run_once()
    assert ran == ["pod-1"]
    doc = db.jobs.find_one({})
    assert doc is not None and doc["phase"] == "Done" and "lastError" not in doc


def test_an_error_before_the_advance_reaches_the_server_retries_the_step(
    db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(clock=clock)
    orch = _replica(db, faults, clock, "pod-1")
    ran: list[str] = []
    _runs(orch, ran)
    orch.submit("jobs", {"phase": "Running"})
    faults.fail_next("update_one")
    assert orch.run_once().get("retrying") == 1
    doc = db.jobs.find_one({})
    assert doc is not None and doc["phase"] == "Running"
    assert doc["lastError"]["type"] == "StoreError" and doc["attempts"] == 1
    clock.advance(5)
    orch.run_once()
    assert ran == ["pod-1", "pod-1"]  # the interrupted step runs again: at least once
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


@pytest.mark.parametrize("applied", [False, True])
def test_a_replica_dying_mid_advance_leaves_its_lease_to_expire(
    db: Database[Any], clock: FakeClock, applied: bool
) -> None:
    faults = Faults(clock=clock)
    # One worker: the dying replica starts one step before it dies. With more, how many
    # it started first is the machine's timing (a loaded run started both), not the test's.
    dying = _replica(db, faults, clock, "pod-1", max_concurrency=1)
    survivor = _replica(db, Faults(), clock, "pod-2")
    ran: list[str] = []
    _runs(dying, ran)
    _runs(survivor, ran)
    dying.submit("jobs", {"phase": "Running"})
    survivor.submit("jobs", {"phase": "Running", "n": 2})
    faults.crash_next("update_one", applied=applied)
    with pytest.raises(ReplicaCrashed):
        # Its step died; its next claim finds the process gone: in this tick if a worker
        # claims again, else in the next one.
        dying.run_once()
        dying.run_once()
    assert faults.dead
    clock.advance(30.1)
    survivor.run_once()
    expected_runs = 2 if applied else 3  # the unapplied step runs again; nothing else does
    assert len(ran) == expected_runs
    assert db.jobs.count_documents({"phase": "Done"}) == 2


def test_a_database_outage_fails_no_tick_and_the_work_resumes(
    db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(clock=clock)
    orch = _replica(db, faults, clock, "pod-1")
    ran: list[str] = []
    _runs(orch, ran)
    orch.submit("jobs", {"phase": "Running"})
    faults.cut_off(60)
    for _ in range(3):
        assert orch.run_once() == {"claim_errors": 1, "ticks": 1}
        clock.advance(20)
    orch.run_once()
    assert ran == ["pod-1"]


def test_wraps_a_real_pymongo_database_unchanged() -> None:
    client: MongoClient[Any] = MongoClient("mongodb://127.0.0.1:1/", connect=False)
    faults = Faults(rate=1.0)
    db = faults.wrap(client["app"])
    assert db.name == "app" and db.client is client
    jobs = db.get_collection("jobs").with_options(write_concern=None)
    assert jobs.full_name == "app.jobs"
    with pytest.raises(TRANSIENT):
        jobs.find_one_and_update({}, {"$set": {"a": 1}})  # refused before any network
    client.close()


@pytest.mark.parametrize(
    "kwargs",
    [{"rate": 1.5}, {"lost_reply": -0.1}, {"rates": {"find": 2.0}}, {"slow_seconds": -1}],
)
def test_invalid_fault_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Faults(**kwargs)
    with pytest.raises(ValueError):
        Faults().fail_next("no_such_operation")
