"""The figures (1-9). Each returns a plain dict for the JSON results.

Ticks of one second are simulated for the classic pattern (and for batch draining) with a
FakeClock: each tick's real work is measured, and a tick starts one tick after the
previous one, or when the previous one's work ends if that took longer. So the simulated
time is what a real scheduler would take, without waiting through hundreds of seconds.
"""

from __future__ import annotations

import asyncio
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
from pymongo.asynchronous.database import AsyncDatabase
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
    register_async,
    release_update,
)
from orchestrator import AsyncLease, AsyncOrchestrator, Lease, Orchestrator, Outcome
from orchestrator.core import history, replicas
from orchestrator.core.clock import SystemClock
from orchestrator.core.queries import claims, lease_writes, submissions
from orchestrator.core.settings import Settings
from orchestrator.core.steps import started as steps_started
from orchestrator.mongo import AsyncStore, Store
from orchestrator.testing import FakeClock, async_memory_database, async_view, memory_database

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
    repeats: int  # runs of figures 1, 2 and 9 (the machine may be shared): medians
    io_docs: int  # documents of figure 9


SIZES = {
    "tiny": Size("tiny", 4, 3, 2, 30, 5, 2, (100, 1_000), 1, 40),
    "small": Size("small", 20, 10, 5, 300, 60, 10, (1_000, 10_000), 5, 200),
    "full": Size("full", 50, 20, 10, 2_000, 120, 30, (1_000, 100_000, 1_000_000), 5, 200),
}


def fresh(clock: Any = None) -> CountingDatabase:
    return CountingDatabase(memory_database(clock=clock or SystemClock()), Meter())


def fresh_async(clock: Any = None) -> CountingDatabase:
    """An async in-memory database, counted: the async engine's store in every figure."""
    return CountingDatabase(async_memory_database(clock=clock or SystemClock()), Meter())


def replica(db: Any, clock: Any, replica_id: str, **options: Any) -> Orchestrator:
    options.setdefault("lock_timeout", 30)
    options.setdefault("tick", TICK)
    return Orchestrator(db, clock=clock, replica_id=replica_id, **options)


def async_replica(db: Any, clock: Any, replica_id: str, **options: Any) -> AsyncOrchestrator:
    options.setdefault("lock_timeout", 30)
    options.setdefault("tick", TICK)
    return AsyncOrchestrator(db, clock=clock, replica_id=replica_id, **options)


# -- 1 and 2: step throughput and overhead per step ------------------------------------------

ENGINES = ("threaded", "async")
"""``Orchestrator`` on the in-memory database, ``AsyncOrchestrator`` on its async view."""


def throughput(size: Size, engine: str, concurrency: int) -> dict[str, Any]:
    """Trivial steps (unlock n times, then advance) through one engine, and through a bare
    loop of the same two operations (claim, fenced release) at the same concurrency on the
    same kind of store: threads on ``Store`` for the threaded engine, asyncio tasks on
    ``AsyncStore`` for the async one. Run ``size.repeats`` times, each orchestrator run
    next to its bare run (they share the machine's load); medians of the pairs."""
    measure = _sync_pair if engine == "threaded" else _async_pair
    runs = [measure(size, concurrency) for _ in range(size.repeats)]
    docs, per_doc = size.throughput_docs, size.throughput_steps
    out: dict[str, Any] = {
        "engine": engine,
        "concurrency": concurrency,
        "steps": docs * per_doc,
        "repeats": len(runs),
        "orchestrator_steps": min(r["orchestrator_steps"] for r in runs),
        "bare_steps": min(r["bare_steps"] for r in runs),
        "ratios": [r["ratio"] for r in runs],
        "overheads_us": [r["overhead_us"] for r in runs],
    }
    for key in runs[0]:
        if key not in out and key not in {"orchestrator_steps", "bare_steps"}:
            out[key] = statistics.median(r[key] for r in runs)
    return out


def _pair(
    wall: float,
    cpu: float,
    done: int,
    in_db: float,
    ops: int,
    *,
    bare: tuple[float, float, int, float, int],
) -> dict[str, Any]:
    """One orchestrator run and its bare run, as figures per step. The process's CPU time
    per step is kept beside the wall time: other work on a shared machine stretches the
    wall time of one side more than the other's, not the CPU time."""
    bare_wall, bare_cpu, bare_done, bare_in_db, bare_ops = bare
    outside = (wall - in_db) / max(done, 1) * 1e6
    bare_outside = (bare_wall - bare_in_db) / max(bare_done, 1) * 1e6
    return {
        "orchestrator_steps": done,
        "bare_steps": bare_done,
        "orchestrator_steps_per_s": done / wall,
        "bare_steps_per_s": bare_done / bare_wall,
        "ratio": (done / wall) / (bare_done / bare_wall),
        "orchestrator_ops_per_step": ops / max(done, 1),
        "bare_ops_per_step": bare_ops / max(bare_done, 1),
        "orchestrator_db_us_per_step": in_db / max(done, 1) * 1e6,
        "orchestrator_outside_db_us_per_step": outside,
        "bare_db_us_per_step": bare_in_db / max(bare_done, 1) * 1e6,
        "bare_outside_db_us_per_step": bare_outside,
        "overhead_us": outside - bare_outside,
        "orchestrator_cpu_us_per_step": cpu / max(done, 1) * 1e6,
        "bare_cpu_us_per_step": bare_cpu / max(bare_done, 1) * 1e6,
        "cpu_ratio": (bare_cpu / max(bare_done, 1)) / (cpu / max(done, 1)),
    }


def _sync_pair(size: Size, concurrency: int) -> dict[str, Any]:
    docs, per_doc = size.throughput_docs, size.throughput_steps
    work = counting("items", "Count", per_doc)

    clock = FakeClock()
    db = fresh(clock)
    orch = replica(db, clock, "bench", max_concurrency=concurrency, clock_refresh=1e6)
    register(orch, [work])
    _fill(orch, docs, "Count")
    orch.ensure_indexes()
    db.meter.reset()
    started, cpu_started = time.perf_counter(), time.process_time()
    orch.run_once()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    ops, in_db = db.meter.snapshot()
    done = steps_started(orch.stats())
    orch.stop(timeout=5)

    clock = FakeClock()
    bare_db = fresh(clock)
    store = Store(cast(Database[Any], bare_db), "majority")
    seeder = replica(bare_db, clock, "seed")
    _fill(seeder, docs, "Count")
    seeder.ensure_indexes()
    bare_db.meter.reset()
    started, cpu_started = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(concurrency) as pool:
        bare_counts = list(pool.map(lambda _: bare_loop(store, work, clock), range(concurrency)))
    bare_wall, bare_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    bare_ops, bare_in_db = bare_db.meter.snapshot()
    bare = (bare_wall, bare_cpu, sum(bare_counts), bare_in_db, sum(bare_ops.values()))
    return _pair(wall, cpu, done, in_db, sum(ops.values()), bare=bare)


def _async_pair(size: Size, concurrency: int) -> dict[str, Any]:
    return asyncio.run(_async_pair_on_loop(size, concurrency))


async def _async_pair_on_loop(size: Size, concurrency: int) -> dict[str, Any]:
    docs, per_doc = size.throughput_docs, size.throughput_steps
    work = counting("items", "Count", per_doc)

    clock = FakeClock()
    db = fresh_async(clock)
    orch = async_replica(db, clock, "bench", max_concurrency=concurrency, clock_refresh=1e6)
    register_async(orch, [work])
    await _afill(orch, docs, "Count")
    await orch.ensure_indexes()
    db.meter.reset()
    started, cpu_started = time.perf_counter(), time.process_time()
    await orch.run_once()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    ops, in_db = db.meter.snapshot()
    done = steps_started(orch.stats())
    await orch.stop(timeout=5)

    clock = FakeClock()
    bare_db = fresh_async(clock)
    store = AsyncStore(cast(AsyncDatabase[Any], bare_db), "majority")
    seeder = async_replica(bare_db, clock, "seed")
    await _afill(seeder, docs, "Count")
    await seeder.ensure_indexes()
    bare_db.meter.reset()
    started, cpu_started = time.perf_counter(), time.process_time()
    loops = [abare_loop(store, work, clock) for _ in range(concurrency)]
    bare_counts = await asyncio.gather(*loops)
    bare_wall, bare_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    bare_ops, bare_in_db = bare_db.meter.snapshot()
    bare = (bare_wall, bare_cpu, sum(bare_counts), bare_in_db, sum(bare_ops.values()))
    return _pair(wall, cpu, done, in_db, sum(ops.values()), bare=bare)


def overhead(throughput_runs: Sequence[dict[str, Any]], engine: str) -> dict[str, Any]:
    """Figure 2 for ``engine``, from its concurrency-1 runs of figure 1."""
    single = next(t for t in throughput_runs if t["engine"] == engine and t["concurrency"] == 1)
    return {
        "engine": engine,
        "orchestrator_outside_db_us": single["orchestrator_outside_db_us_per_step"],
        "bare_outside_db_us": single["bare_outside_db_us_per_step"],
        "overhead_us": single["overhead_us"],
        "overheads_us": single["overheads_us"],
        "orchestrator_db_us": single["orchestrator_db_us_per_step"],
    }


def _fill(orch: Orchestrator, docs: int, phase: str, collection: str = "items") -> None:
    for n in range(docs):
        orch.submit(collection, {"phase": phase, "seq": n})


async def _afill(orch: AsyncOrchestrator, docs: int, phase: str, collection: str = "items") -> None:
    for n in range(docs):
        await orch.submit(collection, {"phase": phase, "seq": n})


def bare_loop(store: Store, step: Step, clock: FakeClock) -> int:
    """The least a loop can send per step: a claim for a document's first step, then one
    write per step, each carrying the lease on into the next (the last releases), each
    with the step's history entry, as the engine writes them."""
    done = 0
    while True:
        token = secrets.token_hex(8)
        now = clock.now()
        update = claims.claim_update(now, now + timedelta(seconds=30), token, "bare")
        doc = store.claim(
            step.collection, claims.ClaimRequest({"phase": step.phase}, now, 3600.0, update)
        )
        while doc is not None:
            nxt, fields = step.work(doc)
            fence = lease_writes.fenced(doc["_id"], token, step.phase)
            done += 1
            if nxt is not None:  # the last step: released into a phase no loop takes
                store.write(step.collection, fence, _recorded(doc, nxt, fields, clock, now))
                break
            token, at = secrets.token_hex(8), now
            now = clock.now()
            written = _recorded(doc, None, fields, clock, at)
            doc = store.carry(step.collection, fence, _carried(written, token, clock))
        else:
            return done


async def abare_loop(store: AsyncStore, step: Step, clock: FakeClock) -> int:
    """``bare_loop`` on the async store: the same operations, awaited."""
    done = 0
    while True:
        token = secrets.token_hex(8)
        now = clock.now()
        update = claims.claim_update(now, now + timedelta(seconds=30), token, "bare")
        doc = await store.claim(
            step.collection, claims.ClaimRequest({"phase": step.phase}, now, 3600.0, update)
        )
        while doc is not None:
            nxt, fields = step.work(doc)
            fence = lease_writes.fenced(doc["_id"], token, step.phase)
            done += 1
            if nxt is not None:
                await store.write(step.collection, fence, _recorded(doc, nxt, fields, clock, now))
                break
            token, at = secrets.token_hex(8), now
            now = clock.now()
            written = _recorded(doc, None, fields, clock, at)
            doc = await store.carry(step.collection, fence, _carried(written, token, clock))
        else:
            return done


def _recorded(
    doc: dict[str, Any], nxt: str | None, fields: dict[str, Any], clock: FakeClock, since: Any
) -> dict[str, Any]:
    """A step's releasing update with its history entry, as the engine's lease writes it
    (``history.step_entry``, ``history.push``, ``DEFAULT_HISTORY`` entries kept)."""
    update = release_update(nxt, fields, clock)
    outcome = "unlocked" if nxt is None else "advanced"
    phase = doc.get("phase")
    entry = history.step_entry(
        replica="bare",
        claimed_at=since,
        now=clock.now(),
        outcome=outcome,
        phase=phase,
        to=phase if nxt is None else nxt,
    )
    current = doc.get(history.HISTORY_FIELD, history.ABSENT)
    return history.merge(update, history.push(entry, history.DEFAULT_HISTORY, current))


def _carried(update: dict[str, Any], token: str, clock: FakeClock) -> dict[str, Any]:
    """``update`` carrying the lease on (``lease_writes.carry_update``)."""
    now = clock.now()
    until = now + timedelta(seconds=30)
    return lease_writes.carry_update(update, now, until, token, "bare")


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
        began = time.perf_counter()
        elapsed, ticks, counts = _drain(side, "batch", THREE, docs, replicas, clock_refresh=1e6)
        results[side] = {
            "seconds": elapsed,
            "ticks": ticks,
            "wall_s": time.perf_counter() - began,
            "ops": sum(counts.values()),
        }
    results["ratio"] = results["baseline"]["seconds"] / results["orchestrator"]["seconds"]
    return results


def _drain(
    side: str, collection: str, phases: Sequence[str], docs: int, replicas_n: int, **options: Any
) -> tuple[float, int, dict[str, int]]:
    """``docs`` documents through ``phases`` by ``replicas_n`` replicas of ``side`` (the
    orchestrator's ``run_once``, or the classic pattern's tick) on a fake clock: the
    simulated seconds, the ticks, and the commands sent by kind."""
    clock = FakeClock()
    db = fresh(clock)
    tally = Tally()
    steps = finishing(chain(collection, phases), tally)
    seeder = replica(db, clock, "seed", clock_refresh=1e6)
    _fill(seeder, docs, phases[0], collection)
    runs: list[Callable[[], Any]] = []
    for n in range(replicas_n):
        if side == "orchestrator":
            orch = replica(db, clock, f"pod-{n}", **options)
            register(orch, steps)
            orch.ensure_indexes()
            orch.measure_clock()
            runs.append(orch.run_once)
        else:
            runs.append(ClassicReplica(db, steps, clock, f"pod-{n}").tick)
    db.meter.reset()
    elapsed, ticks = _simulate(runs, clock, partial(_drained, tally, docs))
    counts, _seconds = db.meter.snapshot()
    return elapsed, ticks, counts


# -- 10: commands per completed step --------------------------------------------------------------


def commands_per_step(size: Size, replicas_n: int = 3) -> dict[str, Any]:
    """Every command the library sends (claims, carried writes, releases, probes, the
    clock's ``hello``; not the submits), per completed step, while ``replicas_n`` replicas
    drain workflows of 3 and of 5 steps; beside it, the classic pattern's. Then the same
    workflows submitted one at a time by a started replica with workers free (an API
    server's requests): each first step is lent its lease by the submit, with no claim."""
    docs = min(size.batch_docs, 300)
    rows = []
    for length in (3, 5):
        phases = [f"S{n}" for n in range(1, length + 1)]
        row: dict[str, Any] = {"documents": docs, "steps": length, "replicas": replicas_n}
        for side in ("orchestrator", "baseline"):
            _elapsed, _ticks, counts = _drain(side, "work", phases, docs, replicas_n)
            row[side] = sum(counts.values()) / (docs * length)
            row[f"{side}_by_kind"] = counts
        rows.append(row)
    submitted = []
    for length in (3, 5):
        phases = [f"S{n}" for n in range(1, length + 1)]
        counts = _submitted_here("work", phases, docs)
        submitted.append(
            {
                "documents": docs,
                "steps": length,
                "orchestrator": sum(counts.values()) / (docs * length),
                "orchestrator_by_kind": counts,
            }
        )
    return {"rows": rows, "submitted_here": submitted}


def _submitted_here(collection: str, phases: Sequence[str], docs: int) -> dict[str, int]:
    """The commands a started replica sends, by kind, running ``docs`` workflows through
    ``phases``, each submitted (with no ``_id``: a plain insert, not counted) once the one
    before finished, so a worker is free for it: its ticks' probes, the clock's ``hello``
    and the steps' writes (and claims, if any were needed)."""
    clock = FakeClock()
    db = fresh(clock)
    tally = Tally()
    orch = replica(db, clock, "pod-0", clock_refresh=1e6)
    register(orch, finishing(chain(collection, phases), tally))
    orch.ensure_indexes()
    orch.measure_clock()
    orch.start()
    db.meter.reset()
    try:
        for n in range(docs):
            orch.submit(collection, {"n": n, "phase": phases[0]})
            deadline = time.monotonic() + 10
            while tally.count <= n:  # a bench's wait on real work, not a test's
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workflow {n} did not finish within 10 s")
                time.sleep(0.0005)
    finally:
        orch.stop()
    counts, _seconds = db.meter.snapshot()
    counts.pop("insert_one", None)
    return counts


# -- 5: idle cost -----------------------------------------------------------------------------

IDLE_SCHEDULES = 100


IDLE_SHAPES = (
    (1, 1, 0),
    (10, 1, 0),
    (50, 1, 0),
    (5, 5, 0),
    (10, 5, 0),
    (50, 5, 0),
    (10, 1, IDLE_SCHEDULES),
)
"""Figure 5's rows: handlers, collections (the handlers spread evenly over them), and
schedules declared (daily, none due while measured: their next fire is one more due time
the tick's probe already asks about)."""

_READS = frozenset({"find", "find_one", "aggregate", "count_documents", "list_indexes"})


def idle_cost(size: Size) -> dict[str, Any]:
    """Commands per idle replica per tick, every command counted, for 1 to 50 handlers on
    1 and 5 collections: the orchestrator ``start()``-ed (its ticks, heartbeats and
    record writes included), driven on a fake clock, against the classic pattern's tick.
    Reads and writes are counted apart; the clock's ``hello`` (one a minute) is shown
    apart too."""
    rows = []
    for handlers, collections, schedules in IDLE_SHAPES:
        row: dict[str, Any] = {
            "handlers": handlers,
            "collections": collections,
            "schedules": schedules,
        }
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
                counts = _started_idle(db, clock, steps, size.idle_ticks, schedules)
            else:
                classic = ClassicReplica(db, steps, clock, "idle")
                classic.tick()
                db.meter.reset()
                for _ in range(size.idle_ticks):
                    clock.advance(TICK)
                    classic.tick()
                counts, _seconds = db.meter.snapshot()
            ticks = size.idle_ticks
            hello = counts.pop("command:hello", 0)
            reads = sum(v for k, v in counts.items() if k in _READS)
            writes = sum(v for k, v in counts.items() if k not in _READS)
            row[side] = (reads + writes) / ticks
            row[f"{side}_reads"] = reads / ticks
            row[f"{side}_writes_per_10s"] = writes / (ticks * TICK) * 10
            row[f"{side}_clock"] = hello / (ticks * TICK)
        rows.append(row)
    return {"tick_s": TICK, "ticks": size.idle_ticks, "rows": rows}


def _quiet(orch: Orchestrator) -> None:
    """Wait (in real time, on the workers' threads) until the tick is over."""
    deadline = time.monotonic() + 10
    while not orch._books.once_over():
        if time.monotonic() > deadline:
            raise RuntimeError("the idle tick did not end within 10 s")
        time.sleep(0.001)


def _started_idle(
    db: CountingDatabase, clock: FakeClock, steps: Sequence[Step], ticks: int, schedules: int
) -> dict[str, int]:
    """A started replica's commands over ``ticks`` idle ticks: its timer is paused and its
    jobs run here on the fake clock (a tick every second, a heartbeat every
    ``refresh_interval``, as its timer calls them), so the count covers all it sends, in
    no real time. Its ``schedules`` fire daily, at midnight: the fake clock starts at one,
    so none is due within the ticks counted."""
    orch = replica(db, clock, "idle")  # default clock_refresh: 60 s
    register(orch, steps)
    for n in range(schedules):
        orch.schedule(f"daily-{n}", steps[0].collection, every=timedelta(days=1))(_declines)
    orch.start()
    timer = orch._books.timer
    assert timer is not None
    timer.pause()
    _quiet(orch)
    interval = replicas.refresh_interval(orch.settings.lock_timeout)
    db.meter.reset()
    beats = 0
    for n in range(1, ticks + 1):
        clock.advance(TICK)
        orch._background_tick()
        _quiet(orch)
        if n * TICK >= (beats + 1) * interval:
            beats += 1
            orch._safe_heartbeat()  # as its timer calls it
    counts, _seconds = db.meter.snapshot()
    orch.stop(timeout=5)
    return counts


def _declines(fire: Any) -> None:
    """A schedule's function that starts nothing (never called: none is due)."""


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


def intake(size: Size, engine: str) -> dict[str, Any]:
    """Time from a document inserted by another process (no local wake-up) to its step
    starting, while one step of the same replica is blocked: a free worker must take it
    at the next tick, not when the long step ends (before: up to ``step_timeout``)."""
    delays = _intake_threaded(size) if engine == "threaded" else asyncio.run(_intake_async(size))
    return {
        "engine": engine,
        "tick_s": INTAKE_TICK,
        "median_ms": statistics.median(delays) * 1e3,
        "max_ms": max(delays) * 1e3,
        "max_ticks": max(delays) / INTAKE_TICK,
    }


def _intake_threaded(size: Size) -> list[float]:
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
            db["intake"].insert_one(
                submissions.new_document({"phase": "Quick"}, SystemClock().now())
            )
            if not started.wait(10):
                raise RuntimeError("the inserted document was not taken within 10 s")
            delays.append(started_at[-1] - t0)
            _settle(orch, len(delays))
    finally:
        release.set()
        orch.stop(timeout=5)
    return delays


def _settle(orch: Orchestrator | AsyncOrchestrator, advanced: int) -> None:
    """Wait until the quick step just taken has advanced, then a little more: the replica
    looks for more work after a step frees some, and the next insert must arrive when it
    has stopped looking (the next tick must find it), as in the threaded and the async
    engine alike."""
    deadline = time.monotonic() + 10
    while orch.stats().get("advanced", 0) < advanced:
        if time.monotonic() > deadline:
            raise RuntimeError("the quick step did not advance within 10 s")
        time.sleep(0.001)
    time.sleep(0.02)


async def _intake_async(size: Size) -> list[float]:
    """The async engine's intake: the outside insert goes through the sync face of the
    same in-memory database, as another process's would (no local wake-up)."""
    memory = memory_database(clock=SystemClock())
    orch = async_replica(
        CountingDatabase(async_view(memory), Meter()),
        None,
        "bench",
        tick=INTAKE_TICK,
        max_concurrency=4,
    )
    blocked, release, started = asyncio.Event(), asyncio.Event(), asyncio.Event()
    started_at: list[float] = []

    @orch.phase("intake", "Long")
    async def long(lease: AsyncLease[Any]) -> Outcome:
        blocked.set()
        await release.wait()
        return await lease.advance("Done")

    @orch.phase("intake", "Quick")
    async def quick(lease: AsyncLease[Any]) -> Outcome:
        started_at.append(time.perf_counter())
        started.set()
        return await lease.advance("Done")

    await orch.start()
    delays = []
    try:
        await orch.submit("intake", {"phase": "Long"})
        await asyncio.wait_for(blocked.wait(), 10)
        for _ in range(size.pickup_runs):
            started.clear()
            t0 = time.perf_counter()
            new = submissions.new_document({"phase": "Quick"}, SystemClock().now())
            memory["intake"].insert_one(new)
            await asyncio.wait_for(started.wait(), 10)
            delays.append(started_at[-1] - t0)
            await asyncio.to_thread(_settle, orch, len(delays))
    finally:
        release.set()
        await orch.stop(timeout=5)
    return delays


# -- 9: I/O-bound handlers ----------------------------------------------------------------------

IO_WAIT = 0.05
IO_ASYNC_CONCURRENCY = 100


def io_bound(size: Size) -> dict[str, Any]:
    """``io_docs`` documents whose one step waits 50 ms on I/O (async: ``await
    asyncio.sleep``; threaded: ``time.sleep``), drained by one replica's ``run_once``:
    the async engine with ``max_concurrency=100`` against the threaded engine at its
    default settings. Each side's ceiling is its slots / 50 ms."""
    docs = size.io_docs
    threaded_slots = Settings.build().max_concurrency
    runs = []
    for _ in range(size.repeats):
        threaded = _io_threaded(docs)
        aio = asyncio.run(_io_async(docs))
        runs.append((threaded, aio))
    threaded_s = statistics.median(t for t, _ in runs)
    async_s = statistics.median(a for _, a in runs)
    return {
        "documents": docs,
        "wait_s": IO_WAIT,
        "repeats": len(runs),
        "threaded_concurrency": threaded_slots,
        "async_concurrency": IO_ASYNC_CONCURRENCY,
        "threaded_s": threaded_s,
        "async_s": async_s,
        "threaded_steps_per_s": docs / threaded_s,
        "async_steps_per_s": docs / async_s,
        "threaded_ceiling_steps_per_s": threaded_slots / IO_WAIT,
        "async_ceiling_steps_per_s": IO_ASYNC_CONCURRENCY / IO_WAIT,
        "ratio": statistics.median(t / a for t, a in runs),
    }


def _io_threaded(docs: int) -> float:
    clock = FakeClock()
    orch = Orchestrator(cast(Database[Any], fresh(clock)), clock=clock, replica_id="io")

    @orch.phase("io", "Call")
    def call(lease: Lease[Any]) -> Outcome:
        time.sleep(IO_WAIT)
        return lease.advance("Done")

    _fill(orch, docs, "Call", "io")
    orch.ensure_indexes()
    started = time.perf_counter()
    done = orch.run_once().get("advanced", 0)
    wall = time.perf_counter() - started
    orch.stop(timeout=5)
    if done != docs:
        raise RuntimeError(f"the threaded engine advanced {done} of {docs} documents")
    return wall


async def _io_async(docs: int) -> float:
    clock = FakeClock()
    orch = AsyncOrchestrator(
        cast(AsyncDatabase[Any], fresh_async(clock)),
        clock=clock,
        replica_id="io",
        max_concurrency=IO_ASYNC_CONCURRENCY,
    )

    @orch.phase("io", "Call")
    async def call(lease: AsyncLease[Any]) -> Outcome:
        await asyncio.sleep(IO_WAIT)
        return await lease.advance("Done")

    await _afill(orch, docs, "Call", "io")
    await orch.ensure_indexes()
    started = time.perf_counter()
    done = (await orch.run_once()).get("advanced", 0)
    wall = time.perf_counter() - started
    await orch.stop(timeout=5)
    if done != docs:
        raise RuntimeError(f"the async engine advanced {done} of {docs} documents")
    return wall


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
            docs.append(submissions.new_document({"phase": phase, "seq": n}, fake.now()))
        coll.insert_many(docs, ordered=False)


def _claim_row(store: Store, coll: Any, documents: int) -> dict[str, Any]:
    clock = SystemClock()
    now = clock.now()
    claim = claims.claim_filter({"phase": "Work"}, now, 3600.0)
    plan = coll.find(claim).sort(claims.CLAIM_SORT).limit(1).explain()
    planner = "queryPlanner" in plan
    stages = _stages(plan.get("queryPlanner", {}).get("winningPlan", {}))
    samples = []
    for _ in range(50):
        token = secrets.token_hex(8)
        began = time.perf_counter()
        now = clock.now()
        update = claims.claim_update(now, now + timedelta(seconds=30), token, "b")
        doc = store.claim("claims", claims.ClaimRequest({"phase": "Work"}, now, 3600.0, update))
        samples.append(time.perf_counter() - began)
        if doc is not None:
            store.write(
                "claims", lease_writes.fenced(doc["_id"], token), lease_writes.release_update()
            )
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
