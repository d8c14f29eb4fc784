"""The store's filters and updates, checked as plain dicts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from bson import ObjectId

from orchestrator import EPOCH, ConfigError
from orchestrator.core import starts
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.queries import claims, lease_writes, operators, submissions
from orchestrator.operations import filters

pytestmark = pytest.mark.pure

NOW = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def test_claim_filter_keeps_the_handler_match_and_requires_a_lease_past_its_own_expiry() -> None:
    f = claims.claim_filter({"phase": "Deleting"}, NOW, 3600)
    assert f == {
        "phase": "Deleting",
        "$or": [
            {"lockedUntil": {"$not": {"$gt": datetime(2026, 1, 1, 12, 0, 0, 123000)}}},
            {"lockedUntil": {"$gt": datetime(2026, 1, 1, 13, 0, 0, 123000)}},
        ],
    }


def test_a_handler_filter_with_its_own_or_keeps_both_conditions() -> None:
    f = claims.claim_filter({"$or": [{"phase": "A"}, {"phase": "B"}]}, NOW, 60)
    assert f["$and"][0] == {"$or": [{"phase": "A"}, {"phase": "B"}]}
    assert "$or" in f["$and"][1]
    with pytest.raises(ConfigError, match="failedBy"):
        claims.check_match({"phase": "A", "failedBy": "x"})


def test_the_failed_mark_applies_only_in_the_failed_phase_it_names() -> None:
    """A handler pinned to another phase needs no exclusion; one whose filter may match
    its failed phase is kept off a document only while it is there, marked by its key (or
    by its name, as marks were written before keys)."""
    assert (
        claims.failed_exclusion("jobs {...}", "app.create", "Failed", {"phase": "Creating"}) is None
    )
    exclusion = claims.failed_exclusion("jobs {...}", "app.report", "Failed", {"kind": "w"})
    assert exclusion == {
        "$or": [
            {"$and": [{"failedBy": {"$ne": "jobs {...}"}}, {"failedBy": {"$ne": "app.report"}}]},
            {"phase": {"$ne": "Failed"}},
        ]
    }
    f = claims.claim_filter({"kind": "w"}, NOW, 60, exclusion)
    assert f["$and"][:2] == [{"kind": "w"}, exclusion]


def test_claim_update_sets_time_expiry_token_and_holder() -> None:
    until = NOW + timedelta(seconds=30)
    assert claims.claim_update(NOW, until, "tok", "pod-1") == {
        "$set": {
            "lockedAt": datetime(2026, 1, 1, 12, 0, 0, 123000),
            "lockedUntil": datetime(2026, 1, 1, 12, 0, 30, 123000),
            "lockToken": "tok",
            "lockedBy": "pod-1",
        }
    }
    assert claims.CLAIM_SORT == [("claimPriority", -1), ("lockedUntil", 1), ("updatedAt", 1)]
    assert [k for k, _ in claims.CLAIM_INDEX] == [
        "phase",
        "claimPriority",
        "lockedUntil",
        "updatedAt",
        "_id",
    ]


def _pinned(query: Mapping[str, Any]) -> set[str]:
    """The fields ``query`` pins to points (an equality or an ``$in`` of values), at its
    top level or in an ``$and``: the index keys a planner holds fixed."""
    points: set[str] = set()
    for key, value in query.items():
        if key == "$and":
            for part in value:
                points |= _pinned(part)
        elif not key.startswith("$") and (
            not isinstance(value, Mapping) or set(value) in ({"$in"}, {"$eq"})
        ):
            points.add(key)
    return points


def _served_in_order(
    index: list[tuple[str, int]], query: Mapping[str, Any], sort: list[tuple[str, int]]
) -> bool:
    """Whether ``index`` serves ``query``'s ``sort`` without sorting in memory: the keys
    before the sort's are pinned to points by ``query``, and the sort is the next keys of
    the index, each in its direction (or each reversed: a backward scan)."""
    start = next((i for i, (k, _) in enumerate(index) if k == sort[0][0]), -1)
    if start < 0 or not {k for k, _ in index[:start]} <= _pinned(query):
        return False
    following = index[start : start + len(sort)]
    backward = [(k, -way) for k, way in following]
    return sort in (following, backward)


def test_the_claim_peek_probe_and_browse_read_the_claim_index_in_its_order() -> None:
    """mongomock and the wire server plan no query, so the claim's index use is checked by
    its shape: after the equality on phase (the index's first key), the claim's sort is
    the index's next keys in their directions, priority first, so the server walks the
    index priority by priority and sorts nothing in memory; the peek sorts the same way.
    The probe's due branch sorts on lockedUntil alone: it pins every stored priority
    (missing, 1 to 9), so each (phase, priority) run is read in lockedUntil order and the
    runs merge; and browse pages in the index's own order."""
    claim = claims.claim_filter({"phase": "A"}, NOW, 3600)
    assert _served_in_order(claims.CLAIM_INDEX, claim, claims.CLAIM_SORT)
    assert _served_in_order(claims.CLAIM_INDEX, {"phase": "A"}, filters.LEASE_ORDER)
    assert not _served_in_order(claims.CLAIM_INDEX, claim, [("lockedUntil", 1)])  # the check bites
    pipeline = claims.probe_pipeline([("jobs", [({"phase": "A"}, None)])], NOW, 3600)
    due = next(b["$unionWith"]["pipeline"] for b in pipeline if "$unionWith" in b)
    assert due[1] == {"$sort": {"lockedUntil": 1}}
    assert _served_in_order(claims.CLAIM_INDEX, due[0]["$match"]["$or"][0], [("lockedUntil", 1)])
    assert due[0]["$match"]["$or"][0]["$and"][-1] == {
        "claimPriority": {"$in": [None, *range(1, claims.MAX_PRIORITY + 1)]}
    }
    assert claims.peek_projection(("tenant",)) == {"_id": 1, "claimPriority": 1, "tenant": 1}


def test_a_priority_is_an_int_from_0_to_9_stored_only_when_above_0() -> None:
    assert starts.check_priority(0) == 0 and starts.check_priority(9) == 9
    for bad in (-1, 10, True, 1.0, "5", None):
        with pytest.raises(ConfigError, match="priority is an int from 0"):
            starts.check_priority(bad)
    assert "claimPriority" not in submissions.new_document({"phase": "A"}, NOW)
    assert "claimPriority" not in submissions.new_document({"phase": "A"}, NOW, priority=0)
    assert submissions.new_document({"phase": "A"}, NOW, priority=7)["claimPriority"] == 7


def test_a_later_start_is_a_wait_from_the_server_clock_bounded_by_max_wait() -> None:
    """Seconds from now, or an aware datetime; at or before now is at once (the epoch, as a
    plain submit); past max_wait refused, not cut short; the rest refused in one line."""
    later = NOW + timedelta(seconds=90)
    assert starts.start_time(None, NOW, 3600) == EPOCH
    assert starts.start_time(0, NOW, 3600) == EPOCH
    assert starts.start_time(90, NOW, 3600) == later
    assert starts.start_time(90.5, NOW, 3600) == later + timedelta(seconds=0.5)
    assert starts.start_time(later.astimezone(timezone(timedelta(hours=9))), NOW, 3600) == later
    assert starts.start_time(NOW - timedelta(days=3), NOW, 3600) == EPOCH
    assert starts.start_time(3600, NOW, 3600) == NOW + timedelta(hours=1)
    with pytest.raises(ConfigError, match=r"3601s ahead, past max_wait \(3600s\)"):
        starts.start_time(3601, NOW, 3600)
    with pytest.raises(ConfigError, match="past max_wait"):
        starts.start_time(NOW + timedelta(days=2), NOW, 3600)
    assert starts.check_not_before(None) is None
    assert starts.check_not_before(later) is later
    assert starts.check_not_before(0) == 0
    refusals = {
        "naive datetime": datetime(2026, 1, 1, 12),
        "seconds >= 0": -1,
        "finite": math.nan,
        "finite number": math.inf,
        "not bool": True,
        "not str": "soon",
        "not timedelta": timedelta(seconds=5),
    }
    for why, bad in refusals.items():
        with pytest.raises(ConfigError, match="not_before") as refused:
            starts.check_not_before(bad)
        assert "\n" not in str(refused.value), why
    doc = submissions.new_document({"phase": "A"}, NOW, until=later)
    assert doc["lockedUntil"] == bson_time(later)
    assert doc["createdAt"] == bson_time(NOW)


def test_every_release_clears_the_token_so_the_old_holder_is_fenced_out() -> None:
    for update in (
        lease_writes.unlock_update({}),
        lease_writes.relock_update(NOW, {}),
        lease_writes.advance_update("Done", NOW, {}),
        lease_writes.retry_update(1, {"type": "E"}, NOW),
        lease_writes.fail_update("Failed", 3, {"type": "E"}, NOW, "app.h"),
        lease_writes.release_update(),
    ):
        assert update["$unset"]["lockToken"] == ""
    assert lease_writes.fenced("id", "tok") == {"_id": "id", "lockToken": "tok"}
    assert lease_writes.fenced("id", "tok", "Running") == {
        "_id": "id",
        "lockToken": "tok",
        "phase": "Running",
    }
    assert lease_writes.fenced("id", "tok", None) == {
        "_id": "id",
        "lockToken": "tok",
        "phase": None,
    }


def test_success_moves_the_last_error_aside_and_failure_marks_the_handler() -> None:
    for update in (
        lease_writes.unlock_update({}),
        lease_writes.relock_update(NOW, {}),
        lease_writes.advance_update("B", NOW, {}),
    ):
        assert update["$rename"] == {"lastError": "previousError"}
    assert "$rename" not in lease_writes.retry_update(1, {"type": "E"}, NOW)
    assert (
        lease_writes.fail_update("Failed", 3, {"type": "E"}, NOW, "app.h")["$set"]["failedBy"]
        == "app.h"
    )
    assert lease_writes.advance_update("B", NOW, {})["$unset"]["failedBy"] == ""
    assert operators.operator_move_update("B", NOW)["$unset"] == {
        "lockToken": "",
        "failedBy": "",
        "lastToken": "",
        "orchestratorExpiresAt": "",  # a phase no live replica retains: undated
        "orchestratorWait": "",  # the phase it waited in is left: so is its wait
    }


def test_unlock_goes_back_to_the_epoch_and_relock_keeps_updated_at() -> None:
    assert lease_writes.unlock_update({"n": 1})["$set"] == {
        "n": 1,
        "lockedUntil": EPOCH,
        "attempts": 0,
    }
    relock = lease_writes.relock_update(NOW, {})
    assert "updatedAt" not in relock["$set"]
    assert relock["$set"]["lockedUntil"] == datetime(2026, 1, 1, 12, 0, 0, 123000)
    assert relock["$inc"] == {"relocks": 1}
    advance = lease_writes.advance_update("Created", NOW, {"url": "x"})["$set"]
    assert advance["phase"] == "Created"
    assert advance["updatedAt"] == datetime(2026, 1, 1, 12, 0, 0, 123000)
    assert advance["lockedUntil"] == EPOCH


def test_new_document_starts_unlocked_and_drops_forged_lease_fields() -> None:
    doc = submissions.new_document(
        {
            "name": "a",
            "phase": "Creating",
            "lockedUntil": NOW,
            "lockToken": "x",
            "attempts": 9,
            "failedBy": "h",
        },
        NOW,
    )
    assert doc["lockedUntil"] == EPOCH
    assert "lockToken" not in doc
    assert "failedBy" not in doc
    assert doc["attempts"] == 0
    assert doc["createdAt"] == doc["updatedAt"] == bson_time(NOW)


def test_times_are_naive_utc_milliseconds_and_read_back_aware() -> None:
    seoul = NOW.astimezone(timezone(timedelta(hours=9)))
    assert bson_time(seoul) == datetime(2026, 1, 1, 12, 0, 0, 123000)
    assert as_utc(datetime(2026, 1, 1)) == datetime(2026, 1, 1, tzinfo=UTC)
    assert as_utc(seoul) == NOW


@pytest.mark.parametrize(
    "fields",
    [
        {"$set": 1},
        {"lockedAt": NOW},
        {"lockToken": "forged"},
        {"attempts": 0},
        {"phase": "Skipped"},
        {"_id": 1},
        {"nested": {"$where": "1"}},
        {"items": [{"$bad": 1}]},
        {"": 1},
        {"lockedAt.x": 1},
    ],
)
def test_fields_that_would_corrupt_the_lease_or_inject_operators_are_refused(
    fields: dict[str, object],
) -> None:
    with pytest.raises(ConfigError):
        submissions.check_fields(fields)


def test_unique_filter_needs_every_key() -> None:
    assert submissions.unique_filter({"name": "a", "x": 1}, ["name"]) == {"name": "a"}
    with pytest.raises(ConfigError, match="unique key"):
        submissions.unique_filter({"x": 1}, ["name"])


def test_handler_filters_cannot_touch_the_lease_fields() -> None:
    with pytest.raises(ConfigError):
        claims.check_match({"lockedAt": {"$gt": NOW}})
    with pytest.raises(ConfigError):
        claims.check_match({})


def test_an_id_typed_as_text_matches_the_integer_or_objectid_it_spells() -> None:
    assert operators.id_filter("42") == {"_id": {"$in": [42, "42"]}}
    assert operators.id_filter("-7") == {"_id": {"$in": [-7, "-7"]}}
    hex_id = "65a1b2c3d4e5f60718293a4b"
    assert operators.id_filter(hex_id) == {"_id": {"$in": [ObjectId(hex_id), hex_id]}}
    for text in ("042", "gw-1", "1e3", str(2**63), ""):
        assert operators.id_filter(text) == {"_id": text}


def test_fields_a_step_may_set_are_accepted_nested_and_dotted() -> None:
    submissions.check_fields(
        {"progress": 3, "result": {"items": [1, {"ok": True}]}, "a.b": 1, "phaseNote": "x"}
    )
    submissions.check_fields(
        {"lockToken": 1}, reserved=frozenset()
    )  # the reserved set is the caller's


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({1: "x"}, "field names must be non-empty strings, got 1"),
        ({"": 1}, "field names must be non-empty strings, got ''"),
        ({"$set": 1}, "field name '$set' is not allowed"),
        ({"a\x00b": 1}, "field name 'a\\x00b' is not allowed"),
        ({"lockToken": "x"}, "field 'lockToken' is managed by the orchestrator"),
        ({"attempts.n": 1}, "field 'attempts.n' is managed by the orchestrator"),
        ({"phase": "X"}, "field 'phase' is managed"),
        ({"phase.x": 1}, "field 'phase.x' is managed"),
        ({"_id": 1}, "field '_id' is managed"),
        ({"updatedAt": NOW}, "field 'updatedAt' is managed"),
        ({"a": {"$gt": 1}}, "field a.$gt is not allowed: it starts with '$'"),
        ({"a": [{"b": {"$x": 1}}]}, "field a.b.$x is not allowed"),
        ({"a": object()}, "fields cannot be stored in MongoDB"),
        ({"a": "x" * (16 * 1024 * 1024)}, "a MongoDB document holds at most 16777216"),
    ],
)
def test_each_refused_field_says_why(fields: dict[object, object], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        submissions.check_fields(fields)  # type: ignore[arg-type]
    assert says in str(refused.value)


def test_a_handler_filter_is_a_non_empty_dict_that_leaves_the_claim_its_fields() -> None:
    claims.check_match({"phase": "A", "attempts": {"$lt": 3}})
    with pytest.raises(ConfigError, match="must be a non-empty dict"):
        claims.check_match([("phase", "A")])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"cannot select on \['failedBy', 'lockToken'\]"):
        claims.check_match({"lockToken": "t", "failedBy": "x", "phase": "A"})


def test_a_probe_asks_for_any_of_the_handlers_claims() -> None:
    exclusion = {"failedBy": {"$ne": "k"}}
    probe = claims.probe_filter([({"phase": "A"}, None), ({"kind": 1}, exclusion)], NOW, 86_400)
    assert probe == {
        "$or": [
            claims.claim_filter({"phase": "A"}, NOW, 86_400),
            claims.claim_filter({"kind": 1}, NOW, 86_400, exclusion),
        ]
    }
