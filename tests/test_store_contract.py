"""The store contract, checked once against every store, as APScheduler 4 checks its data
stores: the sync ``Store`` on ``memory_database``, ``AsyncStore`` on
``async_memory_database`` and on an ``async_view`` of a ``memory_database``, and both on
the server named by ``MONGODB_URI`` (``MongoClient``, ``AsyncMongoClient``) when it is set;
and the operator's side (``ReportStore``: ``Reports``, ``AsyncReports``) on each of them.

Every test is written against the async face; the sync store runs each call in a worker
thread (as sync replicas call it from theirs), so concurrent calls overlap for real in
both forms. What only the in-memory server can stage (another server version, no
majority, no clock) is skipped on a real server.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio.to_thread
import pytest
from bson.codec_options import CodecOptions, DatetimeConversion
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import AutoReconnect, OperationFailure, WriteError, WTimeoutError
from pymongo.errors import DocumentTooLarge as DriverDocumentTooLarge

from orchestrator import ConfigError, StoreError
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.limits import Limit, LimitKind
from orchestrator.core.names import CLAIM_INDEX_NAME
from orchestrator.core.queries import claims, lease_writes, limit_slots, operators
from orchestrator.core.resource import EPOCH
from orchestrator.mongo import AsyncStore, Store, connect, connect_async
from orchestrator.mongo.connection import MIN_SERVER_VERSION
from orchestrator.mongo.driver_errors import DocumentTooLarge
from orchestrator.operations import AsyncReports, Reports
from orchestrator.operations.status_report import PhaseCount, RecentError
from orchestrator.testing import FakeClock, async_memory_database, async_view, memory_database
from orchestrator.testing.faults import Faults

pytestmark = pytest.mark.anyio

MONGODB_URI = os.environ.get("MONGODB_URI")
HORIZON = 86_400.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # PyMongo's async API runs on asyncio


class Threaded:
    """A sync ``Store`` with ``AsyncStore``'s face: each I/O method runs in a worker thread.

    ``collection`` and ``database`` do no I/O and are the store's own.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def database(self) -> Any:
        return self.store.database

    def collection(self, name: str) -> Any:
        return self.store.collection(name)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await anyio.to_thread.run_sync(functools.partial(method, *args, **kwargs))

        return call


async def resolve(value: Any) -> Any:
    """``value``, awaited if it is awaitable: a raw driver call of either form."""
    return await value if inspect.isawaitable(value) else value


async def read_all(cursor: Any) -> list[Any]:
    """A raw cursor's documents, whether the call gave a cursor or a coroutine of one."""
    return list(await resolve((await resolve(cursor)).to_list()))


@dataclass
class Backend:
    """Opens stores of one kind on one database, made for the test and dropped after it."""

    name: str
    clock: FakeClock
    real: bool = False
    _shared: Any = None
    _client: Any = None
    _db_name: str = ""

    @property
    def is_async(self) -> bool:
        return self.name.startswith("async")

    def database(self, **options: Any) -> Any:
        """The test's database; given options of the in-memory server (``server_time``,
        ``hello``, ``wire_version``), a database of its own: a real server is what it is.
        ``codec_options`` are the client's, as ``MongoClient(tz_aware=...)`` sets them."""
        codec = options.pop("codec_options", None)
        if self.real:
            if options:
                pytest.skip(f"a real server cannot be given {sorted(options)}")
            db = self._client[self._db_name]
        elif options:
            db = self._memory(**options)
        else:
            if self._shared is None:
                self._shared = self._memory()
            db = self._shared
        return db if codec is None else db.with_options(codec_options=codec)

    def _memory(self, **options: Any) -> Any:
        if self.name == "async-memory":
            return async_memory_database(clock=self.clock, **options)
        sync = memory_database(clock=self.clock, **options)
        return async_view(sync) if self.name == "async-view" else sync

    def open(self, *, faults: Faults | None = None, db: Any = None, **options: Any) -> Any:
        """A store of this backend's kind; ``options`` go to the database (in-memory
        server options, ``codec_options``) or to the store (``write_timeout``...)."""
        store_options = {
            k: options.pop(k) for k in ("write_concern", "write_timeout") if k in options
        }
        if db is None:
            db = self.database(**options)
        if faults is not None:
            db = faults.wrap(db)
        if self.is_async:
            return AsyncStore(db, **store_options)
        return Threaded(Store(db, **store_options))

    def reports(self, db: Any) -> Any:
        """The operator's side of the store on ``db`` (a store's ``database``), of this
        backend's kind."""
        return AsyncReports(db) if self.is_async else Threaded(Reports(db))


def _backend_params() -> list[Any]:
    real = [
        pytest.mark.mongodb,
        pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set"),
    ]
    return [
        "sync-memory",
        "async-memory",
        "async-view",
        pytest.param("sync-mongodb", marks=real),
        pytest.param("async-mongodb", marks=real),
    ]


@pytest.fixture(params=_backend_params())
async def backend(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Backend]:
    name = request.param
    if not name.endswith("mongodb"):
        yield Backend(name, clock)
        return
    db_name = f"orchestrator_contract_{uuid.uuid4().hex[:8]}"
    if name == "sync-mongodb":
        sync_client: MongoClient[Any] = MongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
        try:
            yield Backend(name, clock, real=True, _client=sync_client, _db_name=db_name)
        finally:
            sync_client.drop_database(db_name)
            sync_client.close()
        return
    async_client: AsyncMongoClient[Any] = AsyncMongoClient(
        MONGODB_URI, serverSelectionTimeoutMS=5000
    )
    try:
        yield Backend(name, clock, real=True, _client=async_client, _db_name=db_name)
    finally:
        await async_client.drop_database(db_name)
        await async_client.close()


# -- helpers ---------------------------------------------------------------------------------


def lease(now: datetime, token: str, seconds: float = 30) -> dict[str, Any]:
    """The fields of a lease taken at ``now`` for ``seconds``."""
    return {
        "lockToken": token,
        "lockedBy": "pod-1",
        "lockedAt": bson_time(now),
        "lockedUntil": bson_time(now + timedelta(seconds=seconds)),
    }


def claim_update(now: datetime, token: str) -> dict[str, Any]:
    return claims.claim_update(now, now + timedelta(seconds=30), token, "pod-1")


async def seed(store: Any, name: str, *docs: dict[str, Any]) -> None:
    for doc in docs:
        await store.insert(name, doc, ())


async def read(store: Any, name: str, query: dict[str, Any]) -> Any:
    """A document as ``store``'s collection reads it (with the store's codec options)."""
    return await resolve(store.collection(name).find_one(query))


# -- claim -------------------------------------------------------------------------------------


async def test_claim_takes_the_longest_free_document_first(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    older, newer = now - timedelta(minutes=5), now - timedelta(minutes=1)
    await seed(
        store,
        "jobs",
        {"_id": "released-late", "phase": "Q", "lockedUntil": bson_time(newer), "updatedAt": older},
        {"_id": "released-early", "phase": "Q", "lockedUntil": bson_time(older), "updatedAt": now},
        {"_id": "never-leased", "phase": "Q", "updatedAt": now},
        {"_id": "epoch-newer", "phase": "Q", "lockedUntil": EPOCH, "updatedAt": newer},
        {"_id": "epoch-older", "phase": "Q", "lockedUntil": EPOCH, "updatedAt": older},
        {"_id": "other-phase", "phase": "R", "lockedUntil": EPOCH, "updatedAt": older},
    )
    order = []
    for n in range(6):
        doc = await store.claim(
            "jobs", claims.ClaimRequest({"phase": "Q"}, now, HORIZON, claim_update(now, f"t{n}"))
        )
        if doc is None:
            break
        assert doc["lockToken"] == f"t{n}", "the claim returns the document after its update"
        order.append(doc["_id"])
    assert order == [
        "never-leased",
        "epoch-older",
        "epoch-newer",
        "released-early",
        "released-late",
    ]


async def test_claim_leaves_live_leases_and_takes_expired_and_bogus_ones(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    await seed(
        store,
        "jobs",
        {"_id": "live", "phase": "Q", **lease(now, "a")},
        {"_id": "waiting", "phase": "Q", "lockedUntil": bson_time(now + timedelta(seconds=5))},
        {"_id": "expired", "phase": "Q", **lease(now - timedelta(minutes=1), "b")},
        {"_id": "bogus", "phase": "Q", "lockedUntil": bson_time(now + timedelta(days=400))},
        {"_id": "not-a-date", "phase": "Q", "lockedUntil": "tomorrow"},
    )
    taken = set()
    while doc := await store.claim(
        "jobs", claims.ClaimRequest({"phase": "Q"}, now, HORIZON, claim_update(now, "c"))
    ):
        taken.add(doc["_id"])
    assert taken == {"expired", "bogus", "not-a-date"}
    live = await read(store, "jobs", {"_id": "live"})
    assert live is not None and live["lockToken"] == "a", "a live lease is left to its holder"


async def test_claim_finds_nothing_when_nothing_is_free(backend: Backend, clock: FakeClock) -> None:
    store = backend.open()
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Q", **lease(now, "a")})
    assert (
        await store.claim(
            "jobs", claims.ClaimRequest({"phase": "Q"}, now, HORIZON, {"$set": {"x": 1}})
        )
        is None
    )
    assert (
        await store.claim(
            "jobs", claims.ClaimRequest({"phase": "Z"}, now, HORIZON, {"$set": {"x": 1}})
        )
        is None
    )
    assert (
        await store.claim(
            "none", claims.ClaimRequest({"phase": "Q"}, now, HORIZON, {"$set": {"x": 1}})
        )
        is None
    )


async def test_a_handler_does_not_claim_what_it_failed_while_it_stays_failed(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Failed", "failedBy": "create"})
    update = claim_update(now, "t")
    create = claims.failed_exclusion("create", "app.create", "Failed", {"kind": "w"})
    report = claims.failed_exclusion("report", "app.report", "Failed", {"kind": "w"})
    assert (
        await store.claim(
            "jobs", claims.ClaimRequest({"phase": "Failed"}, now, HORIZON, update, exclusion=create)
        )
        is None
    )
    found = await store.probe([("jobs", [({"phase": "Failed"}, create)])], now, HORIZON)
    assert found.ready == frozenset()
    doc = await store.claim(
        "jobs", claims.ClaimRequest({"phase": "Failed"}, now, HORIZON, update, exclusion=report)
    )
    assert doc is not None and doc["_id"] == 1
    # Moved out of the failed phase (by the API, say), it is the marking handler's again.
    await seed(store, "jobs", {"_id": 2, "phase": "Creating", "kind": "w", "failedBy": "create"})
    doc = await store.claim(
        "jobs", claims.ClaimRequest({"kind": "w"}, now, HORIZON, update, exclusion=create)
    )
    assert doc is not None and doc["_id"] == 2


async def test_concurrent_claims_take_each_document_once(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    await seed(store, "jobs", *({"_id": n, "phase": "Q"} for n in range(8)))
    rivals = [backend.open() for _ in range(3)]  # replicas with stores of their own

    async def claim(n: int) -> Any:
        replica = rivals[n % len(rivals)]
        update = claim_update(now, f"t{n}")
        return await replica.claim(
            "jobs", claims.ClaimRequest({"phase": "Q"}, now, HORIZON, update)
        )

    results = await asyncio.gather(*(claim(n) for n in range(16)))
    taken = [doc["_id"] for doc in results if doc is not None]
    assert sorted(taken) == list(range(8)), "each document claimed exactly once"
    for doc in results:
        if doc is not None:
            stored = await read(store, "jobs", {"_id": doc["_id"]})
            assert stored is not None and stored["lockToken"] == doc["lockToken"]


# -- probe ----------------------------------------------------------------------------------


async def test_probe_answers_whether_any_handler_could_claim_and_writes_nothing(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    await seed(
        store,
        "jobs",
        {"_id": 1, "phase": "A", **lease(now, "a")},
        {"_id": 2, "phase": "B", "lockedUntil": EPOCH},
    )
    before = await read(store, "jobs", {"_id": 2})

    async def found(at: datetime, *phases: str) -> frozenset[int]:
        answer = await store.probe([("jobs", [({"phase": p}, None) for p in phases])], at, HORIZON)
        return answer.ready

    assert await found(now, "A") == frozenset()
    assert await found(now, "A", "B") == {1}
    assert await read(store, "jobs", {"_id": 2}) == before
    assert await found(now + timedelta(minutes=1), "A") == {0}


async def test_one_probe_covers_every_collection_and_says_when_work_comes_due(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    soon, later = now + timedelta(seconds=3), now + timedelta(seconds=9)
    await seed(store, "jobs", {"_id": 1, "phase": "A", "lockedUntil": later})
    await seed(store, "mail", {"_id": 2, "phase": "M", "lockedUntil": soon})
    await seed(store, "keys", {"_id": 3, "phase": "K", "lockedUntil": EPOCH})
    groups = [
        ("jobs", [({"phase": "A"}, None)]),
        ("mail", [({"phase": "M"}, None), ({"phase": "Other"}, None)]),
        ("keys", [({"phase": "K"}, None)]),
    ]
    answer = await store.probe(groups, now, HORIZON)
    assert answer.ready == {3}  # keys.K, the fourth handler
    assert answer.next_due == as_utc(bson_time(soon))
    idle = await store.probe(groups[:1], now, HORIZON)
    assert idle.ready == frozenset() and idle.next_due == as_utc(bson_time(later))
    assert (await store.probe(groups[:1], later, HORIZON)).ready == {0}
    # With the replicas' collection, it counts the live ones (the due wake's odds).
    await seed(
        store,
        "pod.records",
        {"_id": "r1", "expiresAt": later},
        {"_id": "r2", "expiresAt": now - timedelta(seconds=1)},
    )
    counted = await store.probe(groups[:1], now, HORIZON, None, "pod.records")
    assert counted.live == 1 and counted.pauses is None


async def test_a_probe_asks_nothing_of_handlers_known_to_have_work_but_their_due_times(
    backend: Backend, clock: FakeClock
) -> None:
    """A busy replica's handlers whose claims keep taking documents are not asked again:
    never in the answer, though their documents are there; when their documents come due
    is still read, and so are the pauses and the live replicas."""
    store = backend.open()
    now = clock.now()
    soon = now + timedelta(seconds=3)
    await seed(
        store,
        "jobs",
        {"_id": 1, "phase": "A", "lockedUntil": EPOCH},
        {"_id": 2, "phase": "B", "lockedUntil": EPOCH},
        {"_id": 3, "phase": "A", "lockedUntil": soon},
    )
    await seed(store, "mail", {"_id": 4, "phase": "M", "lockedUntil": EPOCH})
    await seed(store, "pod.records", {"_id": "r1", "expiresAt": soon})
    groups = [
        ("jobs", [({"phase": "A"}, None), ({"phase": "B"}, None)]),
        ("mail", [({"phase": "M"}, None)]),
    ]
    asked = await store.probe(groups, now, HORIZON, None, "pod.records", known=frozenset({0}))
    assert asked.ready == {1, 2} and asked.next_due == as_utc(bson_time(soon))
    assert asked.live == 1
    every = frozenset({0, 1, 2})
    none_asked = await store.probe(groups, now, HORIZON, None, "pod.records", known=every)
    assert none_asked.ready == frozenset()
    assert none_asked.next_due == as_utc(bson_time(soon)) and none_asked.live == 1


# -- the slots of cluster-wide limits ----------------------------------------------------------

SLOTS = "orchestrator.slots"


def take_update(now: datetime, token: str, seconds: float = 30) -> dict[str, Any]:
    return limit_slots.take_slot_update(token, now + timedelta(seconds=seconds), "pod-1", now)


async def test_each_free_slot_is_taken_by_one_taker_at_a_time(
    backend: Backend, clock: FakeClock
) -> None:
    now = clock.now()
    limit = Limit(LimitKind.GLOBAL, 3)
    rivals = [backend.open() for _ in range(3)]  # replicas making the slots at once, too

    async def take(n: int) -> Any:
        store = rivals[n % len(rivals)]
        return await store.take_slot(SLOTS, "k", limit, now, take_update(now, f"t{n}"))

    results = await asyncio.gather(*(take(n) for n in range(8)))
    taken = sorted(doc["_id"] for doc in results if doc is not None)
    assert taken == ["k/global/0", "k/global/1", "k/global/2"], "each slot taken once"
    assert all(doc["token"] is None and doc["until"] == as_utc(EPOCH) for doc in results if doc)
    store = rivals[0]
    first = await read(store, SLOTS, {"_id": "k/global/0"})
    assert first is not None and first["handler"] == "k" and first["n"] == 0
    assert as_utc(first["until"]) == as_utc(bson_time(now + timedelta(seconds=30)))
    free = limit_slots.free_slot_update()
    assert await store.write(SLOTS, limit_slots.slot_fence("k/global/0", "stale"), free) is False
    assert await store.write(SLOTS, limit_slots.slot_fence("k/global/0", first["token"]), free)
    again = await take(9)
    assert again is not None and again["_id"] == "k/global/0" and again["token"] is None
    # Taken back after it expired: the slot as its last holder left it.
    later = now + timedelta(seconds=31)
    expired = await store.take_slot(SLOTS, "k", limit, later, take_update(later, "t10"))
    assert expired is not None and expired["token"] in {f"t{n}" for n in range(10)}
    assert as_utc(expired["until"]) == as_utc(bson_time(now + timedelta(seconds=30)))
    # Made again by another store (a replica starting): the slots are kept as they are.
    await backend.open().ensure_slots(SLOTS, "k", limit)
    docs = await read_all(store.collection(SLOTS).find({"handler": "k"}))
    assert len(docs) == 3 and all(d["token"] is not None for d in docs)


async def test_a_rate_slot_given_back_is_as_it_was_and_the_next_free_one_is_known(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    limit = Limit(LimitKind.RATE, 2, "minute")
    assert await store.next_slot(SLOTS, "r", limit) is None  # no slot made yet
    first = await store.take_slot(SLOTS, "r", limit, now, take_update(now, "a", 60))
    second = await store.take_slot(SLOTS, "r", limit, now, take_update(now, "b", 60))
    assert first is not None and second is not None
    assert await store.take_slot(SLOTS, "r", limit, now, take_update(now, "c", 60)) is None
    assert await store.next_slot(SLOTS, "r", limit) == as_utc(
        bson_time(now + timedelta(seconds=60))
    )
    # "b" found no document: its slot is given back, as it was before its take.
    restore = limit_slots.restore_slot_update(second["until"], second["token"])
    assert await store.write(SLOTS, limit_slots.slot_fence(second["_id"], "b"), restore)
    assert await store.next_slot(SLOTS, "r", limit) == as_utc(EPOCH)
    third = await store.take_slot(SLOTS, "r", limit, now, take_update(now, "d", 60))
    assert third is not None and third["_id"] == second["_id"]
    # A limit of another count uses its own first slots only.
    one = Limit(LimitKind.RATE, 1, "minute")
    assert await store.take_slot(SLOTS, "r", one, now, take_update(now, "e", 60)) is None


# -- fenced writes -----------------------------------------------------------------------------


async def test_a_fenced_write_lands_only_under_its_lease(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Q", **lease(now, "mine")})
    assert await store.write("jobs", lease_writes.fenced(1, "mine"), {"$set": {"x": 1}}) is True
    assert await store.write("jobs", lease_writes.fenced(1, "stale"), {"$set": {"x": 2}}) is False
    assert (
        await store.write("jobs", lease_writes.fenced(1, "mine", "R"), {"$set": {"x": 3}}) is False
    )
    assert (
        await store.write("jobs", lease_writes.fenced(1, "mine", "Q"), {"$set": {"y": 4}}) is True
    )
    assert await store.write("jobs", lease_writes.fenced(2, "mine"), {"$set": {"x": 5}}) is False
    doc = await read(store, "jobs", {"_id": 1})
    assert doc is not None and (doc["x"], doc["y"]) == (1, 4)


async def test_a_fenced_delete_matches_only_the_lease_s_token_and_phase(
    backend: Backend, clock: FakeClock
) -> None:
    """A delete carries the lease's fence: a stale token, or a phase changed from outside
    (the API cancelling a deletion), matches nothing and the document is kept."""
    store = backend.open()
    now = clock.now()
    await seed(
        store,
        "jobs",
        {"_id": 1, "phase": "Deleting", **lease(now, "mine")},
        {"_id": 2, "phase": "Deleting", **lease(now, "b")},
        {"_id": 3, "phase": "Cancelled", **lease(now, "mine")},
    )
    assert await store.delete("jobs", lease_writes.fenced(2, "mine", "Deleting")) is False
    assert await store.delete("jobs", lease_writes.fenced(3, "mine", "Deleting")) is False
    assert await store.delete("jobs", lease_writes.fenced(1, "mine", "Deleting")) is True
    assert await read(store, "jobs", {"_id": 1}) is None
    assert await read(store, "jobs", {"_id": 2}) is not None
    assert await read(store, "jobs", {"_id": 3}) is not None


async def test_an_operator_update_is_not_fenced_and_returns_the_document_after(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    reports = backend.reports(store.database)
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Failed", **lease(now, "held")})
    doc = await reports.operator_update(
        "jobs", {"_id": 1}, operators.operator_move_update("Q", now)
    )
    assert doc is not None and doc["phase"] == "Q" and "lockToken" not in doc
    assert await reports.operator_update("jobs", {"_id": 2}, {"$set": {"x": 1}}) is None
    assert await store.write("jobs", lease_writes.fenced(1, "held"), {"$set": {"x": 1}}) is False


# -- documents ---------------------------------------------------------------------------------


async def test_insert_without_unique_keys_stores_each_document(backend: Backend) -> None:
    store = backend.open()
    first = await store.insert("jobs", {"phase": "Q", "n": 1}, ())
    second = await store.insert("jobs", {"phase": "Q", "n": 1}, ())
    assert first["_id"] != second["_id"]
    assert await read(store, "jobs", {"_id": second["_id"]}) == second


async def test_insert_is_idempotent_by_its_unique_keys(backend: Backend) -> None:
    store = backend.open()
    first = await store.insert("jobs", {"name": "a", "phase": "Q", "n": 1}, ("name",))
    again = await store.insert("jobs", {"name": "a", "phase": "R", "n": 2}, ("name",))
    assert again == first and (again["phase"], again["n"]) == ("Q", 1)
    info = await resolve(store.collection("jobs").index_information())
    assert info["orchestrator_unique_name"].get("unique") is True
    by_id = await store.insert("jobs", {"_id": "x", "phase": "Q"}, ("_id",))
    assert await store.insert("jobs", {"_id": "x", "phase": "R"}, ("_id",)) == by_id


async def test_concurrent_submits_of_one_key_make_one_document(backend: Backend) -> None:
    stores = [backend.open() for _ in range(4)]  # each store makes the unique index once

    async def submit(n: int) -> Any:
        return await stores[n % 4].insert("jobs", {"name": "a", "n": n}, ("name",))

    results = await asyncio.gather(*(submit(n) for n in range(12)))
    assert len({doc["_id"] for doc in results}) == 1
    assert len(await read_all(stores[0].collection("jobs").find({"name": "a"}))) == 1


async def test_a_submit_retried_after_a_lost_reply_returns_the_document_it_made(
    backend: Backend,
) -> None:
    faults = Faults()
    store = backend.open(faults=faults)
    faults.fail_next("find_one_and_update", applied=True)
    with pytest.raises(StoreError) as lost:
        await store.insert("jobs", {"name": "a", "n": 1}, ("name",))
    assert lost.value.transient
    retried = await store.insert("jobs", {"name": "a", "n": 1}, ("name",))
    assert retried["n"] == 1
    assert len(await read_all(store.collection("jobs").find({}))) == 1


async def test_a_unique_index_over_duplicates_is_refused_with_the_reason(
    backend: Backend,
) -> None:
    store = backend.open()
    await seed(store, "jobs", {"name": "a"}, {"name": "a"})
    with pytest.raises(ConfigError, match=r"same \(name\).*duplicates"):
        await store.insert("jobs", {"name": "a"}, ("name",))


# -- indexes -----------------------------------------------------------------------------------


async def index_keys(store: Any, name: str) -> dict[str, list[tuple[str, Any]]]:
    info = await resolve(store.collection(name).index_information())
    return {index: spec["key"] for index, spec in info.items()}


async def test_the_claim_index_is_made_once(backend: Backend) -> None:
    store = backend.open()
    assert await store.ensure_claim_index("jobs") == CLAIM_INDEX_NAME
    assert await backend.open().ensure_claim_index("jobs") == CLAIM_INDEX_NAME
    keys = await index_keys(store, "jobs")
    assert keys == {"_id_": [("_id", 1)], CLAIM_INDEX_NAME: claims.CLAIM_INDEX}


async def test_an_equivalent_index_is_reused_whatever_its_name(backend: Backend) -> None:
    store = backend.open()
    jobs = store.collection("jobs")
    await resolve(jobs.create_index(claims.CLAIM_INDEX, name="app_claim"))
    await resolve(jobs.create_index([("zone", -1), ("host", 1)], unique=True, name="app_host"))
    assert await store.ensure_claim_index("jobs") == "app_claim"
    await store.insert("jobs", {"host": "h", "zone": "z"}, ("host", "zone"))
    assert set(await index_keys(store, "jobs")) == {"_id_", "app_claim", "app_host"}


async def test_an_index_on_the_keys_that_cannot_do_the_job_is_refused_by_name(
    backend: Backend,
) -> None:
    store = backend.open()
    jobs = store.collection("jobs")
    await resolve(jobs.create_index(claims.CLAIM_INDEX, name="sparse_claim", sparse=True))
    await resolve(jobs.create_index([("name", 1)], name="name_lookup"))
    with pytest.raises(ConfigError, match=r"'sparse_claim'.*is sparse"):
        await store.ensure_claim_index("jobs")
    with pytest.raises(ConfigError, match=r"'name_lookup'.*is not unique"):
        await store.insert("jobs", {"name": "a"}, ("name",))
    assert await read_all(jobs.find({})) == []


EARLIER_CLAIM_INDEXES = [
    [("phase", 1), ("lockedAt", 1)],
    [("phase", 1), ("lockedUntil", 1), ("updatedAt", 1)],
    [("phase", 1), ("lockedUntil", 1), ("updatedAt", 1), ("_id", 1)],  # before priorities
]


@pytest.mark.parametrize(
    "earlier", EARLIER_CLAIM_INDEXES, ids=["lockedAt", "no _id", "no priority"]
)
async def test_an_earlier_versions_index_of_the_same_name_is_replaced(
    backend: Backend, earlier: list[tuple[str, int]]
) -> None:
    store = backend.open()
    await resolve(store.collection("jobs").create_index(earlier, name=CLAIM_INDEX_NAME))
    assert await store.ensure_claim_index("jobs") == CLAIM_INDEX_NAME
    keys = await index_keys(store, "jobs")
    assert keys[CLAIM_INDEX_NAME] == claims.CLAIM_INDEX
    assert len(keys) == 2  # replaced, not added beside it


# -- errors ------------------------------------------------------------------------------------


async def test_driver_errors_leave_as_store_errors_that_say_whether_to_retry(
    backend: Backend, clock: FakeClock
) -> None:
    faults = Faults(clock=clock)
    store = backend.open(faults=faults)
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Q", **lease(now, "t")})

    faults.fail_next("find_one_and_update", AutoReconnect("connection reset"))
    with pytest.raises(StoreError, match="claim on jobs failed") as reset:
        await store.claim(
            "jobs", claims.ClaimRequest({"phase": "Q"}, now, HORIZON, {"$set": {"x": 1}})
        )
    assert reset.value.transient and isinstance(reset.value.__cause__, AutoReconnect)

    faults.fail_next("update_one", OperationFailure("not authorized", 13))
    with pytest.raises(StoreError, match="not authorized") as refused:
        await store.write("jobs", lease_writes.fenced(1, "t"), {"$set": {"x": 1}})
    assert not refused.value.transient

    timeout = WTimeoutError("waiting for replication timed out", 64, {"errInfo": {}})
    faults.fail_next("update_one", timeout, applied=True)
    with pytest.raises(StoreError, match="no majority acknowledged") as unacknowledged:
        await store.write("jobs", lease_writes.fenced(1, "t"), {"$set": {"y": 1}})
    assert unacknowledged.value.transient

    faults.cut_off(60)
    reports = backend.reports(store.database)
    with pytest.raises(StoreError, match="read from jobs") as outage:
        await reports.find_one("jobs", {"_id": 1})
    assert outage.value.transient
    faults.silence()
    doc = await reports.find_one("jobs", {"_id": 1})
    assert doc is not None and doc["y"] == 1, "the timed-out write applied on the primary"


async def test_a_document_refused_as_over_16_mib_is_a_document_too_large_error(
    backend: Backend, clock: FakeClock
) -> None:
    """Whoever refuses it (pymongo before sending, the server for an update's result:
    17419), the store says so in one error; the refusal itself is injected, as the
    server decides it, not the store (the in-memory server's own is tested with it)."""
    faults = Faults()
    store = backend.open(faults=faults)
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Q", **lease(now, "t")})
    message = "Resulting document after update is larger than 16777216"
    faults.fail_next("update_one", WriteError(message, 17419, {"code": 17419}))
    with pytest.raises(DocumentTooLarge, match="write to jobs/1 refused"):
        await store.write("jobs", lease_writes.fenced(1, "t"), {"$set": {"blob": "x"}})
    faults.fail_next("find_one_and_update", OperationFailure(message, 17419))
    with pytest.raises(DocumentTooLarge, match="update jobs refused"):
        await backend.reports(store.database).operator_update(
            "jobs", {"_id": 1}, {"$set": {"blob": "x"}}
        )
    faults.fail_next("insert_one", DriverDocumentTooLarge("BSON document too large"))
    with pytest.raises(DocumentTooLarge, match="insert into jobs refused"):
        await store.insert("jobs", {"name": "big"}, ())
    doc = await read(store, "jobs", {"_id": 1})
    assert doc is not None and "blob" not in doc


async def test_a_value_bson_cannot_encode_is_a_store_error(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(StoreError, match="insert into jobs failed") as bad:
        await store.insert("jobs", {"phase": "Q", "handler": object()}, ())
    assert not bad.value.transient


async def test_a_write_no_majority_acknowledges_fails_at_the_write_timeout(
    backend: Backend, clock: FakeClock
) -> None:
    if backend.real:
        pytest.skip("a real server's majority cannot be taken away from a test")
    db = backend.database()
    store = backend.open(db=db, write_timeout=2.5)
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Q", **lease(now, "t")})
    db.replication.lose_majority()
    with pytest.raises(StoreError, match="no majority acknowledged") as lost:
        await store.write("jobs", lease_writes.fenced(1, "t"), {"$set": {"x": 1}})
    assert lost.value.transient
    assert db.replication.timed_out == 1
    db.replication.restore_majority()
    assert await store.write("jobs", lease_writes.fenced(1, "t"), {"$set": {"x": 2}}) is True


async def test_a_store_refuses_a_bad_database_name_or_write_timeout(backend: Backend) -> None:
    if backend.real:
        pytest.skip("the checks run before any I/O; the in-memory databases show them")
    kind = AsyncStore if backend.is_async else Store
    db = backend.database()
    with pytest.raises(ConfigError, match="write_timeout"):
        kind(db, write_timeout=0)
    with pytest.raises(ConfigError, match="invalid database name"):
        kind(db.client["bad.name"])


# -- the server's clock ----------------------------------------------------------------------


async def test_server_time_is_the_servers_clock_in_aware_utc(
    backend: Backend, clock: FakeClock
) -> None:
    now = await backend.open().server_time()
    assert now is not None and now.tzinfo is UTC
    if not backend.real:
        assert now == clock.now().replace(microsecond=clock.now().microsecond // 1000 * 1000)


async def test_server_time_is_none_when_the_server_gives_none(backend: Backend) -> None:
    assert await backend.open(server_time=False).server_time() is None


async def test_server_time_falls_back_to_is_master_once_and_for_all(
    backend: Backend, clock: FakeClock
) -> None:
    faults = Faults()
    store = backend.open(faults=faults, hello=False)
    assert await store.server_time() == bson_time(clock.now()).replace(tzinfo=UTC)
    assert faults.operations["command"] == 2  # hello refused, then isMaster
    await store.server_time()
    assert faults.operations["command"] == 3  # isMaster only, from then on


async def test_a_server_older_than_the_minimum_is_refused(backend: Backend) -> None:
    store = backend.open(wire_version=8)
    with pytest.raises(StoreError, match=f"MongoDB {MIN_SERVER_VERSION} or newer.*4.2"):
        await store.server_time()


@pytest.mark.parametrize(
    "codec",
    [
        CodecOptions(tz_aware=False),
        CodecOptions(tz_aware=True),
        CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS),
    ],
    ids=["naive", "aware", "datetime-ms"],
)
async def test_dates_come_back_aware_utc_whatever_the_clients_codec_options(
    backend: Backend, clock: FakeClock, codec: CodecOptions[Any]
) -> None:
    store = backend.open(codec_options=codec)
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "Q", **lease(now, "t")})
    stored = await read(store, "jobs", {"_id": 1})
    reported = await backend.reports(store.database).find_one("jobs", {"_id": 1})
    for read_back in (stored, reported):
        assert read_back is not None
        assert read_back["lockedUntil"] == bson_time(now + timedelta(seconds=30)).replace(
            tzinfo=UTC
        )
        assert read_back["lockedUntil"].tzinfo is UTC


# -- operators ---------------------------------------------------------------------------------


async def test_phase_summary_counts_each_phase_by_lease_state(
    backend: Backend, clock: FakeClock
) -> None:
    """Retrying (an error, tried again) and failed (a handler gave up: ``failedBy``) are
    counted apart (before: one ``failed`` count of every document carrying an error)."""
    store = backend.open()
    now = clock.now()
    error = lease_writes.error_record("ValueError", "bad", now, "Q")
    await seed(
        store,
        "jobs",
        {"phase": "Q", **lease(now, "a")},
        {"phase": "Q", **lease(now - timedelta(minutes=5), "b")},
        {"phase": "Q", "lockedUntil": bson_time(now + timedelta(seconds=9))},
        {"phase": "Q", "lockedUntil": EPOCH, "lastError": error},
        {"phase": "Done", "lockedUntil": EPOCH},
        {"phase": "Failed", "lockedUntil": EPOCH, "lastError": error, "failedBy": "jobs/Q/h"},
    )
    rows = await backend.reports(store.database).phase_summary("jobs", now)
    none = {"leased": 0, "overdue": 0, "waiting": 0}
    assert sorted(rows, key=lambda row: row.phase) == [
        PhaseCount("jobs", "Done", count=1, **none, retrying=0, failed=0),
        PhaseCount("jobs", "Failed", count=1, **none, retrying=0, failed=1),
        PhaseCount("jobs", "Q", count=4, leased=1, overdue=1, waiting=1, retrying=1, failed=0),
    ]


async def test_latest_errors_are_the_newest_first_as_a_report_shows_them(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open()
    now = clock.now()
    await seed(
        store,
        "jobs",
        *(
            {
                "_id": n,
                "phase": "Q",
                "attempts": n,
                "payload": "large",
                "lastError": lease_writes.error_record(
                    "E", f"e{n}", now + timedelta(seconds=n), "Q"
                ),
            }
            for n in range(4)
        ),
        {"_id": 9, "phase": "Q"},
    )
    await resolve(store.ensure_errors_index("jobs"))
    errors = await backend.reports(store.database).latest_errors("jobs", 3, ["Q"])
    assert [(e.id, e.ref, e.attempts, e.message) for e in errors] == [
        (str(n), f'{{"$numberInt": "{n}"}}', n, f"e{n}") for n in (3, 2, 1)
    ]
    at = as_utc(bson_time(now + timedelta(seconds=3)))
    assert errors[0] == RecentError("jobs", "3", '{"$numberInt": "3"}', "Q", 3, "E", "e3", at)


async def test_collection_names_are_sorted_without_the_servers_own_and_drop_removes_one(
    backend: Backend,
) -> None:
    store = backend.open()
    reports = backend.reports(store.database)
    await seed(store, "b", {"x": 1})
    await seed(store, "a", {"x": 1})
    assert await reports.collection_names() == ["a", "b"]
    await store.drop("b")
    assert await reports.collection_names() == ["a"]


async def test_after_a_drop_the_next_submit_makes_the_unique_index_again(backend: Backend) -> None:
    store = backend.open()
    await store.insert("jobs", {"name": "a"}, ("name",))
    await store.drop("jobs")
    await store.insert("jobs", {"name": "a"}, ("name",))
    assert "orchestrator_unique_name" in await index_keys(store, "jobs")


# -- connect -----------------------------------------------------------------------------------

CONNECTS: list[Callable[..., Any]] = [connect, connect_async]


@pytest.mark.parametrize("open_database", CONNECTS, ids=["connect", "connect_async"])
async def test_connect_refuses_a_bad_uri_and_an_unreachable_server_with_the_reason(
    open_database: Callable[..., Any],
) -> None:
    with pytest.raises(StoreError, match="invalid MongoDB URI"):
        await resolve(open_database("mongodb://localhost:port/"))
    with pytest.raises(StoreError, match="cannot reach MongoDB at") as unreachable:
        await resolve(open_database("mongodb://127.0.0.1:9/", "orchestrator", timeout=0.1))
    assert unreachable.value.transient


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set")
@pytest.mark.parametrize("open_database", CONNECTS, ids=["connect", "connect_async"])
async def test_connect_gives_the_named_database_of_a_reachable_server(
    open_database: Callable[..., Any],
) -> None:
    db = await resolve(open_database(MONGODB_URI, "orchestrator_connect", timeout=5))
    try:
        assert db.name == "orchestrator_connect"
    finally:
        await resolve(db.client.close())


def test_a_server_without_union_with_is_probed_per_collection_from_then_on() -> None:
    """Before 4.4 (and on servers that lack the stage) the probe falls back to one read per
    collection, found by the server's refusal once, not at every tick."""
    db = memory_database()
    db["jobs"].insert_one({"_id": 1, "phase": "A", "lockedUntil": EPOCH})
    store = Store(db)
    refused = []
    read: list[str] = []
    original = store.collection

    class NoUnion:
        def __init__(self, coll: Any) -> None:
            self._coll = coll

        def aggregate(self, pipeline: Any) -> Any:
            refused.append(pipeline)
            raise OperationFailure("Unrecognized pipeline stage name: '$unionWith'", 40324)

        def find_one(self, *args: Any, **kwargs: Any) -> Any:
            read.append(self._coll.name)
            return self._coll.find_one(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._coll, name)

    store.collection = lambda name: NoUnion(original(name))  # type: ignore[method-assign]
    now = datetime.now(UTC)
    groups = [("jobs", [({"phase": "A"}, None)]), ("mail", [({"phase": "M"}, None)])]
    for _ in range(3):
        answer = store.probe(groups, now, HORIZON)
        assert answer.ready == {0} and answer.next_due is None
    assert len(refused) == 1
    read.clear()  # a collection whose handlers are all known to have work is not read
    assert store.probe(groups, now, HORIZON, known=frozenset({0})).ready == frozenset()
    assert read == ["mail"]


async def test_a_probe_of_hundreds_of_handlers_is_read_in_parts_numbered_as_one(
    backend: Backend, clock: FakeClock
) -> None:
    """MongoDB takes at most 1,000 stages in a pipeline: past ``PROBE_BRANCHES`` handlers
    the probe is read in parts, its answer the same."""
    store = backend.open()
    now = clock.now()
    await seed(store, "jobs", {"_id": 1, "phase": "P349", "lockedUntil": EPOCH})
    await seed(store, "mail", {"_id": 2, "phase": "M", "lockedUntil": now + timedelta(seconds=3)})
    many = [({"phase": f"P{n}"}, None) for n in range(claims.PROBE_BRANCHES + 50)]
    groups = [("jobs", many), ("mail", [({"phase": "M"}, None)])]
    assert [sum(len(m) for _, m in c) for c in claims.probe_chunks(groups)] == [300, 51]
    answer = await store.probe(groups, now, HORIZON)
    assert answer.ready == {349}
    assert answer.next_due == as_utc(bson_time(now + timedelta(seconds=3)))
