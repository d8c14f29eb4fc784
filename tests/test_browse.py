"""Finding documents: each filter's query, order and index; keyset pages that add up to one
sorted read, whatever the stored fields hold; and a document's state judged in Python as
the status counts judge it in the aggregation."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bson import ObjectId
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo.database import Database

from orchestrator.core import browse, queries
from orchestrator.core.browse import Filter, LeaseState, UnindexedField
from orchestrator.core.errors import OperatorError
from orchestrator.operations import Operations
from orchestrator.testing import memory_database

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CLAIM = [("phase", 1), ("claimPriority", -1), ("lockedUntil", 1), ("updatedAt", 1), ("_id", 1)]
ERRORS = [("phase", 1), ("lastError.at", -1), ("_id", -1)]


# -- which index serves which filter ------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("query", "hint", "sort"),
    [
        (Filter("c", ("A",)), CLAIM, browse.LEASE_ORDER),
        (Filter("c"), CLAIM, browse.LEASE_ORDER),
        (Filter("c", ("A",), LeaseState.OVERDUE), CLAIM, browse.LEASE_ORDER),
        (Filter("c", state=LeaseState.LEASED), CLAIM, browse.LEASE_ORDER),
        (Filter("c", ("A",), LeaseState.FAILED), ERRORS, browse.ERROR_ORDER),
        (Filter("c", error_type="TimeoutError"), ERRORS, browse.ERROR_ORDER),
        (Filter("c", fields=(("invoiceNo", "INV-1"),)), [("invoiceNo", 1)], [("_id", 1)]),
    ],
)
def test_each_filter_is_served_by_an_index_in_its_order(
    query: Filter, hint: list[tuple[str, int]], sort: list[tuple[str, int]]
) -> None:
    indexes = [[("_id", 1)], CLAIM, ERRORS, [("invoiceNo", 1)], [("invoiceNo", 1), ("n", 1)]]
    plan = browse.plan(query, NOW, ["A", "B"], indexes)
    assert plan.hint == hint and plan.sort == sort
    # Every phase is named (one equality, or an $in the server merges in index order):
    # the index's first field is always bounded, never scanned whole.
    first = plan.query["$and"][0] if "$and" in plan.query else plan.query
    assert first["phase"] in ("A", {"$in": ["A", "B"]})
    assert plan.index


@pytest.mark.pure
def test_the_claim_index_orders_pages_totally_and_serves_the_claim() -> None:
    assert queries.CLAIM_INDEX == CLAIM
    assert CLAIM[1:4] == queries.CLAIM_SORT
    assert CLAIM[1:] == browse.LEASE_ORDER
    assert queries.ERRORS_INDEX == ERRORS


@pytest.mark.pure
def test_a_field_no_index_starts_with_is_refused_naming_the_indexes() -> None:
    query = Filter("c", fields=(("customer", "ACME"),))
    with pytest.raises(UnindexedField, match=r"no index of 'c' starts with 'customer'.*\(_id\)"):
        browse.plan(query, NOW, ["A"], [[("_id", 1)], [("n", 1), ("customer", 1)]])


@pytest.mark.pure
@pytest.mark.parametrize("token", ["", "%%%", "bm90IGpzb24", "WzFd"])
def test_a_malformed_or_foreign_cursor_is_an_operator_error(token: str) -> None:
    with pytest.raises(OperatorError, match="cursor"):
        browse.plan(Filter("c", ("A",)), NOW, [], [], after=token or "x")


@pytest.mark.pure
def test_fields_are_typed_as_extended_json_else_text() -> None:
    oid = ObjectId()
    parsed = browse.parse_fields(["n=42", 's="42"', "k=INV-1003", f'o={{"$oid": "{oid}"}}'])
    assert parsed == (("n", 42), ("s", "42"), ("k", "INV-1003"), ("o", oid))
    for bad in ("novalue", "=x", 'd={"a": 1}'):
        with pytest.raises(OperatorError):
            browse.parse_fields([bad])


@pytest.mark.pure
def test_an_operator_is_never_taken_for_a_name() -> None:
    for phases, fields in ((("$x",), ()), ((), (("$where", 1),)), ((), (("a.", 1),))):
        with pytest.raises(OperatorError, match="is not a"):
            Filter("c", phases, fields=fields)


# -- pages add up to one sorted read --------------------------------------------------------

# Not booleans: mongomock compares them as numbers (Python's False == 0), a server never.
odd_values = st.one_of(
    st.none(),
    st.just("MISSING"),
    st.integers(-5, 5),
    st.text(max_size=3),
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2030, 1, 1)).map(
        queries.bson_time
    ),
    st.just(datetime(1970, 1, 1)),
)
ids = st.one_of(st.integers(0, 10**6), st.text(min_size=1, max_size=4), st.builds(ObjectId))
documents = st.lists(
    st.fixed_dictionaries(
        {
            "_id": ids,
            "phase": st.sampled_from(["A", "B", "Failed"]),
            "lockedUntil": odd_values,
            "updatedAt": odd_values,
            "claimPriority": odd_values,  # descending in the claim's order
            "lockToken": st.sampled_from(["MISSING", None, "t1"]),
            "lastError": st.one_of(
                st.just("MISSING"),
                st.just("a string error"),
                st.fixed_dictionaries({"type": st.sampled_from(["E", "F"]), "at": odd_values}),
            ),
        }
    ),
    max_size=12,
    unique_by=lambda d: repr(d["_id"]),
)


def stored(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if value == "MISSING":
            continue
        out[key] = (
            {k: v for k, v in value.items() if v != "MISSING"} if isinstance(value, dict) else value
        )
    return out


FILTERS = [
    Filter("jobs"),
    Filter("jobs", ("A",)),
    Filter("jobs", ("A", "Failed")),
    *(Filter("jobs", state=state) for state in LeaseState),
    Filter("jobs", ("B",), LeaseState.FAILED),
    Filter("jobs", error_type="E"),
]


def page_through(ops: Operations, query: Filter, size: int) -> list[str]:
    seen: list[str] = []
    after = None
    for _ in range(100):
        page = ops.browse(query, after=after, limit=size)
        seen.extend(row.ref or row.id for row in page.rows)
        if page.next is None:
            return seen
        after = page.next
    raise AssertionError("paging never ended")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=documents, size=st.integers(1, 4))
def test_keyset_pages_add_up_to_one_sorted_read_whatever_the_fields_hold(
    size: int, docs: list[dict[str, Any]]
) -> None:
    """Page after page, each document of a filter is listed exactly once, in the order one
    sorted read gives, with ids of every type and lease fields holding anything."""
    db = memory_database()
    db.create_collection("jobs")
    if docs:
        db.jobs.insert_many([stored(d) for d in docs])
    ops = Operations(db)
    now = ops.now()
    for query in FILTERS:
        paged = page_through(ops, query, size)
        plan = browse.plan(query, now, ops._reports.phases("jobs"), [])
        whole = db.jobs.find(plan.query).sort(plan.sort)
        assert paged == [browse._ref(d["_id"]) for d in whole], query
        assert len(set(paged)) == len(paged)


def test_pages_on_the_server_add_up_too(db: Database[Any]) -> None:
    """The same walk on the test's store (the wire server in CI), with hints it checks."""
    now = queries.bson_time(NOW)
    rows = []
    for n in range(23):
        doc: dict[str, Any] = {
            "_id": n if n % 3 else f"s{n}",
            "phase": "A" if n % 2 else "B",
            "lockedUntil": now + timedelta(seconds=n % 4 - 2) if n % 5 else datetime(1970, 1, 1),
            "updatedAt": now - timedelta(seconds=n // 2),
        }
        if n % 4 == 0:
            doc["lockToken"] = f"t{n}"
        if n % 3 == 1:
            doc["claimPriority"] = n % 7 + 1
        if n % 3 == 0:
            doc["lastError"] = {"type": "E" if n % 2 else "F", "at": now - timedelta(seconds=n)}
        rows.append(doc)
    db.jobs.insert_many(rows)
    ops = Operations(db)
    for query in FILTERS:
        paged = page_through(ops, query, 4)
        everything = page_through(ops, query, 500)
        assert paged == everything and len(set(paged)) == len(paged), query


# -- a document's state, in Python and in the aggregation -------------------------------------


@settings(max_examples=60, deadline=None)
@given(docs=documents)
def test_a_rows_state_is_the_one_the_counts_give_it(docs: list[dict[str, Any]]) -> None:
    db = memory_database()
    if docs:
        db.jobs.insert_many([stored(d) for d in docs])
    at = queries.bson_time(datetime(2026, 1, 1))
    counted = Counter[tuple[str, str]]()
    for row in db.jobs.aggregate(queries.status_pipeline(at)):
        for state in ("leased", "overdue", "waiting"):
            counted[(row["_id"], state)] += row[state]
        counted[(row["_id"], "failed")] += row["failed"]
    judged = Counter[tuple[str, str]]()
    for doc in db.jobs.find():
        state = browse.judge(doc, at.replace(tzinfo=UTC))
        if state is not LeaseState.FREE:
            judged[(doc["phase"], state.value)] += 1
        if doc.get("lastError") is not None:
            judged[(doc["phase"], "failed")] += 1
        # and the query form selects the same documents
        for each in LeaseState:
            chosen = db.jobs.find_one(
                {"$and": [{"_id": doc["_id"]}, browse.state_condition(each, at)]}
            )
            expected = (
                (doc.get("lastError") is not None) if each is LeaseState.FAILED else (state is each)
            )
            assert (chosen is not None) == expected, (each, doc)
    assert +counted == +judged
