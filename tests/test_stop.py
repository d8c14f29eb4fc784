"""Graceful stop, and the background loop driven by APScheduler."""

from __future__ import annotations

import threading
from typing import Any

from pymongo.database import Database

from orchestrator import EPOCH, Lease, Orchestrator
from orchestrator.mongo import Store
from orchestrator.runners._sync.taking import Claims
from orchestrator.testing import FakeClock
from tests.conftest import MakeReplica


def test_stop_hands_back_claimed_but_unstarted_work_and_waits_for_running_steps(
    make: MakeReplica, db: Database[Any], monkeypatch: Any
) -> None:
    orch = make(max_concurrency=2)
    started = threading.Event()
    finish = threading.Event()
    ran: list[str] = []

    @orch.phase("jobs", "Running")
    def long_step(lease: Lease[Any]) -> Any:
        ran.append(lease.doc["name"])
        started.set()
        finish.wait(5)
        return lease.advance("Done")

    for name in ("first", "second"):
        orch.submit("jobs", {"name": name, "phase": "Running"})

    claims = 0
    second_claimed = threading.Event()
    real_claim = Store.claim

    def claim_then_sigterm(self: Store, *args: Any, **kwargs: Any) -> Any:
        # SIGTERM arrives while the second claim's round trip is under way.
        nonlocal claims
        doc = real_claim(self, *args, **kwargs)
        claims += 1
        if claims == 2:
            assert started.wait(5)
            orch.request_stop()
            second_claimed.set()
        return doc

    monkeypatch.setattr(Store, "claim", claim_then_sigterm)
    tick = threading.Thread(target=orch.run_once)
    tick.start()
    assert started.wait(5)
    assert second_claimed.wait(5)

    stopper: dict[str, Any] = {}
    stop_thread = threading.Thread(target=lambda: stopper.update(report=orch.stop(timeout=5)))
    stop_thread.start()
    finish.set()
    stop_thread.join()
    tick.join()

    report = stopper["report"]
    second = db.jobs.find_one({"name": "second"})
    assert second is not None
    assert ran == ["first"]
    assert report.released == [f"jobs/{second['_id']}"]
    assert report.still_running == []
    assert second["lockedUntil"] == EPOCH and "lockToken" not in second
    assert db.jobs.find_one({"name": "first"})["phase"] == "Done"  # type: ignore[index]


def test_stop_says_which_steps_were_still_running(make: MakeReplica) -> None:
    orch = make()
    started, release = threading.Event(), threading.Event()

    @orch.phase("jobs", "Running")
    def stuck(lease: Lease[Any]) -> Any:
        started.set()
        release.wait(10)
        return lease.advance("Done")

    doc = orch.submit("jobs", {"phase": "Running"})
    tick = threading.Thread(target=orch.run_once)
    tick.start()
    assert started.wait(5)
    report = orch.stop(timeout=0)
    release.set()
    tick.join()
    assert report.still_running == [f"jobs/{doc['_id']}"]


def test_the_background_loop_runs_steps_and_survives_a_failing_tick(
    db: Database[Any], clock: FakeClock, monkeypatch: Any
) -> None:
    """start(): the APScheduler job ticks; a worker that meets an unexpected error (a bug,
    not a StoreError) is logged, counted, and replaced at the next tick."""
    orch = Orchestrator(db, replica_id="pod-bg", clock=clock, tick=0.05, lock_timeout=30)
    done = threading.Event()
    failed_once = threading.Event()

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        done.set()
        return lease.advance("Done")

    real_claim = Claims.claim

    def failing_once(self: Claims, handler: Any) -> Any:
        if not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("a bug in the claim path")
        return real_claim(self, handler)

    monkeypatch.setattr(Claims, "claim", failing_once)
    orch.start()
    try:
        # Written as another process would: a local submit may lend the step its lease,
        # with no claim to fail.
        db.jobs.insert_one({"phase": "Running"})
        assert done.wait(10), "the loop should run the step after the failed tick"
    finally:
        report = orch.stop(timeout=5)
    assert failed_once.is_set()
    assert orch.stats()["tick_failures"] == 1
    assert report.still_running == []
    assert db.jobs.find_one({})["phase"] == "Done"  # type: ignore[index]
