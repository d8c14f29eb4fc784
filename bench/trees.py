"""``uv run python -m bench trees``: what trees and events cost and how fast they wake.

1. Commands per child completion: ``N`` children of one waiting parent run to their end,
   beside the same ``N`` documents owned by nobody, on the in-memory store (every command
   counted, ``bench.instrument``); the difference per child is what ownership adds (the
   wake of the parent, and the parent's judgements of its wait).
2. Latency, in process: from a parent's last child's terminal write to the parent's next
   step (its ``then`` phase), and from ``orch.signal`` to the waiting document's step, on a
   started ``AsyncOrchestrator`` (real clock, tick 1 s: a wake that waited for the tick
   would show as ~500 ms); on the in-memory store, and on ``MONGODB_URI``'s server when set.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pymongo import AsyncMongoClient

from bench.instrument import CountingDatabase, Meter
from orchestrator import AsyncOrchestrator, Orchestrator
from orchestrator.core.trees import OWNER_FIELD, Need, Wait, WaitKind
from orchestrator.testing import FakeClock, async_memory_database, memory_database

CHILDREN = 50
ROUNDS = 40


def commands_per_child(children: int = CHILDREN) -> dict[str, Any]:
    """Commands by kind while ``children`` documents run to Done, owned by a waiting
    parent and owned by nobody."""
    found: dict[str, Any] = {"children": children}
    for side in ("owned", "alone"):
        clock = FakeClock()
        meter = Meter()
        db = memory_database(clock=clock)
        counted: Any = CountingDatabase(db, meter)  # a Database in all it is asked
        orch = Orchestrator(counted, replica_id="pod-0", clock=clock, clock_refresh=1e6)
        orch.phase("kids", "Work")(lambda lease: lease.advance("Done"))
        orch.phase("parents", "Make")(lambda lease: lease.advance("Never"))
        orch.phase("parents", "Made")(lambda lease: lease.advance("Done"))
        orch.measure_clock()
        now = orch.clock.now()
        if side == "owned":
            wait = Wait(WaitKind.CHILDREN, then="Made", since=now, need=Need.ALL)
            db["parents"].insert_one(
                {
                    "_id": "p",
                    "phase": "Make",
                    "lockedUntil": now,
                    "orchestratorWait": wait.stored(),
                    "orchestratorOwns": ["kids"],
                }
            )
        for n in range(children):
            later = now + timedelta(seconds=5)  # due once the parent waits, on both sides
            kid: dict[str, Any] = {"_id": f"k{n}", "phase": "Work", "lockedUntil": later}
            if side == "owned":
                kid[OWNER_FIELD] = {"collection": "parents", "id": "p", "name": f"k{n}"}
            db["kids"].insert_one(kid)
        orch.run_once(heartbeat=False)  # the parent's first judgement: it waits
        meter.reset()
        clock.advance(5)
        for _ in range(5):
            orch.run_once(heartbeat=False)
            clock.advance(1)
        ops, _ = meter.snapshot()
        assert db["kids"].count_documents({"phase": "Done"}) == children
        if side == "owned":
            assert db["parents"].find_one({"_id": "p"})["phase"] == "Done"  # type: ignore[index]
        found[side] = ops
    owned, alone = found["owned"], found["alone"]
    extra = {k: owned.get(k, 0) - alone.get(k, 0) for k in sorted({*owned, *alone})}
    found["extra_per_child"] = sum(extra.values()) / children
    found["extra_by_kind"] = {k: v for k, v in extra.items() if v}
    return found


async def latencies(db: Any, rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Milliseconds from a last child's terminal write to its parent's next step, and from
    a signal to the waiting document's step, ``rounds`` of each, one at a time."""
    marks: dict[str, float] = {}
    ended: dict[str, float] = {}
    orch = AsyncOrchestrator(db, replica_id="bench-trees", tick=1.0)

    @orch.phase("bench_parents", "Make")
    async def make(lease: Any) -> Any:
        for n in range(3):
            await lease.create_child("bench_kids", f"k{n}", {"phase": "Work"})
        return await lease.wait_for_children(then="Made")

    @orch.phase("bench_kids", "Work")
    async def work(lease: Any) -> Any:
        outcome = await lease.advance("Done")
        ended[lease.doc[OWNER_FIELD]["id"]] = time.perf_counter()
        return outcome

    @orch.phase("bench_parents", "Made")
    async def made(lease: Any) -> Any:
        marks[lease.doc["_id"]] = time.perf_counter()
        return await lease.advance("Done")

    @orch.phase("bench_waiters", "Wait")
    async def wait(lease: Any) -> Any:
        return await lease.wait_for("go", then="Got")

    @orch.phase("bench_waiters", "Got")
    async def got(lease: Any) -> Any:
        marks[lease.doc["_id"]] = time.perf_counter()
        return await lease.advance("Done")

    for name in ("bench_parents", "bench_kids", "bench_waiters"):
        await db.drop_collection(name)
    trips = []
    for _ in range(20):  # the store's round trip, for scale: a find of one document
        began = time.perf_counter()
        await db["bench_parents"].find_one({"_id": "none"})
        trips.append((time.perf_counter() - began) * 1000)
    await orch.start()
    children: list[float] = []
    signals: list[float] = []
    try:
        for n in range(rounds):
            parent = f"p{n}"
            await orch.submit("bench_parents", {"_id": parent, "phase": "Make"})
            await _until(lambda p=parent: p in marks)
            children.append((marks[parent] - ended[parent]) * 1000)
            waiter = f"w{n}"
            await orch.submit("bench_waiters", {"_id": waiter, "phase": "Wait"})
            await _settle(db, waiter)
            sent = time.perf_counter()
            await orch.signal("bench_waiters", waiter, "go", n)
            await _until(lambda w=waiter: w in marks)
            signals.append((marks[waiter] - sent) * 1000)
    finally:
        await orch.stop()
    return {"child_to_parent_ms": children, "signal_to_step_ms": signals, "round_trip_ms": trips}


async def _settle(db: Any, waiter: str) -> None:
    """Until the waiter's wait is stored and no step holds it."""
    while True:
        doc = await db["bench_waiters"].find_one({"_id": waiter})
        if doc and doc.get("orchestratorWait") and "lockToken" not in doc:
            return
        await asyncio.sleep(0.005)


async def _until(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the benchmark's document did not move in 30 s")
        await asyncio.sleep(0.001)


def _percentiles(values: Sequence[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "-"
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (n={len(ordered)})"


def main(argv: list[str]) -> int:
    counted = commands_per_child()
    print(f"commands per child completion ({counted['children']} children, in-memory):")
    print(f"  owned by a waiting parent: {sum(counted['owned'].values())} {counted['owned']}")
    print(f"  owned by nobody:           {sum(counted['alone'].values())} {counted['alone']}")
    print(f"  extra per child: {counted['extra_per_child']:.2f} {counted['extra_by_kind']}")
    stores: list[tuple[str, Any]] = [("in-memory", async_memory_database())]
    uri = os.environ.get("MONGODB_URI")
    if uri:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
        stores.append((f"server {uri.split('@')[-1]}", client["bench_trees"]))
    for name, db in stores:
        found = asyncio.run(latencies(db))
        print(f"latency, {name}, one replica process (tick 1 s):")
        child, signal = found["child_to_parent_ms"], found["signal_to_step_ms"]
        trip = found["round_trip_ms"]
        print(f"  one round trip (find_one):                    {_percentiles(trip)}")
        print(f"  last child's terminal write -> parent's step: {_percentiles(child)}")
        print(f"  signal sent -> waiting document's step:       {_percentiles(signal)}")
    return 0
