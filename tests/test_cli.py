"""The ``orchestrator`` command: each subcommand, and each bad input as one clear line."""

from __future__ import annotations

import io
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import pytest
from bson import ObjectId
from pymongo.database import Database
from rich.console import Console

import orchestrator
from orchestrator import Lease, LeaseLost, Orchestrator
from orchestrator.cli import connecting
from orchestrator.core.clock import bson_time
from orchestrator.demo import run as demo
from orchestrator.demo.run import DemoOptions
from orchestrator.demo.workflows import gateway
from orchestrator.testing import FakeClock
from orchestrator.testing.memory import MemoryDatabase
from tests.cli_kit import URI, assert_one_line_error, publish, run
from tests.conftest import MakeEither
from tests.engines import hold, wait

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def connected(db: Database[Any], monkeypatch: pytest.MonkeyPatch) -> Database[Any]:
    """``--uri`` resolves to the test database (in-memory, or the real server)."""
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    return db


def seed(db: Database[Any], clock: FakeClock) -> Orchestrator:
    """Three gateways: one done, one whose step keeps failing, one held by a dead replica;
    the replica's record is live (a retry goes only to a phase a live replica handles)."""
    orch = Orchestrator(db, replica_id="pod-1", clock=clock, clock_refresh=1e6, max_attempts=2)

    @orch.phase("gateways", "Deleting", to="Deleted")
    def delete(lease: Lease[Any]) -> Any:
        if lease.doc["name"] == "broken":
            raise RuntimeError("stage API said no")
        return lease.advance("Deleted")

    for name in ("done", "broken"):
        orch.submit("gateways", {"_id": name, "name": name, "phase": "Deleting"})
    orch.run_once()
    clock.advance(10)
    orch.run_once()
    db.gateways.insert_one(
        {
            "_id": "stuck",
            "name": "stuck",
            "phase": "Deleting",
            "lockedAt": bson_time(orch.clock.now() - timedelta(seconds=100)),
            "lockedUntil": bson_time(orch.clock.now() - timedelta(seconds=70)),
            "lockToken": "dead",
            "lockedBy": "pod-9",
        }
    )
    publish(db, orch)
    return orch


def test_status_reports_counts_leases_and_errors_as_json(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(connected, clock)
    code, out, _ = run(["status", "--uri", URI, "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    rows = {(r["collection"], r["phase"]): r for r in report["phases"]}
    assert rows[("gateways", "Deleted")]["count"] == 1
    assert rows[("gateways", "Failed")]["failed"] == 1
    assert rows[("gateways", "Deleting")]["overdue"] == 1
    assert rows[("gateways", "Deleting")]["leased"] == 0
    [error] = report["errors"]
    assert error["id"] == "broken"
    assert error["type"] == "RuntimeError"
    assert error["message"] == "stage API said no"


def test_status_prints_a_table(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(connected, clock)
    code, out, _ = run(["status", "--uri", URI, "-c", "gateways"], capsys)
    assert code == 0
    assert "gateways" in out and "Deleting" in out and "overdue" in out
    assert "RuntimeError: stage API" in out


def test_status_refuses_an_unknown_collection(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(connected, clock)
    code, _, err = run(["status", "--uri", URI, "-c", "gatewayz"], capsys)
    assert_one_line_error(code, err, "unknown collection 'gatewayz'", "gateways")


def test_an_unreachable_server_fails_fast_without_showing_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri = "mongodb://ops:hunter2@127.0.0.1:1/platform"
    started = time.monotonic()
    code, out, err = run(["status", "--uri", uri, "--connect-timeout", "0.3"], capsys)
    assert time.monotonic() - started < 10  # a bound against hanging, not a timing claim
    assert_one_line_error(code, err, "cannot reach MongoDB", "ops:***@127.0.0.1:1")
    assert "hunter2" not in out + err


def test_a_malformed_uri_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["status", "--uri", "mongodb://ops:hunter2@/"], capsys)
    assert_one_line_error(code, err, "URI")
    assert "hunter2" not in out + err


def test_status_needs_a_database(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    code, _, err = run(["status"], capsys)
    assert_one_line_error(code, err, "MONGODB_URI")


def test_unlock_frees_a_dead_replicas_lease(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    orch = seed(connected, clock)
    code, out, _ = run(["unlock", "stuck", "-c", "gateways", "--uri", URI], capsys)
    assert code == 0
    assert "unlocked gateways/stuck" in out
    doc = connected.gateways.find_one({"_id": "stuck"})
    assert "lockToken" not in doc
    assert orch.run_once().get("advanced") == 1  # claimable at once


def test_retry_sends_a_failed_document_back_to_its_error_phase(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(connected, clock)
    code, out, _ = run(["retry", "broken", "-c", "gateways", "--uri", URI], capsys)
    assert code == 0
    assert "Failed -> Deleting" in out
    doc = connected.gateways.find_one({"_id": "broken"})
    assert doc["phase"] == "Deleting"
    assert doc["attempts"] == 0
    assert "lastError" not in doc
    assert doc["previousError"]["message"] == "stage API said no"

    code, out, _ = run(
        ["retry", "done", "-c", "gateways", "--phase", "Deleting", "--uri", URI], capsys
    )
    assert code == 0
    assert connected.gateways.find_one({"_id": "done"})["phase"] == "Deleting"


@pytest.mark.parametrize("command", ["unlock", "retry"])
def test_operators_commands_refuse_missing_documents_and_collections(
    command: str, connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(connected, clock)
    code, _, err = run([command, "nope", "-c", "gateways", "--uri", URI], capsys)
    assert_one_line_error(code, err, "no document 'nope'")
    code, _, err = run([command, "done", "-c", "gatewayz", "--uri", URI], capsys)
    assert_one_line_error(code, err, "unknown collection 'gatewayz'")


def test_retry_without_a_recorded_phase_asks_for_one(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(connected, clock)
    code, _, err = run(["retry", "done", "-c", "gateways", "--uri", URI], capsys)
    assert_one_line_error(code, err, "pass --phase")


def test_graph_draws_the_gateway_workflow(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["graph", "examples.gateway:worker"], capsys)
    assert code == 0
    assert out.startswith("stateDiagram-v2\n")
    assert "gateways_Creating --> gateways_Created : provision" in out
    assert "gateways_Created --> gateways_Deleting : begin_deletion [state=Deleted]" in out
    assert "gateways_Deleting --> gateways_DroppingData : delete_children" in out
    assert "gateways_DroppingData --> gateways_Deleted : drop_data" in out
    assert "runtimeDomains_Creating --> runtimeDomains_Created : create_domain" in out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("examples.gateway", "expected module:attribute"),
        ("no_such_module:orch", "cannot import 'no_such_module'"),
        ("examples.gateway:nothing", "has no attribute 'nothing'"),
        ("orchestrator.demo.workflows.gateway:CREATE_ORDER", "is a tuple, not an Orchestrator"),
        # A model, not an orchestrator: it was called, and printed a page of pydantic's
        # errors about its missing fields.
        (
            "orchestrator.demo.workflows.gateway:Gateway",
            "is the Resource model Gateway (a document type), not an Orchestrator or"
            " AsyncOrchestrator",
        ),
        ("orchestrator.core.settings:HandlerOptions", "is the pydantic model HandlerOptions"),
        ("pathlib:Path", "is the class Path, not an Orchestrator"),
    ],
)
def test_graph_and_run_refuse_a_wrong_target(
    target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("graph", "run"):
        code, _, err = run([command, target], capsys)
        assert_one_line_error(code, err, message)


def test_a_target_function_that_raises_a_long_error_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A factory that fails with pydantic's many-line error: its first line only."""
    (tmp_path / "broken_factory.py").write_text(
        "from orchestrator import Resource\n"
        "class Invoice(Resource):\n"
        "    number: int\n"
        "    total: float\n"
        "def make():\n"
        "    return Invoice()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(["run", "broken_factory:make"], capsys)
    assert_one_line_error(
        code, err, "broken_factory:make() failed: invalid Invoice: phase: required; number:"
    )


def test_demo_at_a_tiny_size_passes_its_audit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    code, out, _ = run(
        ["demo", "--gateways", "6", "--replicas", "2", "--cert-delay", "0.2", "--seed", "3"],
        capsys,
    )
    assert code == 0, out
    assert "steps run twice" in out
    assert "all invariants hold" in out


def test_demo_refuses_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["demo", "--gateways", "0"], capsys)
    assert_one_line_error(code, err, "--gateways")
    code, _, err = run(["demo", "--delete-fraction", "1.5"], capsys)
    assert_one_line_error(code, err, "--delete-fraction")


def test_demo_processes_need_a_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    code, _, err = run(["demo", "--processes", "2"], capsys)
    assert_one_line_error(code, err, "--processes needs MONGODB_URI")


WORKER = """
from orchestrator import Orchestrator
from orchestrator.testing import memory_database

orch = Orchestrator(memory_database(), replica_id="worker-1", tick=0.05, lock_timeout=1)


@orch.phase("jobs", "Pending", to="Done")
def finish(lease):
    return lease.advance("Done")
"""


@pytest.mark.parametrize(
    ("sig", "level"), [(signal.SIGTERM, []), (signal.SIGINT, ["--log-level", "warning"])]
)
def test_run_stops_gracefully_on_a_signal(
    sig: signal.Signals, level: list[str], tmp_path: Path
) -> None:
    """At the default level the orchestrator's INFO lines show and the scheduler's own do
    not; the level is accepted in any case; the stop line is the whole report."""
    (tmp_path / "myworker.py").write_text(textwrap.dedent(WORKER))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "myworker:orch", *level],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        assert selector.select(timeout=30), "the worker never said it was running"
        assert "replica worker-1 running 1 handlers" in proc.stdout.readline()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    stop_line = out.strip().splitlines()[-1]
    assert stop_line == (
        "replica worker-1 stopped: 0 unstarted lease(s) handed back, 0 step(s) still running"
    )
    assert "Traceback" not in err
    assert "apscheduler" not in err
    if not level:
        assert "orchestrator started" in err


UNREACHABLE_WORKER = """
from pymongo import MongoClient
from orchestrator import Orchestrator

orch = Orchestrator(MongoClient("mongodb://ops:hunter2@127.0.0.1:1/x")["x"], replica_id="w")


@orch.phase("jobs", "Pending")
def finish(lease):
    return lease.advance("Done")
"""


def test_run_fails_within_its_connect_timeout_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "faraway.py").write_text(textwrap.dedent(UNREACHABLE_WORKER))
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "faraway:orch", "--connect-timeout", "0.2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,  # a bound against hanging, not a timing claim
        check=False,
    )
    assert_one_line_error(
        result.returncode, result.stderr, "cannot reach MongoDB within 0.2s", "Connection refused"
    )
    assert "hunter2" not in result.stderr
    assert len(result.stderr.strip()) < 200  # the reason, not the driver's topology dump


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"orchestrator {version('mongo-orchestrator')}"
    assert orchestrator.__version__ == version("mongo-orchestrator")


SUBCOMMANDS = (
    "demo",
    "run",
    "status",
    "find",
    "history",
    "retry",
    "unlock",
    "cancel",
    "pause",
    "resume",
    "audit",
    "graph",
    "web",
)


def test_help_documents_commands_environment_and_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    listed = {line.split()[0]: line for line in out.split("Commands:")[1].splitlines() if line}
    for name in SUBCOMMANDS:
        assert len(listed[name].split()) > 3, f"{name} has no description"
    assert "MONGODB_URI" in out
    for status in ("0 ", "1 ", "2 ", "130"):
        assert f"  {status}" in out.split("Exit status:")[1]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_an_example_and_shows_its_defaults(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run([command, "--help"], capsys)
    assert code == 0
    example = re.split("Examples?:", out)[1].strip().splitlines()[0]
    assert f"orchestrator {command}" in example
    if command not in {"graph"}:  # graph has no option but --help
        assert "[default:" in out


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["status", "--connect-timeout", "-1"], ["--connect-timeout", "0<x<=300"]),
        (["status", "--uri", "notauri"], ["--uri", "notauri", "scheme"]),
        (["status", "--uri", "mongodb://ops:hunter2@h/?bogus=1"], ["Unknown option", "bogus"]),
        (["status", "--errors", "-1"], ["--errors"]),
        (["demo", "--log-file", "/nonexistent/dir/x.log"], ["--log-file", "/nonexistent/dir"]),
        (["demo", "--fail-rate", "0.5"], ["--fail-rate"]),
        (["demo", "--timeout", "0"], ["--timeout"]),
        (["demo", "--replicas", "many"], ["--replicas", "many"]),
        (["run", "x:y", "--log-level", "loud"], ["--log-level", "loud"]),
        (["run", "x:y", "--stop-timeout", "-1"], ["--stop-timeout"]),
        (["unlock", "x"], ["--collection"]),
        (["stats"], ["No such command 'stats'"]),
    ],
)
def test_every_option_is_validated_in_one_line(
    argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert_one_line_error(code, err, *needles)
    assert "hunter2" not in out + err


def test_an_invalid_uri_is_refused_before_any_connection(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tried: list[str] = []
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: tried.append(uri))
    monkeypatch.setenv("MONGODB_URI", "notauri")
    code, _, err = run(["status"], capsys)
    assert_one_line_error(code, err, "MONGODB_URI", "notauri")
    assert tried == []


def test_the_demo_timeout_covers_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Submitting gateways counts against ``--timeout``: a run that cannot submit them all
    in time stops and says so, instead of printing nothing while it submits. The demo's
    clock jumps past the deadline at the third submission."""
    now = [1000.0]
    submitted: list[str] = []
    original = gateway.Platform.create_gateway

    def slow_create(self: Any, name: str, custom_domain: str | None = None) -> Any:
        submitted.append(name)
        if len(submitted) == 3:
            now[0] += 60
        return original(self, name, custom_domain)

    monkeypatch.setattr(gateway.Platform, "create_gateway", slow_create)
    console = Console(file=io.StringIO(), width=200)
    code = demo.run(DemoOptions(gateways=50, timeout=30), console, monotonic=lambda: now[0])
    out = console.file.getvalue()
    assert code == 1
    assert "submitting gateways did not finish" in out
    assert "submitting gateways: 3/50" in out  # the progress line, when the time moved
    assert len(submitted) == 3


# -- a live lease refused unless forced; stored values and ids shown exactly ---------------


@pytest.mark.anyio
async def test_retry_refuses_a_live_lease_unless_forced(
    replicas: MakeEither,
    connected: Database[Any],
    clock: FakeClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A replica is inside the step: retry says so and does nothing; --force takes the
    lease (the holder's later writes then fail with LeaseLost). One worker: the retry frees
    the document in its phase, and another worker of the replica may claim it at once."""
    replica = await replicas("pod-2", max_concurrency=1)
    box = hold(replica)
    publish(connected, replica.orch)
    await replica.submit("jobs", {"_id": "job-1", "phase": "Running"})
    argv = ["retry", "job-1", "-c", "jobs", "--phase", "Running", "--uri", URI]
    async with anyio.create_task_group() as group:
        group.start_soon(replica.run_once)
        assert await wait(box["claimed"])
        held = connected.jobs.find_one({"_id": "job-1"})
        code, _, err = await anyio.to_thread.run_sync(run, argv, capsys)
        assert_one_line_error(code, err, "held by a live lease of replica 'pod-2'", "--force")
        assert connected.jobs.find_one({"_id": "job-1"}) == held

        code, out, _ = await anyio.to_thread.run_sync(run, [*argv, "--force"], capsys)
        assert code == 0
        assert "the live lease of 'pod-2' was taken away" in out
        assert "lockToken" not in connected.jobs.find_one({"_id": "job-1"})
        box["go"].set()
    assert isinstance(box["lost"], LeaseLost)


def test_retry_takes_an_expired_lease_without_force(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(connected, clock)  # "stuck": its holder died; its lease ran out 70 s ago
    code, out, _ = run(
        ["retry", "stuck", "-c", "gateways", "--phase", "Deleting", "--uri", URI], capsys
    )
    assert code == 0, out
    assert "taken away" not in out
    assert "lockToken" not in connected.gateways.find_one({"_id": "stuck"})


def test_status_shows_what_is_stored_whatever_it_is(
    connected: Database[Any],
    clock: FakeClock,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A migrated application's own ``lastError`` (a string), an error record whose parts
    are no strings, and a phase that is no string (counted; its errors are listed by
    phase name, which it has none of): shown, never a traceback."""
    monkeypatch.setenv("COLUMNS", "250")
    connected.gateways.insert_many(
        [
            {"_id": "migrated", "phase": "Failed", "lastError": "provider timeout"},
            {
                "_id": "odd",
                "phase": "Odd",
                "attempts": "3",
                "lastError": {"type": 1, "message": [2]},
            },
            {"_id": "seven", "phase": 7, "lastError": {"type": "E", "message": "m"}},
            {"_id": "listed", "phase": ["a"], "lastError": "x"},
            {"_id": "errors", "phase": "Listed", "lastError": ["x", {"y": None}]},
        ]
    )
    code, out, _ = run(["status", "--uri", URI], capsys)
    assert code == 0, out
    assert "?: provider timeout" in out
    assert "1: [2]" in out
    code, out, _ = run(["status", "--uri", URI, "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    errors = {e["id"]: e for e in report["errors"]}
    assert errors["migrated"]["message"] == "provider timeout"
    assert (errors["odd"]["type"], errors["odd"]["attempts"]) == ("1", 0)
    assert {r["phase"]: r["count"] for r in report["phases"]}["7"] == 1


def test_status_counts_a_collection_whose_errors_no_index_can_serve(
    connected: Database[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server refuses the errors index on documents holding arrays in both its fields
    (parallel arrays): the counts stand, and status says why the errors are not listed."""
    if isinstance(connected, MemoryDatabase):
        pytest.skip("the in-memory store indexes parallel arrays; a server refuses them")
    monkeypatch.setenv("COLUMNS", "250")
    connected.gateways.insert_one({"_id": "p", "phase": ["a", "b"], "lastError": [{"at": 1}]})
    code, out, _ = run(["status", "--uri", URI], capsys)
    assert code == 0, out
    assert "the latest errors of 'gateways' are not listed" in out
    report = json.loads(run(["status", "--uri", URI, "--json"], capsys)[1])
    assert report["phases"] and report["errors"] == [] and len(report["notes"]) == 1


def test_status_prints_what_is_stored_verbatim_not_as_markup(
    connected: Database[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    connected["jobs[red]"].insert_one(
        {
            "_id": "[b]id[/b]",
            "phase": "[bold]Failing",
            "lastError": {"type": "ValidationError", "message": "[/items/0] must be a [b]string"},
        }
    )
    code, out, err = run(["status", "--uri", URI], capsys)
    assert code == 0, err
    for text in ("jobs[red]", "[b]id[/b]", "[bold]Failing", "[/items/0] must be a [b]string"):
        assert text in out


def test_status_and_retry_show_control_characters_as_escapes_never_as_terminal_codes(
    connected: Database[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored value holding an ESC sequence (``\x1b[2J`` clears the screen) printed as
    it is would act on the operator's terminal; it is shown as the escape it is."""
    monkeypatch.setenv("COLUMNS", "250")
    connected.jobs.insert_one(
        {
            "_id": "gw\x1b[2J",
            "phase": "Failed\x1b]0;owned\x07",
            "lastError": {"type": "E", "message": "boom\x1b[31m", "phase": "Running"},
        }
    )
    code, out, err = run(["status", "--uri", URI], capsys)
    assert code == 0, err
    assert "\x1b" not in out
    assert "gw\\x1b[2J" in out and "boom\\x1b[31m" in out
    code, out, err = run(["retry", "--uri", URI, "-c", "jobs", "gw\x1b[2J", "--force"], capsys)
    assert code == 0, err
    assert "\x1b" not in out + err and "\\x1b" in out


def test_an_id_typed_as_text_that_names_two_documents_is_refused(
    connected: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    connected.jobs.insert_many(
        [
            {
                "_id": "42",
                "phase": "Failed",
                "lockToken": "t1",
                "lockedUntil": bson_time(datetime(2000, 1, 1)),
            },
            {
                "_id": 42,
                "phase": "Failed",
                "lockToken": "t2",
                "lockedUntil": bson_time(datetime(2000, 1, 1)),
            },
        ]
    )
    before = list(connected.jobs.find())
    for command in (["unlock"], ["retry", "--phase", "Running", "--force"]):
        code, _, err = run([*command, "42", "-c", "jobs", "--uri", URI], capsys)
        assert_one_line_error(
            code,
            err,
            "names more than one document",
            """--id-json '{"$numberInt": "42"}'""",
            """--id-json '"42"'""",
        )
        assert list(connected.jobs.find()) == before

    code, out, _ = run(
        ["unlock", "--id-json", '{"$numberInt": "42"}', "-c", "jobs", "--uri", URI], capsys
    )
    assert code == 0, out
    assert "lockToken" not in connected.jobs.find_one({"_id": {"$eq": 42}})
    assert connected.jobs.find_one({"_id": {"$eq": "42"}})["lockToken"] == "t1"
    code, out, _ = run(
        ["retry", "--id-json", '"42"', "-c", "jobs", "--phase", "Running", "--force", "--uri", URI],
        capsys,
    )
    assert code == 0, out
    assert connected.jobs.find_one({"_id": {"$eq": "42"}})["phase"] == "Running"
    assert connected.jobs.find_one({"_id": {"$eq": 42}})["phase"] == "Failed"

    oid = ObjectId()
    connected.jobs.insert_one({"_id": oid, "phase": "Failed", "lockToken": "t3"})
    code, out, _ = run(["unlock", str(oid), "-c", "jobs", "--uri", URI], capsys)  # hex, as typed
    assert code == 0, out
    assert "lockToken" not in connected.jobs.find_one({"_id": oid})


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["unlock", "-c", "jobs"], "give its ID, or --id-json"),
        (["unlock", "x", "--id-json", '"x"', "-c", "jobs"], "not both"),
        (["unlock", "--id-json", "{", "-c", "jobs"], "malformed Extended JSON id"),
        (["retry", "--id-json", '{"$numberInt": "7"}', "-c", "jobs"], "no document"),
    ],
)
def test_an_id_given_wrongly_is_one_line(
    argv: list[str], needle: str, connected: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    connected.jobs.insert_one({"_id": "x", "phase": "Failed"})
    code, _, err = run([*argv, "--uri", URI], capsys)
    assert_one_line_error(code, err, needle)
