"""Retention's pure parts (``orchestrator/core/retention.py``): durations checked at
declaration with a one-line refusal, the expiry each write entering a phase carries (or
unsets), what replicas publish of it and where they disagree."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator import ConfigError
from orchestrator.core import replicas, retention
from orchestrator.core.queries import lease_writes, operators, replica_records
from orchestrator.core.queries.submissions import check_fields
from orchestrator.core.registry import Registry
from orchestrator.core.resource import EXPIRY_FIELD
from orchestrator.core.settings import Settings

pytestmark = pytest.mark.pure

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NAIVE_NOW = NOW.replace(tzinfo=None)
DAY = 86400.0


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("30d", 30 * DAY),
        ("12h", 12 * 3600.0),
        ("90m", 90 * 60.0),
        ("45s", 45.0),
        (" 2D ", 2 * DAY),
        ("1.5h", 5400.0),
        (3600, 3600.0),
        (0.5, 0.5),
        (timedelta(days=7), 7 * DAY),
    ],
)
def test_a_duration_reads_days_hours_minutes_seconds_numbers_and_timedeltas(
    given: Any, seconds: float
) -> None:
    assert retention.duration(given) == seconds


@pytest.mark.parametrize(
    "given",
    [0, -1, "0d", "30", "30x", "d", "", True, None, float("nan"), float("inf"), "101000d", []],
)
def test_a_duration_that_is_not_one_is_refused_at_declaration_in_one_line(given: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        retention.check("reports", {"Done": given})
    message = str(caught.value)
    assert "\n" not in message
    assert "reports" in message and "'Done'" in message and '"30d"' in message


@pytest.mark.parametrize("phases", [{}, None, "30d", [("Done", "30d")], {"": "1d"}, {"$x": "1d"}])
def test_a_retention_must_map_phase_names_to_durations(phases: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        retention.check("reports", phases)
    assert "\n" not in str(caught.value) and "retain('reports'" in str(caught.value)


def test_a_registry_keeps_each_collections_retention_and_refuses_a_second_duration() -> None:
    registry = Registry(Settings())
    registry.retain("reports", {"Done": "30d"})
    registry.retain("reports", {"Failed": "90d", "Done": timedelta(days=30)})
    assert registry.retention == {"reports": {"Done": 30 * DAY, "Failed": 90 * DAY}}
    with pytest.raises(ConfigError, match="'Done' is already retained for 30d, not 7d"):
        registry.retain("reports", {"Done": "7d"})
    with pytest.raises(ConfigError, match="invalid collection name"):
        registry.retain("system.x", {"Done": "1d"})


def test_durations_are_shown_in_the_largest_unit_that_says_them_exactly() -> None:
    assert [retention.shown(s) for s in (30 * DAY, 36 * 3600.0, 5400.0, 45.0, 0.5)] == [
        "30d",
        "36h",
        "90m",
        "45s",
        "0.5s",
    ]
    assert retention.describe({"Failed": 90 * DAY, "Done": 30 * DAY}) == "Done 30d, Failed 90d"
    assert retention.describe({}) == "none"


def test_the_write_entering_a_retained_phase_carries_its_deletion_date() -> None:
    kept = {"Done": 30 * DAY}
    update = lease_writes.expiring(lease_writes.advance_update("Done", NOW, {}), "Done", NOW, kept)
    assert update["$set"][EXPIRY_FIELD] == NAIVE_NOW + timedelta(days=30)
    assert EXPIRY_FIELD not in update["$unset"]
    failed = lease_writes.fail_update("Done", 3, {}, NOW, "key")
    dated = lease_writes.expiring(failed, "Done", NOW, kept)
    assert dated["$set"][EXPIRY_FIELD] == NAIVE_NOW + timedelta(days=30)


def test_a_write_into_another_phase_unsets_the_date_and_none_without_retention() -> None:
    advance = lease_writes.advance_update("Review", NOW, {})
    out = lease_writes.expiring(advance, "Review", NOW, {"Done": DAY})
    assert out["$unset"][EXPIRY_FIELD] == "" and EXPIRY_FIELD not in out["$set"]
    assert lease_writes.expiring(advance, "Review", NOW, retention.NO_RETENTION) == advance


def test_an_operators_move_dates_a_retained_phase_and_undates_any_other() -> None:
    cancel = operators.operator_move_update("Cancelled", NOW, {"Cancelled": DAY})
    assert cancel["$set"][EXPIRY_FIELD] == NAIVE_NOW + timedelta(days=1)
    assert EXPIRY_FIELD not in cancel["$unset"]
    retry = operators.operator_move_update("Running", NOW)  # no live replica retains
    assert retry["$unset"][EXPIRY_FIELD] == "" and EXPIRY_FIELD not in retry["$set"]


def test_a_step_cannot_set_the_expiry_field_itself() -> None:
    with pytest.raises(ConfigError, match="managed by the orchestrator"):
        check_fields({EXPIRY_FIELD: NOW})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (NAIVE_NOW, NOW),
        (NOW, NOW),
        ([NAIVE_NOW + timedelta(days=1), "x", NAIVE_NOW], NOW),
        ("garbage", None),
        (12, None),
        ({"$date": 1}, None),
        ([], None),
        (None, None),
    ],
)
def test_a_documents_expiry_reads_as_the_ttl_index_reads_it_and_never_fails(
    value: Any, expected: datetime | None
) -> None:
    assert retention.expiry_of({EXPIRY_FIELD: value}) == expected
    assert retention.expiry_of({}) is None


def _record(name: str, kept: dict[str, dict[str, float]], handled: str = "") -> Any:
    identity = replicas.ReplicaIdentity(name, "i", "h", 1, "1", "threaded", NOW)
    settings = replicas.ReplicaSettings(30, 1, 4, retention=replicas.ReplicaSettings.retained(kept))
    handlers = [replicas.HandlerInfo(handled, "A", "m:f", "k", "Failed")] if handled else []
    return replicas.new_record(identity, settings, now=NOW, handlers=handlers)


def test_a_replica_publishes_its_retention_and_reads_it_back() -> None:
    record = _record("pod-1", {"reports": {"Done": 30 * DAY, "Failed": 90 * DAY}})
    stored = replica_records.replica_document(record)
    assert stored["retention"] == [
        {"collection": "reports", "phase": "Done", "seconds": 30 * DAY},
        {"collection": "reports", "phase": "Failed", "seconds": 90 * DAY},
    ]
    back = replicas.ReplicaRecord.from_document({**stored, "steps": []})
    assert back is not None and back.retention_of("reports") == {
        "Done": 30 * DAY,
        "Failed": 90 * DAY,
    }
    assert record.to_dict()["retention"][0]["shown"] == "30d"
    garbage = replicas.ReplicaRecord.from_document({**stored, "retention": [{"phase": 1}]})
    assert garbage is None  # another writer's document: skipped, not failed on


def test_replicas_working_on_a_collection_that_keep_it_differently_are_flagged() -> None:
    rows = [
        _record("pod-1", {"reports": {"Done": 30 * DAY}}),
        _record("pod-2", {"reports": {"Done": 30 * DAY}}),
        _record("pod-3", {}, handled="reports"),  # works on it, keeps nothing
        _record("pod-4", {}, handled="other"),  # does not work on it: no opinion
    ]
    [found] = replicas.disagreements(rows)
    assert found.setting == "retention of reports"
    assert found.values == (("Done 30d", ("pod-1", "pod-2")), ("none", ("pod-3",)))
    assert replicas.retention_of(rows, "reports") == {"Done": 30 * DAY}
    assert replicas.retention_of(rows, "other") == {}
