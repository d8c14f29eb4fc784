"""Replicas as separate OS processes on a real server, one of them killed mid-step.

Every other test runs its replicas as threads of one process. Users run pods: processes
that share nothing but the database. Three processes here each run ``orchestrator run``
(an ``Orchestrator`` started with ``start()``) over a three-step workflow; one is killed
with SIGKILL in the middle of a step. Its lease must be taken over only after it expires,
every document must finish, and no step may run twice except the one interrupted.
Conditions are awaited by polling the database with a deadline. The demo's
``--processes`` mode is checked here too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from orchestrator import Orchestrator
from orchestrator.cli import main as cli
from orchestrator.core.clock import as_utc
from orchestrator.core.steps import started
from orchestrator.demo.processes import REPLICAS
from tests.conftest import MONGODB_URI
from tests.process_replica import COLLECTION, LOCK_TIMEOUT, STEPS

pytestmark = [
    pytest.mark.mongodb,
    pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set"),
]

DOCUMENTS = 300
ROOT = Path(__file__).resolve().parent.parent


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, context: Callable[[], str]
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail saying what never came,
    with ``context()`` (the replicas' logs)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{context()}")
        time.sleep(0.1)  # the poll interval, not a stand-in for synchronisation


class Replicas:
    """The replica processes of one test; whatever is still running at the end is killed."""

    def __init__(self, db: Database[Any], logs: Path) -> None:
        self.db = db
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(
        self, name: str, *, hang_at: str = "", hang_after: int = 0, concurrency: int = 2
    ) -> None:
        env = {
            **os.environ,
            "MONGODB_URI": str(MONGODB_URI),
            "PROCESS_TEST_DB": self.db.name,
            "PROCESS_TEST_REPLICA": name,
            "PROCESS_TEST_HANG_AT": hang_at,
            "PROCESS_TEST_HANG_AFTER": str(hang_after),
            "PROCESS_TEST_CONCURRENCY": str(concurrency),
        }
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "run", "tests.process_replica:replica"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]

    def all_logs(self) -> str:
        return "\n".join(f"--- {name}:\n{self.log(name)}" for name in self.procs)

    def exit_code(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not exit within {timeout:g}s:\n{self.log(name)}")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def database() -> Iterator[Database[Any]]:
    client: MongoClient[Any] = MongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
    name = f"orchestrator_procs_{uuid.uuid4().hex[:8]}"
    try:
        yield client[name]
    finally:
        client.drop_database(name)
        client.close()


@pytest.fixture
def replicas(database: Database[Any], tmp_path: Path) -> Iterator[Replicas]:
    group = Replicas(database, tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


def test_three_processes_share_the_work_and_a_killed_ones_step_is_taken_over(
    database: Database[Any], replicas: Replicas
) -> None:
    db = database
    db.effects.create_index([("doc", 1), ("step", 1)], unique=True)
    submitter = Orchestrator(db, replica_id="submitter")
    for n in range(DOCUMENTS):
        submitter.submit(COLLECTION, {"n": n, "phase": STEPS[0]})

    # One step at a time in the victim: when it hangs, no other step of it is in flight.
    replicas.spawn("proc-victim", hang_at="B", hang_after=20, concurrency=1)
    replicas.spawn("proc-1")
    replicas.spawn("proc-2")

    hanging = wait_for(
        lambda: db.markers.find_one({"_id": "hanging"}),
        120,
        "the victim to hang mid-step",
        replicas.all_logs,
    )
    replicas.procs["proc-victim"].send_signal(signal.SIGKILL)
    assert replicas.exit_code("proc-victim", 10) == -signal.SIGKILL
    # Nobody else can touch the lease before it expires: this is what the victim left.
    left = db[COLLECTION].find_one({"_id": hanging["doc"]})
    assert left is not None and left["lockedBy"] == "proc-victim" and left["lockToken"]
    assert left["phase"] == hanging["step"]
    expiry = as_utc(left["lockedUntil"])
    done_at_kill = db[COLLECTION].count_documents({"phase": "Done"})

    wait_for(
        lambda: db[COLLECTION].count_documents({"phase": "Done"}) == DOCUMENTS,
        240,
        f"all {DOCUMENTS} documents to reach Done",
        replicas.all_logs,
    )
    for name in ("proc-1", "proc-2"):
        replicas.procs[name].send_signal(signal.SIGTERM)
    for name in ("proc-1", "proc-2"):
        assert replicas.exit_code(name, 30) == 0, replicas.log(name)
        assert f"replica {name} stopped" in replicas.log(name)

    # Every step ran, once: the unique index holds one effect per (document, step).
    assert db.effects.count_documents({}) == DOCUMENTS * len(STEPS)
    by_step = Counter(e["step"] for e in db.effects.find({}, {"step": 1}))
    assert by_step == dict.fromkeys(STEPS, DOCUMENTS)
    # ... except the interrupted one, run again by a survivor after the lease expired.
    repeats = list(db.repeats.find({}, {"_id": 0}))
    assert len(repeats) == 1, repeats
    [repeat] = repeats
    assert (repeat["doc"], repeat["step"]) == (hanging["doc"], hanging["step"])
    assert repeat["by"] in {"proc-1", "proc-2"}
    assert as_utc(repeat["claimedAt"]) >= expiry, "taken over before the lease expired"
    assert (expiry - as_utc(left["lockedAt"])).total_seconds() == pytest.approx(LOCK_TIMEOUT)

    # The work was shared, and nothing was left failed or held.
    workers = Counter(e["by"] for e in db.effects.find({}, {"by": 1}))
    assert set(workers) == {"proc-victim", "proc-1", "proc-2"}, workers
    assert db[COLLECTION].count_documents({"lastError": {"$exists": True}}) == 0
    assert db[COLLECTION].count_documents({"lockToken": {"$exists": True}}) == 0
    print(
        f"{DOCUMENTS} documents x {len(STEPS)} steps on 3 processes, one killed with "
        f"{done_at_kill} done: steps by process "
        f"{dict(workers)}; run twice: {len(repeats)} (the interrupted {hanging['step']} of "
        f"{hanging['doc']}, taken over by {repeat['by']} "
        f"{(as_utc(repeat['claimedAt']) - expiry).total_seconds():.2f}s after its lease expired)"
    )


def test_the_demo_with_replica_processes_passes_its_audit(
    database: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # The size the README's multi-process demo is said to pass at, certificates relocking.
    argv = ["demo", "--processes", "3", "--gateways", "20"]
    code = cli.main([*argv, "--uri", str(MONGODB_URI), "--db", database.name])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3 replica processes" in out
    assert "steps run twice: 0" in out
    assert "every replica stopped cleanly" in out
    assert "all invariants hold" in out
    # Each process published its own counts: the report's steps are theirs.
    published = {d["_id"]: d for d in database[REPLICAS].find({})}
    assert set(published) == {"replica-1", "replica-2", "replica-3"}
    assert all(d["stopped"] and d["pid"] for d in published.values())
    assert len({d["pid"] for d in published.values()}) == 3
    for name, report in published.items():
        assert f"{name} {started(report['stats'])}" in out
