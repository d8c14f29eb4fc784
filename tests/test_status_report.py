"""The operators' report as types: a row of the status pipeline, a document's last error
(whatever its stored fields hold) and the report as JSON, all without a database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from bson import ObjectId

from orchestrator.core.audit import AuditEntry, takeover_record
from orchestrator.core.pauses import Pause, Scope
from orchestrator.core.replicas import (
    Disagreement,
    ReplicaIdentity,
    ReplicaSettings,
    RunningStep,
    new_record,
)
from orchestrator.operations.schedule_report import SchedulesSummary
from orchestrator.operations.status_report import PhaseCount, RecentError, Status

pytestmark = pytest.mark.pure

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(phase: Any, count: int = 5) -> dict[str, Any]:
    counts = {"leased": 1, "overdue": 2, "waiting": 3, "retrying": 6, "failed": 4}
    return {"_id": phase, "count": count, **counts}


def test_a_pipeline_row_becomes_a_phase_count_its_id_as_text() -> None:
    assert PhaseCount.from_row("jobs", row("Running")) == PhaseCount(
        collection="jobs",
        phase="Running",
        count=5,
        leased=1,
        overdue=2,
        waiting=3,
        retrying=6,
        failed=4,
    )
    # A phase some writer stored as a number or null is still shown, as text.
    assert PhaseCount.from_row("jobs", row(7)).phase == "7"
    assert PhaseCount.from_row("jobs", row(None)).phase == "None"


def test_a_last_error_record_is_read_field_by_field() -> None:
    doc = {
        "_id": "gw-1",
        "phase": "Failed",
        "attempts": 3,
        "lastError": {"type": "TimeoutError", "message": "slow", "at": T0, "phase": "Creating"},
    }
    assert RecentError.from_document("gateways", doc) == RecentError(
        collection="gateways",
        id="gw-1",
        ref='"gw-1"',
        phase="Failed",
        attempts=3,
        type="TimeoutError",
        message="slow",
        at=T0,
    )


def test_an_id_reads_alike_whatever_its_type_and_its_ref_tells_them_apart() -> None:
    as_int = RecentError.from_document("c", {"_id": 42, "lastError": {}})
    as_str = RecentError.from_document("c", {"_id": "42", "lastError": {}})
    assert as_int.id == as_str.id == "42"
    assert (as_int.ref, as_str.ref) == ('{"$numberInt": "42"}', '"42"')
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    by_oid = RecentError.from_document("c", {"_id": oid, "lastError": {}})
    assert by_oid.id == "65a1b2c3d4e5f60718293a4b"
    assert by_oid.ref == '{"$oid": "65a1b2c3d4e5f60718293a4b"}'


def test_an_error_record_missing_its_parts_shows_the_fallbacks() -> None:
    assert RecentError.from_document("c", {"_id": 1, "lastError": {}}) == RecentError(
        collection="c",
        id="1",
        ref='{"$numberInt": "1"}',
        phase=None,
        attempts=0,
        type="?",
        message="",
        at=None,
    )


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ("disk full", "disk full"),  # written by a migrated application as plain text
        (None, ""),
        (17, "17"),
        (["a", 1], "['a', 1]"),
    ],
)
def test_a_last_error_that_is_no_record_is_shown_as_it_is(stored: Any, message: str) -> None:
    doc = {"_id": "d", "lastError": stored}
    error = RecentError.from_document("c", doc)
    assert (error.type, error.message, error.at) == ("?", message, None)


def test_a_document_without_a_last_error_or_an_id_still_reads() -> None:
    assert RecentError.from_document("c", {}) == RecentError(
        collection="c", id="None", ref="null", phase=None, attempts=0, type="?", message="", at=None
    )


@pytest.mark.parametrize(
    ("attempts", "shown"),
    [
        (3, 3),
        (0, 0),
        (-1, -1),
        (2**70, 2**70),
        (True, 0),
        (False, 0),
        ("3", 0),
        (2.0, 0),
        (None, 0),
    ],
)
def test_attempts_count_only_as_an_integer(attempts: Any, shown: int) -> None:
    error = RecentError.from_document("c", {"_id": 1, "attempts": attempts, "lastError": {}})
    assert error.attempts == shown


def test_odd_values_in_every_field_become_text() -> None:
    doc = {
        "_id": {"tenant": "t", "n": 1},
        "phase": 5,
        "attempts": 1,
        "lastError": {"type": ["Value", "Error"], "message": {"k": 1}, "at": "yesterday"},
    }
    error = RecentError.from_document("c", doc)
    assert error.id == "{'tenant': 't', 'n': 1}"
    assert error.ref == '{"tenant": "t", "n": {"$numberInt": "1"}}'
    assert (error.phase, error.type, error.message, error.at) == (
        "5",
        "['Value', 'Error']",
        "{'k': 1}",
        None,
    )
    huge = "x" * 100_000
    big = RecentError.from_document("c", {"_id": huge, "lastError": {"message": huge}})
    assert big.message == huge and big.id == huge


@pytest.mark.parametrize("unencodable", [object(), complex(1, 2)])
def test_an_id_extended_json_cannot_encode_has_no_ref(unencodable: Any) -> None:
    error = RecentError.from_document("c", {"_id": unencodable, "lastError": {}})
    assert error.ref is None
    assert error.id == str(unencodable)


def test_an_error_time_is_read_as_utc() -> None:
    naive = RecentError.from_document("c", {"_id": 1, "lastError": {"at": T0.replace(tzinfo=None)}})
    assert naive.at == T0 and naive.at is not None and naive.at.tzinfo is UTC
    plus2 = T0.astimezone(timezone(timedelta(hours=2)))
    shifted = RecentError.from_document("c", {"_id": 1, "lastError": {"at": plus2}})
    assert shifted.at == T0 and shifted.at is not None and shifted.at.tzinfo is UTC


def test_counts_are_per_collection_then_phase() -> None:
    status = Status(
        at=T0,
        server_time=True,
        phases=[
            PhaseCount.from_row("a", row("P", 2)),
            PhaseCount.from_row("a", row("Q", 3)),
            PhaseCount.from_row("b", row("P", 4)),
        ],
    )
    assert status.counts() == {"a": {"P": 2, "Q": 3}, "b": {"P": 4}}
    assert Status(at=T0, server_time=False).counts() == {}


def replica(replica_id: str, seen: datetime) -> Any:
    return new_record(
        ReplicaIdentity(replica_id, "i", "h", 1, "1.0.0", "threaded", T0),
        ReplicaSettings(lock_timeout=30.0, tick=1.0, max_concurrency=4),
        now=seen,
        steps=[RunningStep("c", "1", None, T0)],
    )


def test_the_report_as_json_says_everything_in_plain_types() -> None:
    at = T0 + timedelta(seconds=10)
    seen = T0 + timedelta(seconds=7, microseconds=123456)
    record = replica("pod-1", seen)
    disagreement = Disagreement("tick", (("1s", ("a",)), ("2s", ("b",))))
    errors = [
        RecentError("c", "1", '{"$numberInt": "1"}', "P", 2, "E", "m", T0),
        RecentError("c", "2", None, None, 0, "?", "", None),
    ]
    status = Status(
        at=at,
        server_time=False,
        phases=[PhaseCount.from_row("c", row("P"))],
        errors=errors,
        replicas=[record],
        disagreements=[disagreement],
        pauses=[Pause(Scope("c", "P"), "ops@host", T0, "CA down")],
        takeovers=[
            AuditEntry.read(
                takeover_record(
                    at=T0, by="pod-2", taken_from="pod-1", collection="c", document='"1"', phase="P"
                )
            )
        ],
        schedules=SchedulesSummary(3, 1, 1),
    )
    data = status.to_dict()
    assert data == {
        "at": "2026-01-01T00:00:10+00:00",
        "server_time": False,
        "phases": [
            {
                "collection": "c",
                "phase": "P",
                "count": 5,
                "leased": 1,
                "overdue": 2,
                "waiting": 3,
                "retrying": 6,
                "failed": 4,
            }
        ],
        "errors": [
            {
                "collection": "c",
                "id": "1",
                "ref": '{"$numberInt": "1"}',
                "phase": "P",
                "attempts": 2,
                "type": "E",
                "message": "m",
                "at": "2026-01-01T00:00:00+00:00",
                "key": None,
            },
            {
                "collection": "c",
                "id": "2",
                "ref": None,
                "phase": None,
                "attempts": 0,
                "type": "?",
                "message": "",
                "at": None,
                "key": None,
            },
        ],
        "replicas": [{**record.to_dict(), "seen_ago": 2.877, "stale": False}],
        "disagreements": [disagreement.to_dict()],
        "pauses": [
            {
                "collection": "c",
                "phase": "P",
                "handler": None,
                "by": "ops@host",
                "at": "2026-01-01T00:00:00+00:00",
                "why": "CA down",
            }
        ],
        "takeovers": [
            {
                "kind": "takeover",
                "at": "2026-01-01T00:00:00+00:00",
                "by": "pod-2",
                "action": "takeover",
                "why": "the lease of pod-1 expired unreleased",
                "collection": "c",
                "scope": {"phase": "P"},
                "documents": ['"1"'],
                "count": 1,
                "taken_from": "pod-1",
                "failed": None,
                "refused": None,
                "keys": [],
            }
        ],
        "notes": [],
        "retention": {},
        "schedules": {"count": 3, "paused": 1, "failing": 1},
    }
    assert json.loads(json.dumps(data)) == data
    # The report's own records are left as they were.
    assert status.errors[0].at == T0


def test_a_replica_seen_after_the_report_was_taken_was_seen_zero_seconds_ago() -> None:
    status = Status(at=T0, server_time=True, replicas=[replica("p", T0 + timedelta(seconds=3))])
    assert status.to_dict()["replicas"][0]["seen_ago"] == 0.0
    assert Status(at=T0, server_time=True).to_dict() == {
        "at": "2026-01-01T00:00:00+00:00",
        "server_time": True,
        "phases": [],
        "errors": [],
        "replicas": [],
        "disagreements": [],
        "pauses": [],
        "takeovers": [],
        "notes": [],
        "retention": {},
        "schedules": None,
    }
