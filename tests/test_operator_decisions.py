"""An operator's decisions without I/O: where a retry sends a document, whether a lease
is live, which phase names a retry accepts, how an id round-trips as text, and what the
refusals say."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from bson import Int64, ObjectId

from orchestrator.core.documents import id_json, parse_id_json
from orchestrator.core.errors import (
    AmbiguousId,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    NoErrorPhase,
    OperatorError,
    OrchestratorError,
    Refusal,
    UnhandledPhase,
    UnhandledScope,
)
from orchestrator.core.in_house import IN_HOUSE_HOLDER, InHouse
from orchestrator.core.pauses import Scope
from orchestrator.core.queries import operators, replica_records
from orchestrator.core.replicas import (
    HandlerInfo,
    ReplicaIdentity,
    ReplicaRecord,
    ReplicaSettings,
    new_record,
)
from orchestrator.operations.filters import Filter, Row, UnindexedField
from orchestrator.operations.results import Bulk, Cancelled, Retried, Skipped
from orchestrator.operations.rules import (
    Action,
    Holding,
    check_phase_name,
    check_scope,
    error_phase,
    holder_name,
    holding,
    live_lease,
)

pytestmark = pytest.mark.pure

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("doc", "phase"),
    [
        ({"lastError": {"phase": "Creating"}}, "Creating"),
        ({}, None),
        ({"lastError": None}, None),
        ({"lastError": "Creating"}, None),  # plain text: no phase to read
        ({"lastError": {}}, None),
        ({"lastError": {"phase": ""}}, None),
        ({"lastError": {"phase": None}}, None),
        ({"lastError": {"phase": 3}}, None),
        ({"lastError": {"phase": ["Creating"]}}, None),
    ],
)
def test_a_retry_goes_back_to_the_phase_the_error_happened_in(
    doc: dict[str, Any], phase: str | None
) -> None:
    assert error_phase(doc) == phase


@pytest.mark.parametrize(
    ("doc", "live"),
    [
        ({"lockToken": "t", "lockedUntil": NOW + timedelta(milliseconds=1)}, True),
        ({"lockToken": "t", "lockedUntil": NOW}, False),  # expired at this very instant
        ({"lockToken": "t", "lockedUntil": NOW - timedelta(seconds=1)}, False),
        ({"lockToken": None, "lockedUntil": NOW + timedelta(hours=1)}, False),
        ({"lockedUntil": NOW + timedelta(hours=1)}, False),
        ({"lockToken": "t"}, False),
        ({"lockToken": "t", "lockedUntil": None}, False),
        ({"lockToken": "t", "lockedUntil": "tomorrow"}, False),
        ({"lockToken": "t", "lockedUntil": 2**40}, False),
        # Any token counts, even one no replica writes.
        ({"lockToken": "", "lockedUntil": NOW + timedelta(hours=1)}, True),
        ({"lockToken": 0, "lockedUntil": NOW + timedelta(hours=1)}, True),
        # A naive date (a client without tz_aware) is UTC; an aware one in any zone counts.
        ({"lockToken": "t", "lockedUntil": datetime(2026, 1, 1, 12, 0, 1)}, True),
        ({"lockToken": "t", "lockedUntil": datetime(2026, 1, 1, 11, 59, 59)}, False),
        (
            {
                "lockToken": "t",
                "lockedUntil": datetime(2026, 1, 1, 13, 0, 1, tzinfo=timezone(timedelta(hours=1))),
            },
            True,
        ),
        (
            {
                "lockToken": "t",
                "lockedUntil": datetime(2026, 1, 1, 13, 0, 0, tzinfo=timezone(timedelta(hours=1))),
            },
            False,
        ),
    ],
)
def test_a_lease_is_live_while_a_token_holds_it_until_a_later_date(
    doc: dict[str, Any], live: bool
) -> None:
    assert live_lease(doc, NOW) is live


def test_a_lease_is_held_by_the_replica_that_wrote_it_or_by_an_in_house_pod() -> None:
    until = NOW + timedelta(seconds=30)
    doc = {"lockedBy": "pod-1", "lockToken": "t", "lockedUntil": until, "lockedAt": NOW}
    assert holding(doc, NOW) == Holding("pod-1", until)
    assert holding({}, NOW) == Holding(None, None)
    # An in-house claim writes only lockedAt: the last replica's fields are no holder.
    old = {"lockedBy": "pod-1", "lockedUntil": NOW, "lockedAt": NOW}
    assert holding(old, NOW, InHouse(60)) == Holding(IN_HOUSE_HOLDER, InHouse(60).expiry(NOW))
    assert holding(old, NOW) == Holding("pod-1", NOW)  # no fleet migrating
    assert holder_name("pod-1") == "replica 'pod-1'"
    assert holder_name(IN_HOUSE_HOLDER) == IN_HOUSE_HOLDER


@pytest.mark.parametrize("name", ["Creating", "a", "x$", "Failed.Retry"])
def test_a_phase_name_is_accepted(name: str) -> None:
    check_phase_name(name)


@pytest.mark.parametrize("name", ["", "$set", "$"])
def test_an_empty_name_or_an_update_operator_is_no_phase(name: str) -> None:
    with pytest.raises(OperatorError) as raised:
        check_phase_name(name)
    assert str(raised.value) == f"{name!r} is not a phase name"


OID = ObjectId("65a1b2c3d4e5f60718293a4b")


@pytest.mark.parametrize(
    ("doc_id", "text"),
    [
        (42, '{"$numberInt": "42"}'),
        ("42", '"42"'),
        (Int64(2**40), '{"$numberLong": "1099511627776"}'),
        (1.5, '{"$numberDouble": "1.5"}'),
        (OID, '{"$oid": "65a1b2c3d4e5f60718293a4b"}'),
        ({"a": 1}, '{"a": {"$numberInt": "1"}}'),
        (None, "null"),
        (True, "true"),
    ],
)
def test_an_id_as_canonical_extended_json_round_trips_exactly(doc_id: Any, text: str) -> None:
    assert id_json(doc_id) == text
    back = parse_id_json(text)
    assert back == doc_id and type(back) is type(doc_id)


def test_plain_json_names_an_id_too() -> None:
    assert parse_id_json("7") == 7
    assert parse_id_json('"gw-1"') == "gw-1"
    assert parse_id_json('{"$oid": "65a1b2c3d4e5f60718293a4b"}') == OID


@pytest.mark.parametrize("text", ["", "{", "gw-1", '{"$oid": "nope"}', '{"$numberInt": "x"}'])
def test_malformed_extended_json_is_an_operator_error_that_quotes_it(text: str) -> None:
    with pytest.raises(OperatorError) as raised:
        parse_id_json(text)
    assert str(raised.value).startswith(f"malformed Extended JSON id {text!r}: ")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_each_refusal_says_which_document_and_why() -> None:
    missing = DocumentNotFound("jobs", '"gw-1"')
    assert str(missing) == """no document "gw-1" in collection 'jobs'"""
    assert (missing.collection, missing.shown) == ("jobs", '"gw-1"')

    docs = [{"_id": 42}, {"_id": "42"}]
    ambiguous = AmbiguousId("jobs", "42", docs)
    assert str(ambiguous) == "'42' names more than one document in 'jobs'"
    assert (ambiguous.collection, ambiguous.typed, ambiguous.documents) == ("jobs", "42", docs)

    changed = DocumentChanged("jobs", 42)
    assert str(changed) == "jobs/42 changed since it was read: nothing was done"
    assert (changed.collection, changed.doc_id) == ("jobs", 42)

    held = LeaseHeld("jobs", 42, "pod-1", NOW)
    assert str(held) == (
        "jobs/42 is held by a live lease of replica 'pod-1' until 2026-01-01 12:00:00+00:00"
    )
    assert (held.collection, held.doc_id, held.holder, held.until) == ("jobs", 42, "pod-1", NOW)
    for error in (missing, ambiguous, changed, held):
        assert isinstance(error, OperatorError) and isinstance(error, OrchestratorError)


def test_each_refusal_raised_for_one_document_carries_its_typed_value() -> None:
    """The value a bulk action records for a document it leaves alone (``Skipped``): a
    tool tells the refusals apart by it, never by their words."""
    refused = {
        DocumentNotFound("jobs", "1"): Refusal.NOT_FOUND,
        AmbiguousId("jobs", "42", []): Refusal.AMBIGUOUS_ID,
        DocumentChanged("jobs", 1): Refusal.CHANGED,
        LeaseHeld("jobs", 1, "pod-1", NOW): Refusal.LEASE_HELD,
        UnhandledPhase("jobs", "X", ["A"], "no handler"): Refusal.UNHANDLED_PHASE,
        UnhandledScope("jobs, phase X", "no handler takes X", ["A"], "no"): (
            Refusal.UNHANDLED_SCOPE
        ),
        NoErrorPhase("jobs", 1): Refusal.NO_ERROR_PHASE,
        UnindexedField("no index starts with 'x'"): Refusal.UNINDEXED_FIELD,
        OperatorError("'' is not a phase name"): Refusal.MALFORMED,
        OperatorError("too many", refusal=Refusal.TOO_MANY): Refusal.TOO_MANY,
    }
    for error, refusal in refused.items():
        assert error.refusal is refusal, error


def test_a_document_left_alone_by_a_bulk_action_says_its_refusal_and_why() -> None:
    row = Row.read({"_id": 1, "phase": "A", "lockToken": "t", "lockedUntil": NOW}, NOW)
    held = LeaseHeld("jobs", 1, "pod-1", NOW)
    left = Skipped.because(row, held)
    assert (left.row, left.refusal, left.why) == (row, Refusal.LEASE_HELD, str(held))
    bulk = Bulk(Action.RETRY, Filter("jobs"), dry_run=True, target=None, skipped=[left])
    [shown] = bulk.to_dict()["skipped"]
    assert (shown["id"], shown["refusal"], shown["why"]) == ("1", "lease_held", str(held))


def test_a_retry_and_a_cancel_are_named_for_what_they_did() -> None:
    done = ({"_id": 1}, "A", "B", NOW, True, False)
    retried, cancelled = Retried(*done), Cancelled(*done)
    assert (retried.action, cancelled.action) == (Action.RETRY, Action.CANCEL)
    assert not isinstance(cancelled, Retried) and retried != cancelled


# -- the operators' filters ----------------------------------------------------------------


@pytest.mark.parametrize("doc_id", [42, "42", OID, {"$gt": ""}, None])
def test_an_id_is_matched_exactly_never_read_as_an_operator(doc_id: Any) -> None:
    assert operators.exact_id_filter(doc_id) == {"_id": {"$eq": doc_id}}


def test_an_operator_action_applies_only_to_the_state_the_operator_saw() -> None:
    assert operators.operator_guard(42, "Failed") == {
        "_id": {"$eq": 42},
        "phase": {"$eq": "Failed"},
    }
    assert operators.operator_guard("x", {"$ne": 1}, "tok") == {
        "_id": {"$eq": "x"},
        "phase": {"$eq": {"$ne": 1}},
        "lockToken": {"$eq": "tok"},
    }
    # None is a token too: held by no lease.
    assert operators.operator_guard(1, None, None) == {
        "_id": {"$eq": 1},
        "phase": {"$eq": None},
        "lockToken": {"$eq": None},
    }


def test_errors_are_the_documents_with_a_last_error() -> None:
    assert operators.errors_filter(["A", "B"]) == {
        "phase": {"$in": ["A", "B"]},
        "lastError": {"$ne": None},
    }


def test_replica_records_are_found_by_id_and_removed_only_by_their_writer() -> None:
    assert replica_records.replica_filter("pod-1") == {"_id": "pod-1"}
    assert replica_records.replica_removal("pod-1", "i-7") == {"_id": "pod-1", "instance": "i-7"}


def test_live_records_expire_after_now_as_stored() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert replica_records.live_replicas_filter(now) == {
        "expiresAt": {"$gt": datetime(2026, 1, 1, 12, 0, 0, 123000)}
    }


def test_the_status_pipeline_groups_by_phase_into_the_counts_the_report_reads() -> None:
    """The stages the server runs: a row per phase carrying exactly the fields
    ``PhaseCount.from_row`` reads, a lease judged live as ``live_lease`` judges it (a
    token, and a ``lockedUntil`` strictly after now), narrowed by ``match``."""
    now = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    at = datetime(2026, 1, 1, 12, 0, 0, 123000)
    token = {"$ifNull": ["$lockToken", None]}
    until = {"$ifNull": ["$lockedUntil", None]}

    def count_if(condition: dict[str, Any]) -> dict[str, Any]:
        return {"$sum": {"$cond": [condition, 1, 0]}}

    group = {
        "$group": {
            "_id": "$phase",
            "count": {"$sum": 1},
            "leased": count_if({"$and": [{"$gt": [token, None]}, {"$gt": [until, at]}]}),
            "overdue": count_if({"$and": [{"$gt": [token, None]}, {"$lte": [until, at]}]}),
            "waiting": count_if({"$and": [{"$lte": [token, None]}, {"$gt": [until, at]}]}),
            # An error and no give-up mark: tried again; the mark: a handler gave up.
            "retrying": count_if(
                {
                    "$and": [
                        {"$gt": [{"$ifNull": ["$lastError", None]}, None]},
                        {"$lte": [{"$ifNull": ["$failedBy", None]}, None]},
                    ]
                }
            ),
            "failed": count_if({"$gt": [{"$ifNull": ["$failedBy", None]}, None]}),
        }
    }
    assert operators.status_pipeline(now) == [
        {"$match": {"phase": {"$exists": True}}},
        group,
        {"$sort": {"_id": 1}},
    ]
    assert operators.status_pipeline(now, {"_id": {"$eq": 7}})[0] == {
        "$match": {"_id": {"$eq": 7}, "phase": {"$exists": True}}
    }


def test_a_replica_record_is_live_until_its_expiry_and_seen_never_in_the_future() -> None:
    record = ReplicaRecord(
        replica_id="pod-1",
        instance="i",
        host="h",
        pid=1,
        version="1",
        engine="threaded",
        started=NOW,
        last_seen=NOW,
        expires_at=NOW + timedelta(seconds=30),
        lock_timeout=30.0,
        tick=1.0,
        max_concurrency=4,
    )
    assert record.live(NOW + timedelta(seconds=29, microseconds=999999))
    assert not record.live(NOW + timedelta(seconds=30))
    assert not record.live(NOW + timedelta(seconds=31))
    assert record.seen_ago(NOW + timedelta(seconds=2, milliseconds=500)) == 2.5
    assert record.seen_ago(NOW) == 0.0
    assert record.seen_ago(NOW - timedelta(seconds=5)) == 0.0


def _pod(*handlers: HandlerInfo) -> ReplicaRecord:
    return new_record(
        ReplicaIdentity("pod-1", "i-1", "h", 1, "1", "threaded", NOW),
        ReplicaSettings(lock_timeout=30, tick=1, max_concurrency=4),
        now=NOW,
        handlers=handlers,
    )


CHARGE = HandlerInfo("invoices", "Charging", "billing:charge", "k1", "Failed")
MAIL = HandlerInfo("invoices", "Mailing", "billing:mail", "k2", "Failed")
ANY = HandlerInfo("invoices", None, "billing:sweep", "k3", "Failed")


@pytest.mark.parametrize(
    "scope",
    [
        Scope("invoices"),
        Scope("invoices", "Charging"),
        Scope("invoices", handler="billing:sweep"),
        Scope("invoices", "Charging", "billing:charge"),
    ],
)
def test_a_pause_of_what_a_live_replica_runs_is_accepted(scope: Scope) -> None:
    check_scope(scope, [_pod(CHARGE, MAIL, ANY)])


@pytest.mark.parametrize(
    ("scope", "said"),
    [
        (Scope("invoicez"), "no handler works on collection 'invoicez'"),
        (Scope("invoices", "Chargin"), "no handler takes phase 'Chargin' of 'invoices'"),
        (Scope("invoices", handler="billing:charg"), "no handler 'billing:charg' runs on"),
        (
            Scope("invoices", "Mailing", "billing:charge"),
            "no handler 'billing:charge' runs on phase 'Mailing' of 'invoices'",
        ),
    ],
)
def test_a_pause_of_what_no_live_replica_runs_is_refused_naming_what_they_have(
    scope: Scope, said: str
) -> None:
    with pytest.raises(UnhandledScope, match="they have: ") as refused:
        check_scope(scope, [_pod(CHARGE, MAIL, ANY)])
    assert said in str(refused.value)
    assert refused.value.refusal is Refusal.UNHANDLED_SCOPE
    assert refused.value.known


def test_a_pause_with_no_replica_live_cannot_be_judged_and_is_refused() -> None:
    # Nothing to compare against: the message names the scope asked, not a collection.
    with pytest.raises(
        UnhandledScope, match=r"^invoices, phase Charging: nothing takes it \(no replica is live\)$"
    ):
        check_scope(Scope("invoices", "Charging"), [])
