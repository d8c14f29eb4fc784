"""The async in-memory database: PyMongo's async API over the sync memory proxies, one
history shared with sync code, and faults injected on it as on the sync one."""

from __future__ import annotations

import asyncio
import inspect
import threading
from datetime import timedelta
from typing import Any

import anyio.to_thread
import pytest
from bson.codec_options import CodecOptions
from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import AutoReconnect, OperationFailure, WriteError

from orchestrator import Orchestrator
from orchestrator.core.clock import bson_time
from orchestrator.mongo import AsyncStore, Store
from orchestrator.testing import FakeClock, async_memory_database, async_view, memory_database
from orchestrator.testing.faults import Faults, ReplicaCrashed
from orchestrator.testing.memory import MAX_BSON_SIZE

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_coroutines_are_where_pymongos_async_api_has_them() -> None:
    db = async_memory_database()
    jobs = db.jobs
    for name in ("find_one", "find_one_and_update", "update_one", "insert_one", "aggregate"):
        assert inspect.iscoroutinefunction(getattr(AsyncCollection, name))
        assert inspect.iscoroutinefunction(getattr(jobs, name)), name
    for name in ("command", "list_collection_names", "drop_collection"):
        assert inspect.iscoroutinefunction(getattr(AsyncDatabase, name))
        assert inspect.iscoroutinefunction(getattr(db, name)), name
    assert not inspect.isawaitable(jobs.find({}))  # find gives a cursor at once, as pymongo's


async def test_an_operation_runs_when_awaited_not_when_called() -> None:
    jobs = async_memory_database().jobs
    pending = jobs.insert_one({"_id": 1})
    assert await jobs.count_documents({}) == 0
    await pending
    assert await jobs.count_documents({}) == 1


async def test_cursors_read_with_to_list_async_for_and_next() -> None:
    jobs = async_memory_database().jobs
    await jobs.insert_many([{"_id": n, "rank": -n} for n in range(5)])
    cursor = jobs.find({}, {"rank": 0}).sort("rank", 1).skip(1).limit(3)
    assert await cursor.to_list() == [{"_id": 3}, {"_id": 2}, {"_id": 1}]
    assert [doc["_id"] async for doc in jobs.find({"_id": {"$lt": 2}})] == [0, 1]
    single = jobs.find({"_id": 4})
    assert await single.next() == {"_id": 4, "rank": -4}
    with pytest.raises(StopAsyncIteration):
        await single.next()
    pipeline = [{"$group": {"_id": None, "total": {"$sum": "$rank"}}}]
    assert await (await jobs.aggregate(pipeline)).to_list() == [{"_id": None, "total": -10}]
    indexes = await jobs.list_indexes()
    assert (await indexes.try_next())["name"] == "_id_"
    assert await indexes.try_next() is None
    async with await jobs.database.list_collections() as listing:
        assert [info["name"] async for info in listing] == ["jobs"]


async def test_hello_reports_the_clock_and_the_emulated_server() -> None:
    clock = FakeClock()
    db = async_memory_database(clock=clock, wire_version=13)
    clock.advance(1.2345)
    reply = await db.command("hello")
    assert reply["localTime"] == bson_time(clock.now())
    assert reply["maxWireVersion"] == 13
    assert "localTime" not in await async_memory_database(server_time=False).command("hello")
    with pytest.raises(OperationFailure) as refused:
        await async_memory_database(hello=False).command("hello")
    assert refused.value.code == 59


async def test_it_answers_as_the_sync_memory_server_does() -> None:
    db = async_memory_database(codec_options=CodecOptions(tz_aware=True))
    jobs = db.jobs
    await jobs.create_index([("name", 1)], name="by_name")
    with pytest.raises(OperationFailure) as conflict:
        await jobs.create_index([("name", 1)], name="other")
    assert conflict.value.code == 85
    await jobs.insert_one({"_id": 1, "at": FakeClock().now()})
    with pytest.raises(WriteError) as too_large:
        await jobs.update_one({"_id": 1}, {"$set": {"blob": "x" * MAX_BSON_SIZE}})
    assert too_large.value.code == 17419
    doc = await jobs.find_one({"_id": 1})
    assert doc is not None and doc["at"].tzinfo is not None and "blob" not in doc


async def test_concurrent_tasks_each_find_and_modify_atomically() -> None:
    jobs = async_memory_database().jobs
    await jobs.insert_many([{"_id": n, "owner": None} for n in range(5)])

    async def take(task: int) -> Any:
        return await jobs.find_one_and_update(
            {"owner": None},
            {"$set": {"owner": task}},
            sort=[("_id", 1)],
            return_document=ReturnDocument.AFTER,
        )

    taken = await asyncio.gather(*(take(task) for task in range(12)))
    owned = [doc["_id"] for doc in taken if doc is not None]
    assert sorted(owned) == list(range(5))


async def test_an_async_view_shares_one_history_with_sync_threads() -> None:
    """Sync threads and async tasks claim from one collection at once: each document is
    taken exactly once, whichever side took it."""
    sync = memory_database()
    view = async_view(sync)
    await view.jobs.insert_many([{"_id": n, "owner": None} for n in range(40)])
    start = threading.Event()

    def take_sync(worker: str) -> list[int]:
        start.wait()
        taken = []
        while doc := sync.jobs.find_one_and_update(
            {"owner": None}, {"$set": {"owner": worker}}, sort=[("_id", 1)]
        ):
            taken.append(doc["_id"])
        return taken

    async def take_async(worker: str) -> list[int]:
        taken = []
        while doc := await view.jobs.find_one_and_update(
            {"owner": None}, {"$set": {"owner": worker}}, sort=[("_id", 1)]
        ):
            taken.append(doc["_id"])
        return taken

    threads = [anyio.to_thread.run_sync(take_sync, f"thread-{n}") for n in range(2)]
    tasks = [take_async(f"task-{n}") for n in range(2)]
    start.set()
    results = await asyncio.gather(*threads, *tasks)
    assert sorted(n for taken in results for n in taken) == list(range(40))
    owners = {doc["owner"] for doc in sync.jobs.find({})}
    assert None not in owners


def test_async_view_takes_only_a_memory_database() -> None:
    with pytest.raises(TypeError, match="memory_database"):
        async_view(object())  # type: ignore[arg-type]


async def test_an_async_store_and_a_sync_replica_share_a_memory_database() -> None:
    clock = FakeClock()
    sync = memory_database(clock=clock)
    store = AsyncStore(async_view(sync))
    made = await store.insert("jobs", {"name": "a", "phase": "Created"}, ("name",))
    orch = Orchestrator(sync, replica_id="pod-1", clock=clock, lock_timeout=30, tick=1.0)
    again = orch.submit("jobs", {"name": "a", "phase": "Created"}, unique=["name"])
    assert again["_id"] == made["_id"]
    assert await store.server_time() == Store(sync).server_time() == clock.now()


# -- faults on the async database --------------------------------------------------------------


async def test_faults_fail_an_async_operation_when_it_is_awaited() -> None:
    faults = Faults()
    db = faults.wrap(async_memory_database())
    faults.fail_next("find_one")
    with pytest.raises(AutoReconnect):
        await db.jobs.find_one({})
    assert await db.jobs.find_one({}) is None
    assert faults.operations["find_one"] == 2


async def test_a_lost_reply_on_an_async_write_applies_it_first() -> None:
    faults = Faults()
    db = faults.wrap(async_memory_database())
    faults.fail_next("insert_one", applied=True)
    with pytest.raises(AutoReconnect):
        await db.jobs.insert_one({"_id": 1})
    assert await db.jobs.count_documents({}) == 1


async def test_a_slow_async_reply_takes_the_fake_clocks_time_and_a_crash_stops_all() -> None:
    clock = FakeClock()
    faults = Faults(delay=clock.advance, clock=clock)
    db = faults.wrap(async_memory_database(clock=clock))
    before = clock.now()
    faults.delay_next("update_one", 5)
    await db.jobs.update_one({"_id": 1}, {"$set": {"x": 1}}, upsert=True)
    assert clock.now() - before == timedelta(seconds=5)
    faults.crash_next("find_one", applied=False)
    with pytest.raises(ReplicaCrashed):
        await db.jobs.find_one({})
    with pytest.raises(ReplicaCrashed):
        await db.command("ping")
