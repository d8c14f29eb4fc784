"""Service times of a store, measured, as the model's server parameters (``bench.model``).

A replica of the real engine drains ``docs`` documents of three steps alone (one worker,
so no command waits for another), through a ``CountingDatabase`` whose meter keeps the
seconds of each kind of operation; a probe and a claim by ``_id`` are then timed on the
same collection. The in-memory store serves one request at a time under one lock inside
the replicas' own interpreter: its server is one core with one ticket, no round trip, no
conflicts (nothing runs beside a write) and no replication, and the library's own work
per step, which shares that interpreter, is carried by the release's time.
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
from orchestrator.core import queries
from orchestrator.mongo import Store
from orchestrator.testing import FakeClock, memory_database

CALIBRATION_DOCS = 2000
"""The size of the benchmark's batch (figure 4): the in-memory claim scans every document
of its collection, so its cost is measured at the size it is to reproduce."""
SAMPLES = 200


class TimingMeter(Meter):
    """A ``Meter`` that also keeps the seconds of each kind of operation."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds_by: dict[str, float] = {}

    def record(self, name: str, seconds: float) -> None:
        super().record(name, seconds)
        with self._lock:
            self.seconds_by[name] = self.seconds_by.get(name, 0.0) + seconds

    def reset(self) -> None:
        super().reset()
        with self._lock:
            self.seconds_by.clear()

    def mean_ms(self, name: str) -> float:
        with self._lock:
            return self.seconds_by.get(name, 0.0) / max(self.ops[name], 1) * 1e3


def batch(
    docs: int, replicas: int, concurrency: int, database: Any = None
) -> tuple[dict[str, Any], Any]:
    """Figure 4's batch (``docs`` x 3 steps) drained by ``replicas`` replicas of the real
    engine (one tick, as ``run_once``) on ``database`` (a pymongo one) or the in-memory
    store: wall and process CPU seconds, and the operations."""
    clock = FakeClock()
    meter = TimingMeter()
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
    return {"seconds": wall, "cpu_seconds": cpu, "in_db": in_db, "ops": ops}, (db, clock, meter)


def measure(docs: int = CALIBRATION_DOCS, database: Any = None) -> dict[str, Any]:
    """Drain ``docs`` x 3 steps with one replica at concurrency 1 on ``database`` (or the
    in-memory store), then time the probe, the claim by ``_id`` and the read on the
    drained collection.

    Each time is scaled by the run's CPU seconds over its wall seconds when the store is
    in this process: on a shared machine the process waits for a core now and then, which
    is no cost of the store's (everything here runs on the one interpreter, so CPU time
    is its work). A server in another process is timed as the client sees it."""
    run, (db, clock, meter) = batch(docs, 1, 1, database)
    local = database is None
    busy = min(1.0, run["cpu_seconds"] / run["seconds"]) if local else 1.0
    step_count = run["ops"].get("update_one", 0)
    drain = {
        "claim_ms": meter.mean_ms("find_one_and_update") * busy,
        "release_ms": meter.mean_ms("update_one") * busy,
        "outside_ms_per_step": (run["seconds"] - run["in_db"]) / max(step_count, 1) * 1e3 * busy,
        "busy": busy,
        "steps": step_count,
        **run,
    }
    store = Store(cast(Database[Any], db), "majority")
    collection = db["batch"]
    ids = [d["_id"] for d in collection.find({}, {"_id": 1}).limit(SAMPLES)]
    handlers = [({"phase": p}, None) for p in THREE]
    meter.reset()
    now = store.server_time() or clock.now()
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(SAMPLES // 4):
        store.has_claimable("batch", handlers, now, 3600.0)
    for doc_id in ids:
        update = queries.claim_update(now, now + timedelta(seconds=30), secrets.token_hex(8), "c")
        collection.find_one_and_update(
            {"_id": doc_id, **queries.claim_filter({"phase": "Done"}, now, 3600.0)}, update
        )
    if local:
        busy = min(1.0, (time.process_time() - cpu) / (time.perf_counter() - began))
    return {
        **drain,
        "probe_ms": meter.mean_ms("find_one") * busy,
        "claim_by_id_ms": meter.mean_ms("find_one_and_update") * busy,
        "docs": docs,
    }


def memory_params(measured: dict[str, Any]) -> Params:
    """The in-memory store as the model's server (see the module's docstring)."""
    return _serial(measured, measured["release_ms"] + measured["outside_ms_per_step"])


def wire_params(measured: dict[str, Any]) -> Params:
    """A wire-protocol server that serves one request at a time (CI's mongoeco): one core,
    one ticket; each command's time as the client saw it, round trip included, and the
    library's own work left out (it runs in the replicas' processes, beside the server)."""
    return _serial(measured, measured["release_ms"])


def _serial(measured: dict[str, Any], release_ms: float) -> Params:
    return Params(
        rtt_ms=0.0,
        service_ms={
            "read": round(measured["probe_ms"], 4),
            "aggregate": round(measured["probe_ms"], 4),  # one collection: one read
            "claim_sorted": round(measured["claim_ms"], 4),
            "claim_targeted": round(measured["claim_by_id_ms"], 4),
            "update": round(release_ms, 4),
        },
        conflict_window_ms=0.0,
        majority_commit_ms=0.0,
        write_tickets=1,
        cores=1,
    )
