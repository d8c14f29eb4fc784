"""Finding documents: each filter's query, order and index; keyset pages that add up to one
sorted read, whatever the stored fields hold; and a document's state judged in Python as
the status counts judge it in the aggregation."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any, TypeVar

import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import STANDARD
from bson.codec_options import CodecOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient
from pymongo.database import Database

from orchestrator.core import history
from orchestrator.core.clock import bson_time
from orchestrator.core.documents import id_json
from orchestrator.core.errors import OperatorError, StoreError
from orchestrator.core.queries import claims, operators
from orchestrator.operations import Action, Operations, filters
from orchestrator.operations.filters import Filter, LeaseState, UnindexedField
from orchestrator.testing import memory_database
from orchestrator.testing.faults import Faults
from orchestrator.testing.memory import MemoryDatabase
from tests.conftest import MONGODB_URI, NO_SERVER

T = TypeVar("T")

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CLAIM = [("phase", 1), ("claimPriority", -1), ("lockedUntil", 1), ("updatedAt", 1), ("_id", 1)]
ERRORS = [("phase", 1), ("lastError.at", -1), ("_id", -1)]


# -- which index serves which filter ------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("query", "hint", "sort"),
    [
        (Filter("c", ("A",)), CLAIM, filters.LEASE_ORDER),
        (Filter("c"), CLAIM, filters.LEASE_ORDER),
        (Filter("c", ("A",), LeaseState.OVERDUE), CLAIM, filters.LEASE_ORDER),
        (Filter("c", state=LeaseState.LEASED), CLAIM, filters.LEASE_ORDER),
        (Filter("c", ("A",), LeaseState.FAILED), ERRORS, filters.ERROR_ORDER),
        (Filter("c", state=LeaseState.RETRYING), ERRORS, filters.ERROR_ORDER),
        (Filter("c", error_type="TimeoutError"), ERRORS, filters.ERROR_ORDER),
        (Filter("c", fields=(("invoiceNo", "INV-1"),)), [("invoiceNo", 1)], [("_id", 1)]),
    ],
)
def test_each_filter_is_served_by_an_index_in_its_order(
    query: Filter, hint: list[tuple[str, int]], sort: list[tuple[str, int]]
) -> None:
    indexes = [[("_id", 1)], CLAIM, ERRORS, [("invoiceNo", 1)], [("invoiceNo", 1), ("n", 1)]]
    plan = filters.plan(query, NOW, ["A", "B"], indexes)
    assert plan.hint == hint and plan.sort == sort
    # Every phase is named (one equality, or an $in the server merges in index order):
    # the index's first field is always bounded, never scanned whole.
    first = plan.query["$and"][0] if "$and" in plan.query else plan.query
    assert first["phase"] in ("A", {"$in": ["A", "B"]})
    assert plan.index


@pytest.mark.pure
def test_the_claim_index_orders_pages_totally_and_serves_the_claim() -> None:
    assert claims.CLAIM_INDEX == CLAIM
    assert CLAIM[1:4] == claims.CLAIM_SORT
    assert CLAIM[1:] == filters.LEASE_ORDER
    assert operators.ERRORS_INDEX == ERRORS


@pytest.mark.pure
def test_a_field_no_index_starts_with_is_refused_naming_the_indexes() -> None:
    query = Filter("c", fields=(("customer", "ACME"),))
    with pytest.raises(UnindexedField, match=r"no index of 'c' starts with 'customer'.*\(_id\)"):
        filters.plan(query, NOW, ["A"], [[("_id", 1)], [("n", 1), ("customer", 1)]])


@pytest.mark.pure
@pytest.mark.parametrize("token", ["", "%%%", "bm90IGpzb24", "WzFd"])
def test_a_malformed_or_foreign_cursor_is_an_operator_error(token: str) -> None:
    with pytest.raises(OperatorError, match="cursor"):
        filters.plan(Filter("c", ("A",)), NOW, [], [], after=token or "x")


@pytest.mark.pure
def test_fields_are_typed_as_extended_json_else_text() -> None:
    oid = ObjectId()
    parsed = filters.parse_fields(["n=42", 's="42"', "k=INV-1003", f'o={{"$oid": "{oid}"}}'])
    assert parsed == (("n", 42), ("s", "42"), ("k", "INV-1003"), ("o", oid))
    for bad in ("novalue", "=x", 'd={"a": 1}'):
        with pytest.raises(OperatorError):
            filters.parse_fields([bad])


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
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2030, 1, 1)).map(bson_time),
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
            # A handler's give-up mark (None: an application's null, not a mark).
            "failedBy": st.sampled_from(["MISSING", None, "jobs/A/h"]),
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
    Filter("jobs", ("B",), LeaseState.RETRYING),
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
        plan = filters.plan(query, now, ops._reports.phases("jobs"), [])
        whole = db.jobs.find(plan.query).sort(plan.sort)
        assert paged == [filters._ref(d["_id"]) for d in whole], query
        assert len(set(paged)) == len(paged)


def test_pages_on_the_server_add_up_too(db: Database[Any]) -> None:
    """The same walk on the test's store (the wire server in CI), with hints it checks."""
    now = bson_time(NOW)
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
        if n in (0, 6, 7):  # given up on (7 at 16 MiB: its error was not stored)
            doc["failedBy"] = "jobs/B/h"
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
    at = bson_time(datetime(2026, 1, 1))
    counted = Counter[tuple[str, str]]()
    for row in db.jobs.aggregate(operators.status_pipeline(at)):
        for state in ("leased", "overdue", "waiting", "retrying", "failed"):
            counted[(row["_id"], state)] += row[state]
    judged = Counter[tuple[str, str]]()
    for doc in db.jobs.find():
        state = filters.judge(doc, at.replace(tzinfo=UTC))
        if state is not LeaseState.FREE:
            judged[(doc["phase"], state.value)] += 1
        failure = filters.attempt_state(doc)
        if failure is not None:
            judged[(doc["phase"], failure.value)] += 1
        # and the query form selects the same documents
        for each in LeaseState:
            chosen = db.jobs.find_one(
                {"$and": [{"_id": doc["_id"]}, filters.state_condition(each, at)]}
            )
            expected = (
                failure is each
                if each in (LeaseState.RETRYING, LeaseState.FAILED)
                else (state is each)
            )
            assert (chosen is not None) == expected, (each, doc)
    assert +counted == +judged


# -- every BSON type, and ids a client decodes as UUIDs -------------------------------------

IN_BSON_ORDER: list[Any] = [
    MinKey(),
    None,
    -1,
    Int64(2),
    2.5,
    Decimal128("3.25"),
    "a string",
    {"a": 1},
    [7],
    Binary(b"bytes"),
    uuid.UUID(int=5),
    ObjectId("0" * 24),
    True,
    datetime(2026, 1, 1),
    Timestamp(1, 1),
    Regex("^a"),
    Code("f()"),
    Code("g()", {"x": 1}),
    MaxKey(),
]
"""A value of each type, in BSON's sort order (numbers of every kind as one type)."""


@pytest.mark.pure
def test_every_bson_type_is_ranked_in_bsons_sort_order() -> None:
    ranks = [filters._rank(value) for value in IN_BSON_ORDER]
    assert None not in ranks and ranks == sorted(ranks)
    # int, long, double and decimal are numbers; a UUID is binary data
    assert len(set(ranks)) == len(IN_BSON_ORDER) - 4
    # A page after a value goes on with the types after it, and none before: after a
    # Decimal128, strings and documents; before it, only null (missing) and minKey.
    decimal = filters._beyond("n", Decimal128("1"), 1)["$or"]
    assert {"n": {"$type": "string"}} in decimal and {"n": {"$type": "maxKey"}} in decimal
    assert {"n": {"$type": "number"}} not in decimal and {"n": None} not in decimal
    assert filters._beyond("n", Decimal128("1"), -1)["$or"][1:] == [
        {"n": {"$type": "minKey"}},
        {"n": None},
    ]
    # minKey and maxKey hold one value each: after maxKey nothing, before minKey nothing.
    assert filters._beyond("n", MaxKey(), 1) == {"n": {"$in": []}}
    assert filters._beyond("n", MinKey(), -1) == {"n": {"$in": []}}


@pytest.mark.pure
def test_a_cursor_of_any_bson_value_round_trips_and_an_unplaced_type_is_refused() -> None:
    for value in IN_BSON_ORDER:
        token = filters.cursor({"_id": value}, [("_id", 1)])
        by_key = Filter("c", ("A",), fields=(("k", 1),))
        query = filters.plan(by_key, NOW, [], [[("k", 1)]], after=token).query
        assert query["$and"][-1]["$or"], value
    with pytest.raises(OperatorError, match=r"_id is a Fraction, a value BSON's sort order"):
        filters.cursor({"_id": Fraction(1, 3)}, [("_id", 1)])


@pytest.fixture(
    params=[
        "memory",
        pytest.param(
            "mongodb",
            marks=[pytest.mark.mongodb, pytest.mark.skipif(not MONGODB_URI, reason=NO_SERVER)],
        ),
    ]
)
def uuid_db(request: pytest.FixtureRequest) -> Iterator[Database[Any]]:
    """A database whose client decodes binary subtype 4 as ``uuid.UUID``
    (``uuidRepresentation="standard"``): in memory, or on the server of ``MONGODB_URI``."""
    if request.param == "memory":
        yield memory_database(codec_options=CodecOptions(uuid_representation=STANDARD))
        return
    client: MongoClient[Any] = MongoClient(
        MONGODB_URI, uuidRepresentation="standard", serverSelectionTimeoutMS=5000
    )
    name = f"orchestrator_test_{uuid.uuid4().hex[:8]}"
    try:
        yield client[name]
    finally:
        client.drop_database(name)
        client.close()


def failed_jobs(ids: list[Any], phase: str = "A") -> list[dict[str, Any]]:
    """Documents of ``ids`` whose attempt failed at the same moment, each still under an
    expired lease (retrying): the errors lists order them by id alone (descending)."""
    at = bson_time(NOW)
    return [
        {
            "_id": Binary.from_uuid(i) if isinstance(i, uuid.UUID) else i,
            "phase": phase,
            "lastError": {"type": "E", "message": "m", "at": at},
            "lockToken": f"t{n}",
            "lockedBy": "pod-x",
            "lockedUntil": at,
        }
        for n, i in enumerate(ids)
    ]


def test_pages_of_uuid_ids_follow_each_other_in_both_orders(uuid_db: Database[Any]) -> None:
    """Past the first page, the cursor names a UUID as the bytes the client decoded it
    from (before: ``ValueError`` encoding the cursor, a 500 on the page)."""
    ids = [uuid.UUID(int=n * 7919) for n in range(11)]
    uuid_db.jobs.insert_many(failed_jobs(ids))
    ops = Operations(uuid_db)
    for query in (Filter("jobs"), Filter("jobs", ("A",), LeaseState.RETRYING)):
        paged = page_through(ops, query, 3)
        assert paged == page_through(ops, query, 500) and len(set(paged)) == 11, query
    assert page_through(ops, Filter("jobs"), 3) == [str(i) for i in sorted(ids)]


class PageBound(Faults):
    """Faults that end a bulk action reading more than ``pages`` pages (a loop), and fail
    the ``fail_at``-th change of a document, once."""

    def __init__(self, pages: int = 30, fail_at: int = 0) -> None:
        super().__init__()
        self.pages, self.fail_at, self.changes = pages, fail_at, 0

    def run(self, operation: str, call: Callable[[], T]) -> T:
        if operation == "find":
            self.pages -= 1
            assert self.pages >= 0, "paging never ended"
        if operation == "find_one_and_update":
            self.changes += 1
            if self.changes == self.fail_at:
                self.fail_next(operation)
        return super().run(operation, call)


def test_a_bulk_action_over_many_uuid_ids_changes_each_once(uuid_db: Database[Any]) -> None:
    """More than one batch (500) of documents: the action pages on past the first batch
    and ends (before: ``ValueError`` after changing the first 500, and no audit entry)."""
    if isinstance(uuid_db, MemoryDatabase):
        pytest.skip("the in-memory store matches no uuid.UUID in a query (mongomock)")
    uuid_db.jobs.insert_many(failed_jobs([uuid.UUID(int=n) for n in range(620)]))
    ops = Operations(PageBound().wrap(uuid_db))
    done = ops.bulk(Action.UNLOCK, Filter("jobs", ("A",), LeaseState.RETRYING), why="bulk")
    assert len(done.changed) == 620 and not done.skipped
    assert uuid_db.jobs.count_documents({"lockToken": {"$exists": True}}) == 0
    assert all(len(d[history.HISTORY_FIELD]) == 1 for d in uuid_db.jobs.find())
    [record] = Operations(uuid_db).audit()
    assert (record.action, record.count, record.failed) == ("unlock", 620, None)


def test_a_bulk_action_that_fails_part_way_is_audited_with_what_it_changed(
    db: Database[Any],
) -> None:
    """Three documents changed, the fourth change fails: the audit entry counts the three
    and says why it stopped, and the error still reaches the operator (before: no entry,
    three changes unaudited)."""
    db.jobs.insert_many(failed_jobs(list(range(6))))
    faults = PageBound(fail_at=4)
    with pytest.raises(StoreError):
        Operations(faults.wrap(db), actor="ops@test").bulk(
            Action.UNLOCK, Filter("jobs", ("A",), LeaseState.RETRYING), why="card fixed"
        )
    changed = [d["_id"] for d in db.jobs.find({"lockToken": {"$exists": False}})]
    assert len(changed) == 3
    [record] = Operations(db).audit()
    assert (record.action, record.by, record.why, record.count) == (
        "unlock",
        "ops@test",
        "card fixed",
        3,
    )
    assert sorted(record.documents) == sorted(id_json(i) for i in changed)
    assert record.failed is not None and "injected" in record.failed


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason=NO_SERVER)
def test_pages_over_values_of_every_bson_type_add_up_on_the_server(db: Database[Any]) -> None:
    """Ids and claim priorities of every type the server stores (Decimal128, Timestamp,
    Regex, minKey, maxKey among them; the in-memory store cannot sort those): each
    filter's pages list each document once, in one sorted read's order (before: the
    failed list repeated pages for ever, ascending ids skipped the strings)."""
    if isinstance(db, MemoryDatabase):
        pytest.skip("the in-memory store (mongomock) cannot store or sort these types")
    # Not documents or arrays (an array sorts by an element; the wire server of the CI
    # tier compares a value with a document out of BSON's order), nor Code (that server
    # counts it a string) or a UUID (this client stores none).
    kinds = dict | list | Code | uuid.UUID
    priorities = [v for v in IN_BSON_ORDER if not isinstance(v, kinds)]
    ids = [v for v in priorities if not isinstance(v, Regex) and v is not None]
    docs = failed_jobs([*ids, *(Decimal128(f"{n}.75") for n in range(6)), "s1", "s2"])
    for n, doc in enumerate(docs):
        doc["claimPriority"] = priorities[n % len(priorities)]
        doc["phase"] = "AB"[n % 2]
    db.jobs.insert_many(docs)
    ops = Operations(db)
    for query in (
        Filter("jobs"),
        Filter("jobs", ("A",)),
        Filter("jobs", state=LeaseState.RETRYING),
    ):
        paged = page_through(ops, query, 2)
        plan = filters.plan(query, ops.now(), ["A", "B"], [])
        whole = db.jobs.find(plan.query).sort(plan.sort)
        assert paged == [filters._ref(d["_id"]) for d in whole], query


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason=NO_SERVER)
def test_a_bulk_action_over_many_decimal128_ids_ends_and_changes_each_once(
    db: Database[Any],
) -> None:
    """The failed list orders by id, descending: a Decimal128 taken for a document sent
    the next page back to every number (before: the same page for ever)."""
    if isinstance(db, MemoryDatabase):
        pytest.skip("the in-memory store (mongomock) cannot store Decimal128 ids")
    db.jobs.insert_many(failed_jobs([Decimal128(f"{n}.5") for n in range(560)] + ["s"]))
    ops = Operations(PageBound().wrap(db))
    done = ops.bulk(Action.UNLOCK, Filter("jobs", ("A",), LeaseState.RETRYING), why="bulk")
    assert len(done.changed) == 561 and not done.skipped
    assert all(len(d[history.HISTORY_FIELD]) == 1 for d in db.jobs.find())
    [record] = Operations(db).audit()
    assert (record.count, record.failed) == (561, None)
