"""Continuous scheduling on the threaded runner: a free slot is used whatever else runs,
run_once refuses to wait for itself, stop/start cycles leave one set of workers, and a
step that never returns does not keep the process from exiting."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import Lease, Orchestrator
from orchestrator.testing import FakeClock
from tests.conftest import MakeReplica
from tests.worker_process import read_until, worker_process

ROOT = Path(__file__).resolve().parent.parent


def _workers(orch: Orchestrator) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"orchestrator-{orch.replica_id}"]


def test_an_outside_insert_starts_while_a_long_step_holds_a_slot(
    db: Database[Any], clock: FakeClock
) -> None:
    """With one step blocked, the next tick's free worker claims a document that another
    process inserted: intake does not wait for the long step to end."""
    orch = Orchestrator(db, replica_id="pod-intake", clock=clock, tick=0.05, max_concurrency=4)
    long_started, release, quick_started = threading.Event(), threading.Event(), threading.Event()

    @orch.phase("jobs", "Long")
    def long(lease: Lease[Any]) -> Any:
        long_started.set()
        release.wait(30)
        return lease.advance("Done")

    @orch.phase("jobs", "Quick")
    def quick(lease: Lease[Any]) -> Any:
        quick_started.set()
        return lease.advance("Done")

    orch.start()
    try:
        orch.submit("jobs", {"phase": "Long"})
        assert long_started.wait(10)
        db.jobs.insert_one({"phase": "Quick"})  # from outside: no local wake-up, a tick finds it
        assert quick_started.wait(10), "the free slots sat idle behind the long step"
        assert not release.is_set()
    finally:
        release.set()
        report = orch.stop(timeout=10)
    assert report.still_running == []
    assert db.jobs.count_documents({"phase": "Done"}) == 2


def test_run_once_from_inside_a_step_is_a_clear_recorded_error(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()

    @orch.phase("jobs", "Running")
    def recurse(lease: Lease[Any]) -> Any:
        orch.run_once()
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    orch.run_once()  # returns: the inner call raised instead of waiting for itself
    doc = db.jobs.find_one({})
    assert doc is not None
    assert doc["attempts"] == 1
    assert doc["lastError"]["type"] == "OrchestratorError"
    assert "inside a step" in doc["lastError"]["message"]


def test_stop_and_start_any_number_of_times_leaves_one_set_of_workers(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make("pod-cycles", max_concurrency=3, tick=0.05)  # its own name: its own threads
    done = threading.Event()

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        done.set()
        return lease.advance("Done")

    for _ in range(5):
        orch.start()
        assert len(_workers(orch)) <= 3
        orch.stop(timeout=5)
        for worker in _workers(orch):
            worker.join(5)
        assert _workers(orch) == []
    orch.start()
    orch.submit("jobs", {"phase": "Running"})
    assert done.wait(10)
    orch.stop(timeout=5)
    assert len(_workers(orch)) <= 3


def test_run_once_leaves_no_worker_behind(make: MakeReplica, db: Database[Any]) -> None:
    orch = make("pod-once", max_concurrency=4)

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    for _ in range(3):
        orch.submit("jobs", {"phase": "Running"})
        orch.run_once()
    for worker in _workers(orch):
        worker.join(5)
    assert _workers(orch) == []


STUCK_WORKER = """
import threading
from orchestrator import Orchestrator
from orchestrator.testing import memory_database

orch = Orchestrator(memory_database(), replica_id="stuck-1", tick=0.05, lock_timeout=30)
orch.submit("jobs", {"phase": "Pending"})


@orch.phase("jobs", "Pending")
def never_returns(lease):
    print("step started", flush=True)
    threading.Event().wait()
"""


def test_sigterm_with_a_step_that_never_returns_exits_within_the_stop_timeout(
    tmp_path: Path,
) -> None:
    with worker_process(tmp_path, "stuckworker", STUCK_WORKER, "--stop-timeout", "1") as proc:
        read_until(proc, "step started")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)  # a bound on a hang, not a measured time
    assert proc.returncode == 1, err
    assert "1 step(s) still running" in out
    assert "left to expire" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_replica_drains_a_backlog_with_every_slot(
    make: MakeReplica, db: Database[Any], concurrency: int
) -> None:
    orch = make(max_concurrency=concurrency)
    active, peak = [0], [0]
    lock = threading.Lock()
    gate = threading.Barrier(concurrency, timeout=10)

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        if lease.doc["n"] < concurrency:
            gate.wait()  # the first steps meet: all slots are in use at once
        with lock:
            active[0] -= 1
        return lease.advance("Done")

    for n in range(20):
        orch.submit("jobs", {"phase": "Running", "n": n})
    counts = orch.run_once()
    assert counts["advanced"] == 20
    assert peak[0] == concurrency
