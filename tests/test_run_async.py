"""``orchestrator run`` with an ``AsyncOrchestrator`` target: run with ``asyncio.run``,
stopped through the loop's own signal handlers, with the threaded path's exit statuses."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.worker_process import python_process, read_until, worker_process

ASYNC_WORKER = """
import asyncio
import threading

from orchestrator import AsyncOrchestrator
from orchestrator.testing import async_view, memory_database

db = memory_database()
orch = AsyncOrchestrator(async_view(db), replica_id="async-1", tick=0.05, lock_timeout=30)
db.jobs.insert_one({"_id": "quick", "phase": "Quick"})
db.jobs.insert_one({"_id": "stuck", "phase": "{stuck}"})


@orch.phase("jobs", "Quick", to="Done")
async def quick(lease):
    outcome = await lease.advance("Done")
    print("quick step done", flush=True)  # its outcome landed: nothing of it awaits more
    return outcome


@orch.phase("jobs", "AsyncStuck")
async def never_returns(lease):
    print("step started", flush=True)
    await asyncio.Event().wait()


@orch.phase("jobs", "ThreadStuck")
def never_returns_either(lease):
    print("step started", flush=True)
    threading.Event().wait()
"""


def _worker(stuck: str) -> str:
    return ASYNC_WORKER.replace("{stuck}", stuck)


@pytest.mark.parametrize("stuck", ["AsyncStuck", "ThreadStuck"])
def test_sigterm_with_a_step_that_never_returns_exits_within_the_stop_timeout_async_target(
    tmp_path: Path, stuck: str
) -> None:
    """An ``async def`` step that never returns is cancelled when the loop ends, a ``def``
    one is left on its daemon thread: either way the process exits after the stop
    timeout, its lease left to expire, and says so as the threaded path does."""
    with worker_process(tmp_path, "asyncworker", _worker(stuck), "--stop-timeout", "1") as proc:
        seen = "".join(read_until(proc, "step started"))
        if "quick step done" not in seen:
            # The quick step must be over before the stop, or it may be still running (or
            # unstarted) when it comes: the count below is of the stuck step alone.
            seen += "".join(read_until(proc, "quick step done"))
        assert "replica async-1 running 3 handlers" in seen
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)  # a bound on a hang, not a measured time
    assert proc.returncode == 1, err
    assert out.strip().splitlines()[-1] == (
        "replica async-1 stopped: 0 unstarted lease(s) handed back, 1 step(s) still running"
    )
    assert "left to expire" in err
    assert "Traceback" not in err


def test_an_async_target_runs_its_steps_and_stops_gracefully_on_ctrl_c(tmp_path: Path) -> None:
    with worker_process(tmp_path, "asyncworker", _worker("Parked")) as proc:
        read_until(proc, "quick step done")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # a bound on a hang, not a measured time
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == (
        "replica async-1 stopped: 0 unstarted lease(s) handed back, 0 step(s) still running"
    )
    assert "orchestrator started" in err
    assert "Traceback" not in err


UNREACHABLE_ASYNC_WORKER = """
from pymongo import AsyncMongoClient
from orchestrator import AsyncOrchestrator

client = AsyncMongoClient("mongodb://ops:hunter2@127.0.0.1:1/x")
orch = AsyncOrchestrator(client["x"], replica_id="w")


@orch.phase("jobs", "Pending")
async def finish(lease):
    return await lease.advance("Done")
"""


def test_an_async_target_fails_within_its_connect_timeout_with_the_reason(tmp_path: Path) -> None:
    with worker_process(
        tmp_path, "faraway", UNREACHABLE_ASYNC_WORKER, "--connect-timeout", "0.2"
    ) as proc:
        _, err = proc.communicate(timeout=60)  # a bound against hanging, not a timing claim
    assert proc.returncode == 2, err
    assert err.count("\n") == 1, err
    assert "cannot reach MongoDB within 0.2s" in err
    assert "[Errno 111]" in err  # the reason (the async driver words it its own way)
    assert "hunter2" not in err


def test_the_shipped_gateway_worker_runs_under_orchestrator_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``orchestrator run orchestrator.demo.workflows:worker``, the packaged path the README
    gives: the async workflow, on its own store without MONGODB_URI, started and stopped by
    a signal like any async target."""
    monkeypatch.delenv("MONGODB_URI", raising=False)
    with python_process(
        tmp_path, "unused", "", "-m", "orchestrator", "run", "orchestrator.demo.workflows:worker"
    ) as proc:
        read_until(proc, "running 17 handlers")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)  # a bound on a hang, not a measured time
    assert proc.returncode == 0, err
    assert "0 step(s) still running" in out.strip().splitlines()[-1]
    assert "MONGODB_URI is not set" in err
    assert "Traceback" not in err
