"""``orchestrator schedules``: the table (and ``--json``), one schedule with its runs, and
pause, resume, trigger and backfill with who and why; refusals in one line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator.cli import connecting
from orchestrator.core.names import SCHEDULES_COLLECTION
from orchestrator.operations import Operations
from orchestrator.testing import FakeClock
from tests.cli_kit import URI, assert_one_line_error, run
from tests.conftest import MakeReplica


@pytest.fixture
def scheduled(
    db: Database[Any], make: MakeReplica, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Database[Any]:
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    monkeypatch.setenv("COLUMNS", "160")
    orch = make("pod-1")

    @orch.phase("reports", "Make")
    def make_report(lease: Any) -> Any:
        return lease.advance("Done")

    orch.schedule("every5", "reports", every=5)(lambda fire: {"phase": "Make"})
    for _ in range(11):
        orch.run_once(heartbeat=False)
        clock.advance(1)
    db[SCHEDULES_COLLECTION].insert_one({"_id": "junk", "spec": 5, "last": "x", "paused": 1})
    return db


def test_schedules_lists_each_with_its_spec_last_run_and_garbage_as_such(
    scheduled: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["schedules", "--uri", URI], capsys)
    assert code == 0
    assert "every5" in out and "every 5s" in out and "started (Done)" in out
    assert "unreadable spec" in out and "unreadable last" in out
    code, out, _ = run(["schedules", "--json", "--uri", URI], capsys)
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["every5"]["last"]["phase"] == "Done"
    assert rows["junk"]["unreadable"]["last"] == "'x'"
    code, out, _ = run(["schedules", "show", "every5", "--runs", "1", "--uri", URI], capsys)
    assert code == 0 and "runs of every5" in out


def test_schedule_actions_record_who_and_why(
    scheduled: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["pause", "every5", "--by", "ana", "--why", "freeze"],
        ["resume", "every5", "--by", "ana", "--why", "thaw"],
        ["trigger", "every5", "--by", "ana", "--why", "rerun"],
        [
            "backfill",
            "every5",
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "2026-01-01T00:00:05",
            "--by",
            "ana",
            "--why",
            "gap",
        ],
    ):
        code, out, err = run(["schedules", *argv, "--uri", URI], capsys)
        assert code == 0, err
        assert "recorded: by ana" in out
    trail = [(e.action, e.by, e.why) for e in Operations(scheduled).audit()]
    assert trail == [
        ("backfill", "ana", "gap"),
        ("trigger", "ana", "rerun"),
        ("resume", "ana", "thaw"),
        ("pause", "ana", "freeze"),
    ]


def test_schedule_refusals_are_one_line(
    scheduled: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["schedules", "pause", "nope", "--why", "x", "--uri", URI], capsys)
    assert_one_line_error(code, err, "no schedule 'nope'", "every5")
    backwards = ["--from", "2026-01-02", "--to", "2026-01-01", "--why", "x"]
    code, _, err = run(["schedules", "backfill", "every5", *backwards, "--uri", URI], capsys)
    assert_one_line_error(code, err, "before its start")
    wide = ["--from", "2025-01-01", "--to", "2026-01-01", "--why", "x"]
    code, _, err = run(["schedules", "backfill", "every5", *wide, "--uri", URI], capsys)
    assert_one_line_error(code, err, "backfill it in parts")
    code, _, err = run(
        [
            "schedules",
            "backfill",
            "every5",
            "--from",
            "soon",
            "--to",
            "x",
            "--why",
            "x",
            "--uri",
            URI,
        ],
        capsys,
    )
    assert_one_line_error(code, err, "ISO 8601")
