"""Service times of a store, measured, as the model's server parameters (``bench.model``).

A replica of the real engine drains ``docs`` documents of three steps alone (one worker,
so no command waits for another), through a ``CountingDatabase`` whose meter keeps the
seconds of each kind of operation; a probe and a claim by ``_id`` are then timed on the
same collection. The in-memory store serves one request at a time under one lock inside
the replicas' own interpreter: its server is one core with one ticket, no round trip, no
conflicts (nothing runs beside a write) and no replication, and the library's own work
per step, which shares that interpreter, is carried by the step's outcome write.
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from functools import partial
from typing import Any, cast

from pymongo.database import Database

from bench.figures import THREE, _drained, _fill, _simulate, replica
from bench.instrument import CountingDatabase, Meter
from bench.model import Params
from bench.workloads import Tally, chain, finishing, register
from orchestrator.core.queries import claims, lease_writes
from orchestrator.mongo import Store
from orchestrator.testing import FakeClock, memory_database

CALIBRATION_DOCS = 2000
"""The size of the benchmark's batch (figure 4): the in-memory claim scans every document
of its collection, so its cost is measured at the size it is to reproduce."""
SAMPLES = 200


def batch(
    docs: int, replicas: int, concurrency: int, database: Any = None
) -> tuple[dict[str, Any], tuple[Any, Any]]:
    """Figure 4's batch (``docs`` x 3 steps) drained by ``replicas`` replicas of the real
    engine (one tick, as ``run_once``) on ``database`` (a pymongo one) or the in-memory
    store: wall and process CPU seconds, and the operations."""
    clock = FakeClock()
    meter = Meter()
    raw = memory_database(clock=clock) if database is None else database
    db = CountingDatabase(raw, meter)
    tally = Tally()
    steps = finishing(chain("batch", THREE), tally)
    seeder = replica(db, clock, "seed", clock_refresh=1e6)
    _fill(seeder, docs, THREE[0], "batch")
    runs = []
    for n in range(replicas):
        orch = replica(db, clock, f"pod-{n}", clock_refresh=1e6, max_concurrency=concurrency)
        register(orch, steps)
        orch.ensure_indexes()
        runs.append(orch.run_once)
    meter.reset()
    began, cpu = time.perf_counter(), time.process_time()
    _simulate(runs, clock, partial(_drained, tally, docs))
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    ops, in_db = meter.snapshot()
    return {"seconds": wall, "cpu_seconds": cpu, "in_db": in_db, "ops": ops}, (db, clock)


def measure(docs: int = CALIBRATION_DOCS, database: Any = None) -> dict[str, Any]:
    """Drain ``docs`` x 3 steps with one replica at concurrency 1 on ``database`` (or the
    in-memory store): the library's own time per step outside the store; then time each
    kind of command on the drained collection (as many documents, all free): the old
    probe (a ``find``), the tick's probe (``Store.probe``), the sorted claim (with nothing
    to sort, and with every document to sort: these stores have no claim index, so a
    claim's cost grows with its queue), the claim by ``_id`` and the fenced release.

    With the store in this process each time is its CPU time (everything here runs on
    the one interpreter, and on a shared machine the process also waits for a core,
    which is no cost of the store's); with a server in another process, its wall time
    less a ``ping``'s, the round trip."""
    run, (db, clock) = batch(docs, 1, 1, database)
    local = database is None
    wall, cpu = run["seconds"], run["cpu_seconds"]
    # The store's share of the drain's time in database calls: all of the process's CPU
    # time here; for a server elsewhere, what this process did not spend itself.
    share = min(1.0, cpu / wall) if local else 1.0
    steps = run["ops"].get("update_one", 0) + run["ops"].get("find_one_and_update", 0) - docs
    store = Store(cast(Database[Any], db), "majority")
    collection = db["batch"]
    groups = [("batch", [({"phase": p}, None) for p in THREE])]
    now = store.server_time() or clock.now()
    timed: dict[str, float] = {}

    def timing(name: str, calls: int, call: Any) -> None:
        started, used = time.perf_counter(), time.process_time()
        for _ in range(calls):
            call()
        took, used = time.perf_counter() - started, time.process_time() - used
        timed[name] = took * (min(1.0, used / took) if local else 1.0) / calls * 1e3

    # A server elsewhere: the round trip is a ping's time (the client's work, the
    # network, the server reading and answering), which replicas' commands overlap.
    rtt = 0.0
    if not local:
        timing("rtt_ms", SAMPLES, lambda: db.command("ping"))
        rtt = timed["rtt_ms"]

    # The probes find nothing (every document is done): an idle tick's read, which scans.
    old_probe = claims.probe_filter(groups[0][1], now, 3600.0)
    timing("probe_ms", SAMPLES // 4, lambda: collection.find_one(old_probe, {"_id": 1}))
    timing("aggregate_ms", SAMPLES // 4, lambda: store.probe(groups, now, 3600.0))
    claimed: list[dict[str, Any]] = []

    def claim() -> None:
        update = claims.claim_update(now, now + timedelta(seconds=30), secrets.token_hex(8), "c")
        doc = store.claim("batch", claims.ClaimRequest({"phase": "Done"}, now, 3600.0, update))
        if doc is not None:
            claimed.append(doc)

    timing("claim_all_free_ms", SAMPLES, claim)

    def claim_none() -> None:
        update = claims.claim_update(now, now + timedelta(seconds=30), secrets.token_hex(8), "c")
        store.claim("batch", claims.ClaimRequest({"phase": "Fetch"}, now, 3600.0, update))

    timing("claim_ms", SAMPLES // 4, claim_none)  # nothing to sort: what every claim pays
    releases = iter(claimed)

    def release() -> None:
        doc = next(releases)
        store.write("batch", lease_writes.fenced(doc["_id"], doc["lockToken"]), {"$set": {"n": 1}})

    timing("release_ms", len(claimed), release)
    free = collection.find({"phase": "Done", "n": {"$exists": False}}, {"_id": 1})
    ids = iter([d["_id"] for d in free.limit(SAMPLES)])

    def claim_by_id() -> None:
        update = claims.claim_update(now, now + timedelta(seconds=30), secrets.token_hex(8), "c")
        collection.find_one_and_update(
            {"_id": next(ids), **claims.claim_filter({"phase": "Done"}, now, 3600.0)}, update
        )

    timing("claim_by_id_ms", SAMPLES // 2, claim_by_id)
    # A claim sorts every document its filter matches (here: all of them, but those the
    # loop above took as it went): the cost of each, beyond the claim's own.
    matched = docs - SAMPLES / 2
    timed["sort_ms_per_match"] = max(timed["claim_all_free_ms"] - timed["claim_ms"], 0.0) / matched
    for name in ("probe_ms", "aggregate_ms", "release_ms", "claim_by_id_ms", "claim_ms"):
        timed[name] = max(timed[name] - rtt, 0.0)
    return {
        **timed,
        "outside_ms_per_step": (wall - run["in_db"]) / max(steps, 1) * 1e3 * share,
        "share": share,
        "steps": steps,
        "docs": docs,
        **run,
    }


def memory_params(measured: dict[str, Any]) -> Params:
    """The in-memory store as the model's server (see the module's docstring)."""
    return _serial(measured, measured["outside_ms_per_step"])


def wire_params(measured: dict[str, Any]) -> Params:
    """A wire-protocol server that serves one request at a time (CI's mongoeco): one core,
    one ticket, a ``ping``'s time as the round trip, and the library's own work left
    out (it runs in the replicas' processes, beside the server)."""
    return _serial(measured, 0.0)


def _serial(measured: dict[str, Any], per_step_ms: float) -> Params:
    """``per_step_ms``: added to the two writes a step ends with (a release, or a
    findAndModify by ``_id`` that carries the lease on)."""
    return Params(
        rtt_ms=round(measured.get("rtt_ms", 0.0), 4),
        service_ms={
            "read": round(measured["probe_ms"], 4),
            "aggregate": round(measured["aggregate_ms"], 4),
            "claim_sorted": round(measured["claim_ms"], 4),
            "claim_targeted": round(measured["claim_by_id_ms"] + per_step_ms, 4),
            "update": round(measured["release_ms"] + per_step_ms, 4),
        },
        conflict_window_ms=0.0,
        majority_commit_ms=0.0,
        write_tickets=1,
        cores=1,
    )
