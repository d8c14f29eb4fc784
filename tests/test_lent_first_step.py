"""A local submit with a worker free for its document's first phase creates the document
already leased to that worker: the first step runs with no claim (a workflow of n steps
costs n writes), and every guarantee of a claimed lease holds: a replica that dies after
the insert leaves a lease that expires as any other, and an insert whose answer was lost
is confirmed by a fenced renewal before its step runs."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator import AsyncOrchestrator, StoreError
from orchestrator.mongo import AsyncStore
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.faults import Faults, ReplicaCrashed
from tests.conftest import MakeEither
from tests.engines import Replica, new_replica, wait

pytestmark = pytest.mark.anyio

NEXT = {"A": "B", "B": "C", "C": "Done"}
QUIET: dict[str, Any] = {"tick": 3600, "lock_timeout": 3600, "step_timeout": None}
"""A started replica's settings here: its first tick is its only one in the test."""


def workflow(replica: Replica, done: threading.Event, ran: list[str] | None = None) -> None:
    """Three steps, A to B to C to Done; ``done`` is set once C's outcome landed."""
    for phase, following in NEXT.items():

        @replica.phase("jobs", phase)
        async def step(lease: Any, following: str = following) -> Any:
            if ran is not None:
                ran.append(f"{lease.id}:{lease.phase}")
            outcome = await lease.advance(following)
            if following == "Done":
                done.set()
            return outcome


async def faulty(
    mode: str, **options: Any
) -> tuple[Replica, Faults, Any, threading.Event, list[str]]:
    """A started replica of ``mode`` on an in-memory database behind ``Faults``, running
    the workflow: the replica, its faults, the database (unwrapped), the workflow's
    ``done`` and the steps it ran."""
    clock = FakeClock()
    db = memory_database(clock=clock)
    faults = Faults()
    replica = new_replica(
        mode, 0, faults.wrap(db), faults.wrap(async_view(db)), clock, "pod-1", **QUIET, **options
    )
    done = threading.Event()
    ran: list[str] = []
    workflow(replica, done, ran)
    await replica.measure_clock()
    await replica.start()
    return replica, faults, db, done, ran


async def test_a_submit_with_a_free_worker_runs_its_workflow_without_a_claim(
    replicas: MakeEither,
) -> None:
    replica = await replicas("pod-1", **QUIET)
    done = threading.Event()
    workflow(replica, done)
    await replica.start()
    doc = await replica.submit("jobs", {"_id": "job-1", "phase": "A"})
    assert doc["lockedBy"] == "pod-1"
    assert isinstance(doc["lockToken"], str)
    assert await wait(done)
    report = await replica.stop()
    assert report.still_running == []
    stats = replica.stats()
    assert stats.get("claimed", 0) == 0
    assert (stats["lent"], stats["carried"], stats["advanced"]) == (1, 2, 3)


async def test_a_submit_of_an_existing_key_lends_nothing_and_leaves_it_as_it_was(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """The slot taken for it is given back: with four workers, a claim for each of the
    three handlers at most looks for work the submit may have woken, and the next submit
    is lent the fourth."""
    replica = await replicas("pod-1", **QUIET, max_concurrency=4)
    done = threading.Event()
    workflow(replica, done)
    db.jobs.insert_one({"_id": "job-1", "phase": "Elsewhere"})
    await replica.start()
    again = await replica.submit("jobs", {"_id": "job-1", "phase": "A"})
    assert again == {"_id": "job-1", "phase": "Elsewhere"}
    await replica.submit("jobs", {"_id": "job-2", "phase": "A"})
    assert await wait(done)
    await replica.stop()
    assert replica.stats()["lent"] == 1
    assert db.jobs.find_one({"_id": "job-1"}) == {"_id": "job-1", "phase": "Elsewhere"}


@pytest.mark.parametrize("mode", ["threaded", "async"])
async def test_a_submit_whose_answer_was_lost_after_it_landed_runs_once_its_lease_is_confirmed(
    mode: str,
) -> None:
    replica, faults, db, done, ran = await faulty(mode)
    try:
        faults.fail_next("find_one_and_update", applied=True)
        with pytest.raises(StoreError):
            await replica.submit("jobs", {"_id": "job-1", "phase": "A"})
        assert await wait(done)
    finally:
        await replica.stop()
    assert ran == ["job-1:A", "job-1:B", "job-1:C"]
    stats = replica.stats()
    assert (stats["lent"], stats["extended"], stats.get("claimed", 0)) == (1, 1, 0)
    assert db.jobs.find_one({"_id": "job-1"})["phase"] == "Done"  # type: ignore[index]


@pytest.mark.parametrize("mode", ["threaded", "async"])
async def test_a_submit_lost_before_it_landed_runs_nothing_and_frees_its_slot(mode: str) -> None:
    replica, faults, db, done, ran = await faulty(mode, max_concurrency=1)
    try:
        faults.fail_next("find_one_and_update")
        with pytest.raises(StoreError):
            await replica.submit("jobs", {"_id": "job-1", "phase": "A"})
        await replica.submit("jobs", {"_id": "job-2", "phase": "A"})
        assert await wait(done)
    finally:
        await replica.stop()
    assert ran == ["job-2:A", "job-2:B", "job-2:C"]
    assert db.jobs.find_one({"_id": "job-1"}) is None
    stats = replica.stats()
    assert (stats["lost"], stats["advanced"]) == (1, 3)  # one worker: its slot came back


@pytest.mark.parametrize("mode", ["threaded", "async"])
async def test_a_replica_dead_after_the_insert_leaves_a_lease_another_takes_over_on_expiry(
    mode: str, replicas: MakeEither, db: Database[Any], adb: AsyncDatabase[Any], clock: FakeClock
) -> None:
    faults = Faults()
    dying = new_replica(mode, 0, faults.wrap(db), faults.wrap(adb), clock, "pod-dies", **QUIET)
    workflow(dying, threading.Event())
    await dying.measure_clock()
    await dying.start()
    try:
        faults.crash_next("find_one_and_update", applied=True)
        with pytest.raises(ReplicaCrashed):
            await dying.submit("jobs", {"_id": "job-1", "phase": "A"})
        survivor = await replicas("pod-2")
        done = threading.Event()
        workflow(survivor, done)
        assert (await survivor.run_once()).get("advanced", 0) == 0  # held: not expired yet
        clock.advance(3601)
        counts = await survivor.run_once()
        assert (counts["taken_over"], counts["advanced"]) == (1, 3)
        assert done.is_set()
    finally:
        with contextlib.suppress(ReplicaCrashed):  # its every operation fails: it is dead
            await dying.stop(timeout=0)


async def test_submits_of_one_key_racing_on_started_replicas_run_its_workflow_once(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """Sixteen submits of one key from four started replicas: one document, created by one
    of them (leased or not), whose workflow runs once; every slot a lend took comes back."""
    fleet = [await replicas(f"pod-{n}", **QUIET) for n in range(4)]
    done = threading.Event()
    ran: list[str] = []
    for replica in fleet:
        workflow(replica, done, ran)
        await replica.start()
    barrier = threading.Barrier(16)

    async def submit(n: int) -> Any:
        await anyio.to_thread.run_sync(barrier.wait)
        return await fleet[n % 4].submit("jobs", {"name": "one", "phase": "A"}, unique="name")

    async with anyio.create_task_group() as group:
        for n in range(16):
            group.start_soon(submit, n)
    assert await wait(done)
    for replica in fleet:
        report = await replica.stop()
        assert report.still_running == []
        assert replica.orch._books.idle()
    assert db.jobs.count_documents({"name": "one"}) == 1
    assert sorted(ran) == sorted(f"{db.jobs.find_one()['_id']}:{p}" for p in NEXT)  # type: ignore[index]


async def test_a_submit_cancelled_after_its_insert_landed_still_runs_its_step(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request that submitted was cancelled while the insert's answer was on its way
    (a client that hung up): the document exists, leased to this replica, and its step
    runs once its lease is confirmed, with no wait for the lease to expire."""
    db = memory_database(clock=clock)
    orch = AsyncOrchestrator(async_view(db), replica_id="pod-1", clock=clock, **QUIET)
    replica = Replica(orch)
    done = threading.Event()
    workflow(replica, done)
    landed = asyncio.Event()
    real_insert = AsyncStore.insert

    async def insert_then_hang(self: AsyncStore, *args: Any) -> Any:
        await real_insert(self, *args)
        landed.set()
        await asyncio.Event().wait()  # the answer never comes back

    monkeypatch.setattr(AsyncStore, "insert", insert_then_hang)
    await orch.start()
    try:
        request = asyncio.create_task(orch.submit("jobs", {"_id": "job-1", "phase": "A"}))
        await landed.wait()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert await wait(done)
    finally:
        await orch.stop()
    assert db.jobs.find_one({"_id": "job-1"})["phase"] == "Done"  # type: ignore[index]
    assert (orch.stats()["lent"], orch.stats()["extended"]) == (1, 1)
