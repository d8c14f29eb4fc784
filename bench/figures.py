"""The seven figures. Each returns a plain dict for the JSON results.

Ticks of one second are simulated for the classic pattern (and for batch draining) with a
FakeClock: each tick's real work is measured, and a tick starts one tick after the
previous one, or when the previous one's work ends if that took longer. So the simulated
time is what a real scheduler would take, without waiting through hundreds of seconds.
"""

from __future__ import annotations

import os
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, cast

from pymongo import MongoClient
from pymongo.database import Database

from bench.instrument import CountingDatabase, Meter
from bench.workloads import (
    ClassicReplica,
    Step,
    Tally,
    chain,
    counting,
    finishing,
    register,
    release_update,
)
from orchestrator import Lease, Orchestrator, Outcome
from orchestrator.core import queries
from orchestrator.core.clock import SystemClock
from orchestrator.mongo import Store
from orchestrator.testing import FakeClock, memory_database

TICK = 1.0


@dataclass(frozen=True)
class Size:
    name: str
    throughput_docs: int
    throughput_steps: int  # steps per document (unlocks, then an advance)
    latency_runs: int
    batch_docs: int
    idle_ticks: int
    pickup_runs: int
    claim_sizes: tuple[int, ...]


SIZES = {
    "tiny": Size("tiny", 4, 3, 2, 30, 5, 2, (100, 1_000)),
    "small": Size("small", 20, 10, 5, 300, 60, 10, (1_000, 10_000)),
    "full": Size("full", 50, 20, 10, 2_000, 120, 30, (1_000, 100_000, 1_000_000)),
}


def fresh(clock: Any = None) -> CountingDatabase:
    return CountingDatabase(memory_database(clock=clock or SystemClock()), Meter())


def replica(db: Any, clock: Any, replica_id: str, **options: Any) -> Orchestrator:
    options.setdefault("lock_timeout", 30)
    options.setdefault("tick", TICK)
    return Orchestrator(db, clock=clock, replica_id=replica_id, **options)


# -- 1 and 2: step throughput and overhead per step ------------------------------------------


def throughput(size: Size, concurrency: int) -> dict[str, Any]:
    """Trivial steps (unlock n times, then advance) through the orchestrator, and through a
    bare loop of the same two operations (claim, fenced release) at the same concurrency."""
    docs, per_doc = size.throughput_docs, size.throughput_steps
    steps = docs * per_doc
    work = counting("items", "Count", per_doc)

    clock = FakeClock()
    db = fresh(clock)
    orch = replica(db, clock, "bench", max_concurrency=concurrency, clock_refresh=1e6)
    register(orch, [work])
    _fill(orch, docs, "Count")
    orch.ensure_indexes()
    db.meter.reset()
    started = time.perf_counter()
    orch.run_once()
    wall = time.perf_counter() - started
    ops, in_db = db.meter.snapshot()
    done = orch.stats().get("claimed", 0)
    orch.stop(timeout=5)

    clock = FakeClock()
    bare_db = fresh(clock)
    store = Store(cast(Database[Any], bare_db), "majority")
    seeder = replica(bare_db, clock, "seed")
    _fill(seeder, docs, "Count")
    seeder.ensure_indexes()
    bare_db.meter.reset()
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        bare_counts = list(pool.map(lambda _: _bare_loop(store, work, clock), range(concurrency)))
    bare_wall = time.perf_counter() - started
    bare_ops, bare_in_db = bare_db.meter.snapshot()

    return {
        "concurrency": concurrency,
        "steps": steps,
        "orchestrator_steps": done,
        "bare_steps": sum(bare_counts),
        "orchestrator_steps_per_s": done / wall,
        "bare_steps_per_s": sum(bare_counts) / bare_wall,
        "ratio": (done / wall) / (sum(bare_counts) / bare_wall),
        "orchestrator_ops_per_step": sum(ops.values()) / max(done, 1),
        "bare_ops_per_step": sum(bare_ops.values()) / max(sum(bare_counts), 1),
        "orchestrator_db_us_per_step": in_db / max(done, 1) * 1e6,
        "orchestrator_outside_db_us_per_step": (wall - in_db) / max(done, 1) * 1e6,
        "bare_db_us_per_step": bare_in_db / max(sum(bare_counts), 1) * 1e6,
        "bare_outside_db_us_per_step": (bare_wall - bare_in_db) / max(sum(bare_counts), 1) * 1e6,
    }


def _fill(orch: Orchestrator, docs: int, phase: str, collection: str = "items") -> None:
    for n in range(docs):
        orch.submit(collection, {"phase": phase, "seq": n})


def _bare_loop(store: Store, step: Step, clock: FakeClock) -> int:
    done = 0
    while True:
        token = secrets.token_hex(8)
        now = clock.now()
        update = queries.claim_update(now, now + timedelta(seconds=30), token, "bare")
        doc = store.claim(step.collection, {"phase": step.phase}, now, 3600.0, None, update)
        if doc is None:
            return done
        nxt, fields = step.work(doc)
        store.write(
            step.collection, queries.fenced(doc["_id"], token), release_update(nxt, fields, clock)
        )
        done += 1


# -- 3: latency of a six-step workflow ---------------------------------------------------------

SIX = [f"Step{n}" for n in range(1, 7)]


def multi_step_latency(size: Size) -> dict[str, Any]:
    """Submit to last step done, for one document of six steps on one replica (tick 1 s).
    The orchestrator runs for real (``start()``, real clock); the classic pattern's ticks
    are simulated, with the document submitted just before a tick (its best case)."""
    finished: dict[Any, float] = {}
    done = threading.Event()
    steps = chain("six", SIX)

    def record(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        finished[doc["_id"]] = time.perf_counter()
        done.set()
        return "Done", {}

    steps[-1] = Step("six", SIX[-1], record)
    db = fresh()
    orch = replica(db, None, "bench", max_concurrency=4)
    register(orch, steps)
    orch.start()
    _wait_idle(orch)
    samples = []
    for _ in range(size.latency_runs):
        done.clear()
        started = time.perf_counter()
        doc = orch.submit("six", {"phase": SIX[0]})
        if not done.wait(10):
            raise RuntimeError("the six-step workflow did not finish within 10 s")
        samples.append(finished[doc["_id"]] - started)
    orch.stop(timeout=5)

    clock = FakeClock()
    base_db = fresh(clock)
    seeder = replica(base_db, clock, "seed")
    classic = ClassicReplica(base_db, chain("six", SIX), clock, "classic")
    base_samples = []
    for _ in range(size.latency_runs):
        seeder.submit("six", {"phase": SIX[0]})
        elapsed, _ticks = _simulate([classic.tick], clock, lambda t: t == len(SIX), count=True)
        base_samples.append(elapsed)
    orch_s, base_s = statistics.median(samples), statistics.median(base_samples)
    return {
        "steps": len(SIX),
        "tick_s": TICK,
        "orchestrator_s": orch_s,
        "baseline_s": base_s,
        "ratio": base_s / orch_s,
    }


def _wait_idle(orch: Orchestrator) -> None:
    deadline = time.monotonic() + 10
    while orch.stats().get("ticks", 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the orchestrator did not run its first tick")
        time.sleep(0.005)


def _drained(tally: Any, docs: int, _tick: int) -> bool:
    return bool(tally.count >= docs)


def _simulate(
    replicas: Sequence[Callable[[], Any]],
    clock: FakeClock,
    finished: Callable[[int], bool],
    *,
    count: bool = False,
    max_ticks: int = 100_000,
) -> tuple[float, int]:
    """Run ticks of every replica side by side until ``finished``; (simulated s, ticks).

    ``finished`` gets the steps run so far (``count``) or is asked with 0."""
    start = 0.0
    total = 0
    with ThreadPoolExecutor(len(replicas)) as pool:
        for ticks in range(1, max_ticks + 1):
            began = time.perf_counter()
            results = list(pool.map(lambda run: run(), replicas))
            end = start + time.perf_counter() - began
            if count:
                total += sum(int(r) for r in results)
            if finished(total):
                return end, ticks
            clock.advance(TICK)
            start = max(start + TICK, end)
    raise RuntimeError(f"not finished after {max_ticks} ticks")


# -- 4: batch completion -------------------------------------------------------------------------

THREE = ["Fetch", "Transform", "Store"]


def batch(size: Size, replicas: int = 3) -> dict[str, Any]:
    """Time to drain ``batch_docs`` documents through three steps with three replicas."""
    docs = size.batch_docs
    results: dict[str, Any] = {"documents": docs, "steps": len(THREE), "replicas": replicas}
    for side in ("orchestrator", "baseline"):
        clock = FakeClock()
        db = fresh(clock)
        tally = Tally()
        steps = finishing(chain("batch", THREE), tally)
        seeder = replica(db, clock, "seed", clock_refresh=1e6)
        _fill(seeder, docs, THREE[0], "batch")
        runs: list[Callable[[], Any]] = []
        for n in range(replicas):
            if side == "orchestrator":
                orch = replica(db, clock, f"pod-{n}", clock_refresh=1e6)
                register(orch, steps)
                orch.ensure_indexes()
                runs.append(orch.run_once)
            else:
                runs.append(ClassicReplica(db, steps, clock, f"pod-{n}").tick)
        db.meter.reset()
        began = time.perf_counter()
        elapsed, ticks = _simulate(runs, clock, partial(_drained, tally, docs))
        results[side] = {
            "seconds": elapsed,
            "ticks": ticks,
            "wall_s": time.perf_counter() - began,
            "ops": db.meter.total(),
        }
    results["ratio"] = results["baseline"]["seconds"] / results["orchestrator"]["seconds"]
    return results


# -- 5: idle cost -----------------------------------------------------------------------------


def idle_cost(size: Size) -> dict[str, Any]:
    """Operations per idle replica per second, with 1, 10 and 50 handlers on one
    collection, and 10 handlers spread over 5 collections; the clock refresh (one
    ``hello`` a minute) is counted too."""
    rows = []
    for handlers, collections in ((1, 1), (10, 1), (50, 1), (10, 5)):
        row: dict[str, Any] = {"handlers": handlers, "collections": collections}
        for side in ("orchestrator", "baseline"):
            clock = FakeClock()
            db = fresh(clock)
            steps = [
                Step(f"idle{n % collections}", f"Phase{n}", lambda _d: ("Done", {}))
                for n in range(handlers)
            ]
            seeder = replica(db, clock, "seed")
            for c in range(collections):
                _fill(seeder, 20, "Done", f"idle{c}")
            if side == "orchestrator":
                orch = replica(db, clock, "idle")  # default clock_refresh: 60 s
                register(orch, steps)
                orch.ensure_indexes()
                run: Callable[[], Any] = orch.run_once
            else:
                run = ClassicReplica(db, steps, clock, "idle").tick
            run()  # the first tick measures the clock and builds indexes: not idle cost
            db.meter.reset()
            for _ in range(size.idle_ticks):
                clock.advance(TICK)
                run()
            ops, _seconds = db.meter.snapshot()
            clock_ops = ops.pop("command:hello", 0)
            row[side] = sum(ops.values()) / (size.idle_ticks * TICK)
            row[f"{side}_clock"] = clock_ops / (size.idle_ticks * TICK)
        rows.append(row)
    return {"tick_s": TICK, "ticks": size.idle_ticks, "rows": rows}


# -- 6: pickup latency ---------------------------------------------------------------------------


def pickup(size: Size) -> dict[str, Any]:
    """Time until a handler starts, after a local ``submit`` and after a step's ``advance``,
    with the loop running for real (``start()``, tick 1 s, the loop idle in between)."""
    started_at: list[float] = []
    advanced_at: list[float] = []
    begun = threading.Event()

    db = fresh()
    orch = replica(db, None, "bench")

    @orch.phase("pickup", "First")
    def first(lease: Lease[Any]) -> Outcome:
        started_at.append(time.perf_counter())
        advanced_at.append(time.perf_counter())
        return lease.advance("Second")

    @orch.phase("pickup", "Second")
    def second(lease: Lease[Any]) -> Outcome:
        started_at.append(time.perf_counter())
        begun.set()
        return lease.advance("Done")

    orch.start()
    _wait_idle(orch)
    after_submit, after_advance = [], []
    for _ in range(size.pickup_runs):
        started_at.clear()
        advanced_at.clear()
        begun.clear()
        time.sleep(0.02)  # let the loop go idle: the submit must wake it
        t0 = time.perf_counter()
        orch.submit("pickup", {"phase": "First"})
        if not begun.wait(10):
            raise RuntimeError("the pickup workflow did not run within 10 s")
        after_submit.append(started_at[0] - t0)
        after_advance.append(started_at[1] - advanced_at[0])
    orch.stop(timeout=5)
    submit_ms = statistics.median(after_submit) * 1e3
    advance_ms = statistics.median(after_advance) * 1e3
    return {
        "tick_s": TICK,
        "after_submit_ms": submit_ms,
        "after_advance_ms": advance_ms,
        "after_submit_max_ms": max(after_submit) * 1e3,
        "baseline_mean_ms": TICK / 2 * 1e3,
        "submit_ratio": TICK / 2 * 1e3 / submit_ms,
        "advance_ratio": TICK * 1e3 / advance_ms,
    }


# -- 8: intake while a long step holds a slot -------------------------------------------------

INTAKE_TICK = 0.2


def intake(size: Size) -> dict[str, Any]:
    """Time from a document inserted by another process (no local wake-up) to its step
    starting, while one step of the same replica is blocked: a free worker must take it
    at the next tick, not when the long step ends (before: up to ``step_timeout``)."""
    db = fresh()
    orch = replica(db, None, "bench", tick=INTAKE_TICK, max_concurrency=4)
    blocked, release, started = threading.Event(), threading.Event(), threading.Event()
    started_at: list[float] = []

    @orch.phase("intake", "Long")
    def long(lease: Lease[Any]) -> Outcome:
        blocked.set()
        release.wait(60)
        return lease.advance("Done")

    @orch.phase("intake", "Quick")
    def quick(lease: Lease[Any]) -> Outcome:
        started_at.append(time.perf_counter())
        started.set()
        return lease.advance("Done")

    orch.start()
    delays = []
    try:
        orch.submit("intake", {"phase": "Long"})
        if not blocked.wait(10):
            raise RuntimeError("the long step did not start within 10 s")
        for _ in range(size.pickup_runs):
            started.clear()
            t0 = time.perf_counter()
            db["intake"].insert_one(queries.new_document({"phase": "Quick"}, SystemClock().now()))
            if not started.wait(10):
                raise RuntimeError("the inserted document was not taken within 10 s")
            delays.append(started_at[-1] - t0)
    finally:
        release.set()
        orch.stop(timeout=5)
    return {
        "tick_s": INTAKE_TICK,
        "median_ms": statistics.median(delays) * 1e3,
        "max_ms": max(delays) * 1e3,
        "max_ticks": max(delays) / INTAKE_TICK,
    }


# -- 7: the claim on a real server ----------------------------------------------------------------


def real_server(size: Size) -> dict[str, Any]:
    """With MONGODB_URI: the claim's plan (an index scan, no in-memory SORT) and its
    latency as the collection grows. Skipped, and said so, without a server.

    The server is named as it names itself (``buildInfo``): a wire-protocol server that is
    not MongoDB gives other latencies, and one whose ``explain`` has no ``queryPlanner``
    has no MongoDB query planner, so the plan goal is not judged there (n/a, with why)."""
    uri = os.environ.get("MONGODB_URI")
    if not uri:
        return {"skipped": "MONGODB_URI is not set: no real server to explain the claim on"}
    client: MongoClient[Any] = MongoClient(uri, serverSelectionTimeoutMS=5000)
    name = f"orchestrator_bench_{secrets.token_hex(4)}"
    db = client[name]
    rows = []
    server = server_identity(db)
    try:
        store = Store(db, "majority")
        coll = store.collection("claims")
        store.ensure_claim_index("claims")
        have = 0
        for target in size.claim_sizes:
            _insert_bulk(coll, have, target)
            have = target
            rows.append(_claim_row(store, coll, target))
    finally:
        client.drop_database(name)
        client.close()
    return {"server": server, "rows": rows}


def server_identity(db: Any) -> dict[str, str]:
    """What the server says it is: ``buildInfo``'s version and gitVersion (a commit hash on
    MongoDB; another implementation names itself there)."""
    info = db.command("buildInfo")
    version, git = str(info.get("version", "?")), str(info.get("gitVersion", "?"))
    return {"version": version, "gitVersion": git, "name": f"version {version} ({git})"}


def _insert_bulk(coll: Any, have: int, target: int) -> None:
    """Mostly finished documents, a few claimable: the realistic shape of a busy system."""
    fake = FakeClock()
    batch_size = 10_000
    for first in range(have, target, batch_size):
        docs = []
        for n in range(first, min(first + batch_size, target)):
            phase = "Work" if n % 100 == 0 else "Done"
            docs.append(queries.new_document({"phase": phase, "seq": n}, fake.now()))
        coll.insert_many(docs, ordered=False)


def _claim_row(store: Store, coll: Any, documents: int) -> dict[str, Any]:
    clock = SystemClock()
    now = clock.now()
    claim = queries.claim_filter({"phase": "Work"}, now, 3600.0)
    plan = coll.find(claim).sort(queries.CLAIM_SORT).limit(1).explain()
    planner = "queryPlanner" in plan
    stages = _stages(plan.get("queryPlanner", {}).get("winningPlan", {}))
    samples = []
    for _ in range(50):
        token = secrets.token_hex(8)
        began = time.perf_counter()
        now = clock.now()
        update = queries.claim_update(now, now + timedelta(seconds=30), token, "b")
        doc = store.claim("claims", {"phase": "Work"}, now, 3600.0, None, update)
        samples.append(time.perf_counter() - began)
        if doc is not None:
            store.write("claims", queries.fenced(doc["_id"], token), queries.release_update())
    return {
        "documents": documents,
        "query_planner": planner,
        "stages": sorted(set(stages)),
        "index_scan": "IXSCAN" in stages,
        "in_memory_sort": "SORT" in stages,
        "claim_ms_median": statistics.median(samples) * 1e3,
    }


def _stages(plan: Any) -> list[str]:
    found: list[str] = []
    if isinstance(plan, dict):
        if "stage" in plan:
            found.append(str(plan["stage"]))
        for key in ("inputStage", "queryPlan"):
            found += _stages(plan.get(key))
        for child in plan.get("inputStages", []):
            found += _stages(child)
    return found
