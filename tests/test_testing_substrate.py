"""The test substrate itself: FakeClock, and an in-memory database that is linearizable."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast

import pytest
from pymongo import ReturnDocument, WriteConcern
from pymongo.collection import Collection
from pymongo.errors import DuplicateKeyError, InvalidOperation

from orchestrator import Orchestrator
from orchestrator.core.clock import SystemClock
from orchestrator.testing import FakeClock, memory_database
from orchestrator.testing.faults import Faults

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
START = datetime(2026, 1, 1, tzinfo=UTC)

Document = dict[str, Any]


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads very often, so an unsafe find-then-update would interleave."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def run_threads(count: int, target: Callable[[int], None]) -> None:
    """Run ``target(index)`` in ``count`` threads released together; re-raise any failure."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            barrier.wait()
            target(index)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def claim_all(jobs: Collection[Document], threads: int, now: datetime) -> dict[int, list[Any]]:
    """Every thread claims expired documents until none is left; returns ids per thread."""
    cutoff = datetime(2000, 1, 1, tzinfo=UTC)
    claimed: dict[int, list[Any]] = {i: [] for i in range(threads)}

    def replica(index: int) -> None:
        while True:
            document = jobs.find_one_and_update(
                {"lockedAt": {"$lt": cutoff}},
                {"$set": {"lockedAt": now, "owner": index}},
                sort=[("lockedAt", 1)],
                return_document=ReturnDocument.AFTER,
            )
            if document is None:
                return
            assert document["owner"] == index
            claimed[index].append(document["_id"])

    run_threads(threads, replica)
    return claimed


def assert_claimed_once(jobs: Collection[Document], claimed: dict[int, list[Any]]) -> None:
    counts = Counter(doc_id for ids in claimed.values() for doc_id in ids)
    assert sum(counts.values()) == 300
    assert len(counts) == 300
    assert set(counts.values()) == {1}
    owners = {doc["_id"]: doc["owner"] for doc in jobs.find({}, {"owner": 1})}
    assert owners == {doc_id: index for index, ids in claimed.items() for doc_id in ids}


# --- linearizability -----------------------------------------------------------------------


@pytest.mark.usefixtures("busy_switching")
@pytest.mark.parametrize("round_", range(3))
def test_concurrent_claims_take_each_document_once(round_: int) -> None:
    clock = FakeClock()
    db = memory_database(clock=clock)
    jobs = db["jobs"]
    jobs.insert_many([{"_id": i, "lockedAt": EPOCH, "n": round_} for i in range(300)])

    claimed = claim_all(jobs, threads=8, now=clock.now())

    assert_claimed_once(jobs, claimed)
    assert jobs.count_documents({"lockedAt": {"$lt": datetime(2000, 1, 1, tzinfo=UTC)}}) == 0


@pytest.mark.usefixtures("busy_switching")
def test_with_options_collection_shares_the_lock() -> None:
    db = memory_database()
    plain = db["jobs"]
    majority = plain.with_options(write_concern=WriteConcern("majority"))
    assert majority.write_concern == WriteConcern("majority")
    assert majority.name == "jobs"
    assert majority.full_name == "orchestrator.jobs"
    plain.insert_many([{"_id": i, "lockedAt": EPOCH} for i in range(300)])

    # Half the replicas go through the majority view, half through the plain collection.
    claimed: dict[int, list[Any]] = {i: [] for i in range(8)}
    cutoff = datetime(2000, 1, 1, tzinfo=UTC)

    def replica(index: int) -> None:
        jobs = majority if index % 2 else plain
        while document := jobs.find_one_and_update(
            {"lockedAt": {"$lt": cutoff}},
            {"$set": {"lockedAt": START, "owner": index}},
            sort=[("lockedAt", 1)],
            return_document=ReturnDocument.AFTER,
        ):
            claimed[index].append(document["_id"])

    run_threads(8, replica)
    assert_claimed_once(plain, claimed)


@pytest.mark.usefixtures("busy_switching")
def test_concurrent_upserts_make_one_document() -> None:
    db = memory_database()
    keys = db["keys"]
    keys.create_index("key", unique=True)
    results: list[Document] = []

    def client(index: int) -> None:
        query = {"key": "only"}
        update = {"$setOnInsert": {"createdBy": index}}
        try:
            document = keys.find_one_and_update(
                query, update, upsert=True, return_document=ReturnDocument.AFTER
            )
        except DuplicateKeyError:
            # Another upsert inserted first: a real client retries, and now finds it.
            document = keys.find_one(query)
        assert document is not None
        results.append(document)

    run_threads(16, client)

    assert keys.count_documents({}) == 1
    stored = keys.find_one({"key": "only"})
    assert stored is not None
    assert len(results) == 16
    assert all(document == stored for document in results)


def test_same_client_databases_share_the_lock() -> None:
    db = memory_database("one")
    other = db.client["two"]
    assert other.name == "two"
    assert db.client.get_database("one")["c"].database.name == "one"
    # One lock for the whole client: the proxies all hold the same server state.
    server = cast(Any, db)._server
    assert cast(Any, other)._server is server
    assert cast(Any, db["c"])._server.lock is server.lock


# --- the pymongo-like surface ----------------------------------------------------------------


@pytest.fixture
def numbers() -> Collection[Document]:
    db = memory_database()
    numbers = db["numbers"]
    numbers.insert_many([{"_id": i, "parity": i % 2, "square": i * i} for i in range(10)])
    return numbers


def test_find_sort_skip_limit_projection(numbers: Collection[Document]) -> None:
    cursor = numbers.find({"parity": 0}, {"square": 1, "_id": 0}).sort("_id", -1).skip(1).limit(2)
    assert list(cursor) == [{"square": 36}, {"square": 16}]

    cursor = numbers.find({}, projection={"parity": 0}, sort=[("_id", 1)], skip=8)
    assert next(cursor) == {"_id": 8, "square": 64}
    assert cursor.to_list() == [{"_id": 9, "square": 81}]
    with pytest.raises(StopIteration):
        next(cursor)

    cursor = numbers.find({"_id": {"$gte": 5}}).sort([("parity", 1), ("_id", -1)])
    assert [doc["_id"] for doc in cursor] == [8, 6, 9, 7, 5]
    with pytest.raises(InvalidOperation):
        cursor.limit(1)

    assert numbers.find_one({"square": {"$gt": 50}}, sort=[("square", 1)]) == {
        "_id": 8,
        "parity": 0,
        "square": 64,
    }


def test_find_reads_when_first_iterated(numbers: Collection[Document]) -> None:
    cursor = numbers.find({"parity": 1})
    numbers.delete_many({"_id": {"$gte": 5}})
    assert [doc["_id"] for doc in cursor] == [1, 3]


def test_count_documents_and_update_semantics(numbers: Collection[Document]) -> None:
    assert numbers.count_documents({}) == 10
    assert numbers.count_documents({"parity": 1}) == 5
    assert numbers.count_documents({"_id": {"$lt": 3}}) == 3

    result = numbers.update_one({"_id": 3}, {"$set": {"seen": True}})
    assert (result.matched_count, result.modified_count) == (1, 1)
    result = numbers.update_one({"_id": 3}, {"$set": {"seen": True}})
    assert (result.matched_count, result.modified_count) == (1, 0)
    result = numbers.update_one({"_id": 99}, {"$set": {"seen": True}})
    assert (result.matched_count, result.modified_count, result.upserted_id) == (0, 0, None)
    result = numbers.update_one({"_id": 99}, {"$set": {"seen": True}}, upsert=True)
    assert (result.matched_count, result.upserted_id) == (0, 99)
    assert numbers.count_documents({"seen": True}) == 2


def test_unique_index(numbers: Collection[Document]) -> None:
    name = numbers.create_index("square", unique=True)
    assert name == "square_1"
    info = numbers.index_information()
    assert info["square_1"]["key"] == [("square", 1)]
    assert info["square_1"]["unique"] is True
    assert [index["name"] for index in numbers.list_indexes()] == ["_id_", "square_1"]

    with pytest.raises(DuplicateKeyError):
        numbers.insert_one({"_id": 100, "square": 4})
    with pytest.raises(DuplicateKeyError):
        numbers.update_one({"_id": 101}, {"$set": {"square": 9}}, upsert=True)
    with pytest.raises(DuplicateKeyError):
        numbers.update_one({"_id": 1}, {"$set": {"square": 9}})
    assert numbers.find_one({"_id": 1}) == {"_id": 1, "parity": 1, "square": 1}
    assert numbers.count_documents({}) == 10


def test_database_surface() -> None:
    db = memory_database("app")
    assert db.name == "app"
    db.create_collection("made")
    db["used"].insert_one({"x": 1})
    assert sorted(db.list_collection_names()) == ["made", "used"]
    assert db.used.find_one({}, {"_id": 0}) == {"x": 1}
    assert db.get_collection("used").database.name == "app"
    db.drop_collection("made")
    db.drop_collection(db["used"])
    assert db.list_collection_names() == []
    assert db.command("ping") == {"ok": 1.0}
    assert list(db["none"].aggregate([{"$match": {}}])) == []


def test_each_memory_database_is_independent() -> None:
    first = memory_database()
    second = memory_database()
    first["c"].insert_one({"_id": 1})
    assert second["c"].count_documents({}) == 0
    assert second.list_collection_names() == []


def test_datetimes_come_back_naive_utc_to_the_millisecond() -> None:
    db = memory_database()
    moment = datetime(2026, 1, 1, 2, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    db["c"].insert_one({"_id": 1, "at": moment})
    assert db["c"].find_one({"at": {"$lte": moment}}) == {
        "_id": 1,
        "at": datetime(2026, 1, 1, 0, 0, 0, 123000),
    }


# --- hello and the server's clock -------------------------------------------------------------


@pytest.mark.parametrize("command", ["hello", "isMaster", "ismaster", {"hello": 1}])
def test_hello_reports_the_clock(command: str | dict[str, int]) -> None:
    clock = FakeClock(datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC))
    db = memory_database(clock=clock)

    reply = db.command(command)
    assert reply["ok"] == 1.0
    assert reply["isWritablePrimary"] is True
    assert reply["ismaster"] is True
    assert reply["maxWireVersion"] == 21
    assert reply["localTime"] == datetime(2026, 3, 4, 5, 6, 7, 891000)
    assert reply["localTime"].tzinfo is None

    clock.advance(90.5)
    assert db.command(command)["localTime"] == datetime(2026, 3, 4, 5, 7, 38, 391000)
    assert db.client.admin.command(command)["localTime"] == datetime(2026, 3, 4, 5, 7, 38, 391000)


def test_hello_without_server_time() -> None:
    db = memory_database(clock=FakeClock(), server_time=False)
    reply = db.command("hello")
    assert "localTime" not in reply
    assert reply["ok"] == 1.0


def test_the_clock_is_attached() -> None:
    assert isinstance(cast(Any, memory_database()).clock, SystemClock)
    clock = FakeClock()
    assert cast(Any, memory_database(clock=clock)).clock is clock


def test_skewed_clock_answers_hello() -> None:
    clock = FakeClock()
    db = memory_database(clock=clock.skewed(20))
    assert db.command("hello")["localTime"] == datetime(2026, 1, 1, 0, 0, 20)


# --- FakeClock ---------------------------------------------------------------------------------


def test_fake_clock_defaults_and_advance() -> None:
    clock = FakeClock()
    assert clock.now() == START
    assert clock.now().tzinfo is UTC
    assert clock.monotonic() == 0.0

    clock.advance(1.5)
    clock.advance(0)
    assert clock.now() == START + timedelta(seconds=1.5)
    assert clock.monotonic() == 1.5


@pytest.mark.parametrize("seconds", [-1.0, -1e-9, float("nan"), float("inf"), float("-inf")])
def test_fake_clock_refuses_bad_advances(seconds: float) -> None:
    clock = FakeClock()
    with pytest.raises(ValueError):
        clock.advance(seconds)
    assert clock.now() == START
    assert clock.monotonic() == 0.0


def test_fake_clock_start() -> None:
    naive = FakeClock(datetime(2030, 5, 6, 7, 8, 9))
    assert naive.now() == datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert naive.now().tzinfo is UTC

    offset = FakeClock(datetime(2030, 5, 6, 9, 8, 9, tzinfo=timezone(timedelta(hours=2))))
    assert offset.now() == datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert offset.now().tzinfo is UTC


def test_skewed_views_move_with_the_base() -> None:
    clock = FakeClock()
    ahead = clock.skewed(20)
    behind = clock.skewed(-5.5)
    assert ahead.now() == START + timedelta(seconds=20)
    assert behind.now() == START - timedelta(seconds=5.5)
    assert ahead.monotonic() == behind.monotonic() == clock.monotonic() == 0.0

    clock.advance(10)
    assert ahead.now() == START + timedelta(seconds=30)
    assert behind.now() == START + timedelta(seconds=4.5)
    assert ahead.monotonic() == behind.monotonic() == 10.0

    with pytest.raises(ValueError):
        clock.skewed(float("nan"))


def test_step_wall_moves_wall_time_alone_either_way() -> None:
    clock = FakeClock()
    view = clock.skewed(0)
    clock.step_wall(-30)  # the whole clock: every view steps with it
    assert clock.now() == view.now() == START - timedelta(seconds=30)
    view.step_wall(45)  # one machine's clock: the base does not move
    assert view.now() == START + timedelta(seconds=15)
    assert clock.now() == START - timedelta(seconds=30)
    assert clock.monotonic() == view.monotonic() == 0.0
    clock.advance(10)
    assert view.now() == START + timedelta(seconds=25)
    assert view.monotonic() == 10.0
    with pytest.raises(ValueError):
        view.step_wall(float("inf"))


def test_fake_clock_is_thread_safe() -> None:
    clock = FakeClock()

    def advance(_: int) -> None:
        for _ in range(1000):
            clock.advance(0.25)

    run_threads(8, advance)
    assert clock.monotonic() == 2000.0
    assert clock.now() == START + timedelta(seconds=2000)


# -- the kit checks its options where they are given ----------------------------------------


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"hello": memory_database()}, "hello must be True or False"),
        ({"server_time": "yes"}, "server_time must be True or False"),
        ({"clock": 42}, "clock must be a Clock"),
        ({"wire_version": "21"}, "wire_version must be an int"),
        ({"wire_version": -1}, "wire_version must be a maxWireVersion"),
        ({"name": 7}, "name must be a database name"),
    ],
)
def test_memory_database_refuses_an_option_of_the_wrong_kind_in_one_line(
    options: dict[str, Any], said: str
) -> None:
    """Before the fix ``memory_database(hello=<a database>)`` was accepted, and a replica's
    first ``hello`` raised NotImplementedError (the bool of a database)."""
    with pytest.raises((TypeError, ValueError), match=said) as refused:
        memory_database(**options)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"seed": "zero"}, "seed must be an int"),
        ({"rate": "often"}, "rate must be a probability"),
        ({"rates": ["find"]}, "rates must map operation names"),
        ({"rates": {"fnid": 0.5}}, "unknown operation 'fnid'"),
        ({"slow_seconds": float("nan")}, "slow_seconds must be a finite number"),
        ({"delay": 5}, "delay must be callable"),
        ({"clock": "now"}, "clock must be a Clock"),
    ],
)
def test_faults_refuse_an_option_of_the_wrong_kind_in_one_line(
    options: dict[str, Any], said: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=said):
        Faults(**options)
    with pytest.raises(ValueError, match="seconds must be a finite number"):
        Faults().delay_next("update_one", "5")  # type: ignore[arg-type]


class _Nonsense:
    """A database whose ``hello`` raises what no driver raises."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def command(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("not a server")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_store_that_raises_something_else_fails_the_action_not_the_tick() -> None:
    """Before the fix the worker died with the measurement's action in flight, and
    ``run_once`` waited for it forever. Now each action fails, is logged, and the tick
    ends; nothing is claimed by a clock that was never measured."""
    orch = Orchestrator(_Nonsense(memory_database()))  # type: ignore[arg-type]

    @orch.phase("jobs", "Running")
    def step(lease: Any) -> Any:
        return lease.advance("Done")

    done: list[dict[str, int]] = []
    tick = threading.Thread(target=lambda: done.append(orch.run_once()), daemon=True)
    tick.start()
    tick.join(30)  # a hang guard, not a measured time
    assert done, "run_once hung"
    assert done[0].get("claim_errors", 0) >= 1 and "claimed" not in done[0]
