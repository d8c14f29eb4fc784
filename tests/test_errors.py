"""A handler that raises: attempts counted, error recorded, backoff, then the failed phase."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import EPOCH, ExponentialBackoff, Lease, Resource
from orchestrator.core.clock import bson_time
from orchestrator.testing import FakeClock
from tests.conftest import MakeReplica


class Boom(RuntimeError):
    pass


def test_errors_are_counted_recorded_backed_off_then_failed(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make()
    calls: list[int] = []

    @orch.phase(
        "jobs",
        "Running",
        max_attempts=3,
        retry_policy=ExponentialBackoff(base=2, factor=2, cap=60, jitter=0),
    )
    def flaky(lease: Lease[Any]) -> Any:
        calls.append(1)
        raise Boom("upstream said no")

    doc = orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    stored = db.jobs.find_one({"_id": doc["_id"]})
    assert stored is not None
    assert stored["attempts"] == 1
    assert stored["phase"] == "Running"
    assert stored["lastError"]["type"] == "Boom"
    assert stored["lastError"]["message"] == "upstream said no"
    assert stored["lastError"]["phase"] == "Running"
    assert stored["lastError"]["at"] == bson_time(orch.clock.now())
    assert "lockToken" not in stored

    # First retry after 2 s, not before.
    clock.advance(1.9)
    orch.run_once()
    assert len(calls) == 1
    clock.advance(0.2)
    orch.run_once()
    assert len(calls) == 2
    assert db.jobs.find_one({})["attempts"] == 2  # type: ignore[index]

    # Second retry after 4 s; it is the last attempt.
    clock.advance(3.9)
    orch.run_once()
    assert len(calls) == 2
    clock.advance(0.2)
    orch.run_once()
    assert len(calls) == 3
    failed = db.jobs.find_one({})
    assert failed is not None
    assert failed["phase"] == "Failed"
    assert failed["attempts"] == 3
    assert failed["lockedUntil"] == EPOCH
    assert failed["lastError"]["phase"] == "Running"

    # Never retried again.
    clock.advance(3600)
    orch.run_once()
    assert len(calls) == 3
    assert orch.stats()["retrying"] == 2
    assert orch.stats()["failed"] == 1


def test_a_success_resets_the_attempt_count(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(max_attempts=2)
    results = iter([Boom("once"), None, Boom("again"), Boom("twice")])

    @orch.phase("jobs", "Running")
    def sometimes(lease: Lease[Any]) -> Any:
        result = next(results)
        if result is not None:
            raise result
        return lease.unlock()

    orch.submit("jobs", {"phase": "Running"})
    for _ in range(4):
        orch.run_once()
        clock.advance(5)
    stored = db.jobs.find_one({})
    assert stored is not None
    assert stored["phase"] == "Failed", "two failures in a row after the success"
    assert stored["lastError"]["message"] == "twice"


def test_per_handler_failed_phase_and_explicit_fail(make: MakeReplica, db: Database[Any]) -> None:
    orch = make()

    @orch.phase("certs", "Requesting", failed_phase="CertificateRejected")
    def request(lease: Lease[Any]) -> Any:
        return lease.fail("the CA refused the domain")

    orch.submit("certs", {"phase": "Requesting"})
    orch.run_once()
    stored = db.certs.find_one({})
    assert stored is not None
    assert stored["phase"] == "CertificateRejected"
    assert stored["lastError"]["message"] == "the CA refused the domain"


class Gateway(Resource):
    collection = "gateways"
    name: str
    replicas: int


def test_a_document_that_fails_validation_is_recorded_failed_and_the_loop_goes_on(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()
    seen: list[str] = []

    @orch.phase(Gateway, "Creating")
    def create(lease: Lease[Gateway]) -> Any:
        seen.append(lease.resource.name)
        return lease.advance("Created")

    orch.submit(Gateway, {"name": "good", "phase": "Creating", "replicas": 1})
    db.gateways.insert_one(
        {"name": "bad", "phase": "Creating", "replicas": "three", "lockedUntil": EPOCH}
    )
    orch.run_once()
    assert seen == ["good"]
    bad = db.gateways.find_one({"name": "bad"})
    assert bad is not None
    assert bad["phase"] == "Failed"
    assert bad["lastError"]["type"] == "ValidationError"
    assert "replicas" in bad["lastError"]["message"]
    assert db.gateways.find_one({"name": "good"})["phase"] == "Created"  # type: ignore[index]


@pytest.mark.parametrize("returned", [42, "done", {"phase": "Done"}, True])
def test_a_handler_returning_something_else_is_an_error_not_a_crash(
    make: MakeReplica, db: Database[Any], returned: object
) -> None:
    orch = make(max_attempts=1)

    @orch.phase("jobs", "Running")
    def wrong(lease: Lease[Any]) -> Any:
        return returned

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    stored = db.jobs.find_one({})
    assert stored is not None
    assert stored["phase"] == "Failed"
    assert stored["lastError"]["type"] == "TypeError"
    assert type(returned).__name__ in stored["lastError"]["message"]


def test_returning_none_unlocks_and_a_released_lease_refuses_more_writes(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()
    after: list[str] = []

    @orch.phase("jobs", "A")
    def implicit(lease: Lease[Any]) -> None:
        if lease.doc.get("n", 0) == 0:
            lease.unlock(n=1)
            try:
                lease.advance("B")
            except Exception as exc:
                after.append(type(exc).__name__)
            return
        lease.advance("B")

    orch.submit("jobs", {"phase": "A"})
    orch.run_once()
    assert after == ["LeaseLost"]
    assert db.jobs.find_one({})["phase"] == "B"  # type: ignore[index]


def test_an_error_while_recording_the_error_leaves_the_lease_to_expire(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """The step failed and so did the write that records it: nothing is lost, the step
    runs again once the lease expires, and the loop is unharmed."""
    orch = make()
    calls: list[int] = []

    @orch.phase("jobs", "Running")
    def fails_then_succeeds(lease: Lease[Any]) -> Any:
        calls.append(1)
        if len(calls) == 1:
            db.jobs.update_one({"_id": lease.id}, {"$set": {"lockToken": "someone-else"}})
            raise Boom("and the bookkeeping will not land either")
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    counts = orch.run_once()
    assert counts.get("lost") == 1
    db.jobs.update_one({}, {"$unset": {"lockToken": ""}})
    clock.advance(31)
    orch.run_once()
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]


def test_a_retry_policy_that_raises_still_lets_the_attempt_be_counted(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    class Broken:
        def wait(self, *, waited: float, count: int, lock_timeout: float) -> float:
            raise ZeroDivisionError("policy bug")

    orch = make(max_attempts=2)

    @orch.phase("jobs", "Running", retry_policy=Broken())
    def flaky(lease: Lease[Any]) -> Any:
        raise Boom("no")

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()
    assert db.jobs.find_one({})["attempts"] == 1  # type: ignore[index]
    clock.advance(29)
    orch.run_once()
    assert db.jobs.find_one({})["attempts"] == 1, "waits the lock timeout"  # type: ignore[index]
    clock.advance(2)
    orch.run_once()
    assert db.jobs.find_one({})["phase"] == "Failed"  # type: ignore[index]


@pytest.mark.parametrize(
    "cancelled",
    [
        pytest.param(concurrent.futures.CancelledError, id="futures"),
        # Before the fix the threaded engine took a def handler's asyncio.CancelledError
        # (a BaseException) for the process being torn down: the step was 'interrupted',
        # nothing recorded, the lease left held until it expired (found by
        # tests/test_invariants.py).
        pytest.param(asyncio.CancelledError, id="asyncio"),
    ],
)
def test_a_def_handler_raising_a_cancellation_has_its_attempt_recorded(
    make: MakeReplica, db: Database[Any], cancelled: type[BaseException]
) -> None:
    """A plain ``def`` handler whose SDK call (or ``asyncio.run`` inside it) was cancelled
    failed this attempt: recorded and released like any error, and the worker goes on."""
    orch = make()

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        if lease.doc["name"] == "cancelled":
            raise cancelled("the call was cancelled")
        return lease.advance("Done")

    orch.submit("jobs", {"name": "cancelled", "phase": "Running"})
    counts = orch.run_once()
    orch.submit("jobs", {"name": "next", "phase": "Running"})
    orch.run_once()

    stored = db.jobs.find_one({"name": "cancelled"})
    assert stored is not None
    assert counts.get("retrying") == 1, counts
    assert stored["attempts"] == 1
    assert stored["lastError"]["type"] == "CancelledError"
    assert "lockToken" not in stored
    assert db.jobs.find_one({"name": "next"})["phase"] == "Done"  # type: ignore[index]
