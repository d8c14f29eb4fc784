"""Relock and retry waits: the proven progressive table, the floor, the cap, pluggability."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import EPOCH, ExponentialBackoff, Lease, ProgressiveBackoff, Settings
from orchestrator.testing import FakeClock
from tests.conftest import MakeReplica

TABLE = [(1, 0.1), (10, 1.0), (30, 3.0), (120, 12.0), (180, 30.0)]


@pytest.mark.pure
@pytest.mark.parametrize(("waited", "expected"), TABLE)
def test_progressive_policy_is_a_tenth_of_the_wait_then_the_lock_timeout(
    waited: float, expected: float
) -> None:
    assert ProgressiveBackoff().wait(waited=waited, count=1, lock_timeout=30) == pytest.approx(
        expected
    )


@pytest.mark.parametrize(("tick", "floor_applies"), [(1.0, True), (0.05, False)])
@pytest.mark.parametrize(("waited", "expected"), TABLE)
def test_relock_makes_the_document_claimable_after_the_policy_wait(
    make: MakeReplica,
    db: Database[Any],
    clock: FakeClock,
    waited: float,
    expected: float,
    tick: float,
    floor_applies: bool,
) -> None:
    """Waited 1 s, 10 s, 30 s, 120 s, 180 s: next claim after 0.1 s (raised to the floor of
    one tick), 1 s, 3 s, 12 s and the lock timeout."""
    orch = make(tick=tick)
    waits: list[float | None] = []

    @orch.phase("certs", "Waiting")
    def wait_for_cert(lease: Lease[Any]) -> Any:
        out = lease.relock()
        waits.append(out.wait)
        return out

    doc = orch.submit("certs", {"phase": "Waiting"})
    db.certs.update_one(
        {"_id": doc["_id"]},
        {"$set": {"updatedAt": orch.clock.now() - timedelta(seconds=waited)}},
    )
    orch.run_once()
    effective = max(expected, tick)
    assert waits == [pytest.approx(effective)]
    stored = db.certs.find_one({"_id": doc["_id"]})
    assert stored is not None
    assert stored["relocks"] == 1
    assert "lockToken" not in stored

    # Not claimable a moment before the wait is over, claimable right after it.
    clock.advance(effective - 0.01)
    orch.run_once()
    assert len(waits) == 1
    clock.advance(0.02)
    orch.run_once()
    assert len(waits) == 2
    if floor_applies and expected < tick:
        assert waits[0] == pytest.approx(tick)


def test_relock_with_an_explicit_wait_overrides_the_policy_and_is_capped(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make(max_wait=600)
    waits: list[float | None] = []

    @orch.phase("jobs", "Polling")
    def poll(lease: Lease[Any]) -> Any:
        out = lease.relock(wait=10_000)
        waits.append(out.wait)
        return out

    orch.submit("jobs", {"phase": "Polling"})
    orch.run_once()
    assert waits == [600]
    clock.advance(599)
    orch.run_once()
    assert len(waits) == 1
    clock.advance(2)
    orch.run_once()
    assert len(waits) == 2


def test_relock_with_a_missing_updated_at_still_waits_the_floor(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()
    waits: list[float | None] = []

    @orch.phase("jobs", "Polling")
    def poll(lease: Lease[Any]) -> Any:
        out = lease.relock()
        waits.append(out.wait)
        return out

    db.jobs.insert_one({"phase": "Polling", "lockedUntil": EPOCH})
    orch.run_once()
    assert waits == [1.0]


@pytest.mark.pure
def test_a_custom_relock_policy_is_used() -> None:
    class Fixed:
        def wait(self, *, waited: float, count: int, lock_timeout: float) -> float:
            return 7.0

    assert (
        Settings(relock_policy=Fixed()).relock_policy.wait(waited=0, count=1, lock_timeout=1) == 7
    )


@pytest.mark.pure
def test_exponential_backoff_doubles_is_capped_and_jittered_downwards() -> None:
    policy = ExponentialBackoff(base=1, factor=2, cap=20, jitter=0.1, rng=random.Random(7))
    waits = [policy.wait(waited=0, count=n, lock_timeout=30) for n in range(1, 8)]
    for n, wait in enumerate(waits, start=1):
        ceiling = min(20, 2 ** (n - 1))
        assert ceiling * 0.9 <= wait <= ceiling
    with pytest.raises(ValueError):
        ExponentialBackoff(jitter=1.5)


@pytest.mark.pure
@pytest.mark.parametrize(
    "bad",
    [{"base": 0}, {"factor": 0.99}, {"cap": 0}, {"jitter": -0.01}, {"jitter": 1.0}],
)
def test_an_exponential_policy_that_could_not_wait_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="ExponentialBackoff needs base > 0, factor >= 1"):
        ExponentialBackoff(**bad)


@pytest.mark.pure
def test_an_exponential_policy_starts_at_its_base_and_never_overflows() -> None:
    exact = ExponentialBackoff(base=0.5, factor=1, cap=0.5, jitter=0)
    assert exact.wait(waited=0, count=9, lock_timeout=30) == 0.5
    policy = ExponentialBackoff(base=2, factor=3, cap=1e300, jitter=0)
    assert [policy.wait(waited=0, count=n, lock_timeout=30) for n in (0, 1, 2, 3)] == [2, 2, 6, 18]
    assert policy.wait(waited=0, count=10**6, lock_timeout=30) == 2 * 3.0**64


@pytest.mark.pure
def test_the_progressive_policy_waits_a_tenth_up_to_its_threshold_and_never_less_than_0() -> None:
    policy = ProgressiveBackoff(threshold=60, divisor=4)
    assert policy.wait(waited=60, count=1, lock_timeout=30) == 15
    assert policy.wait(waited=60.5, count=1, lock_timeout=30) == 30
    assert policy.wait(waited=-5, count=1, lock_timeout=30) == 0
    assert ProgressiveBackoff().wait(waited=120, count=1, lock_timeout=7) == 12
