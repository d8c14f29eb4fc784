"""``MONGODB_URI=... uv run python -m bench schedules [--seconds 120] [--replicas 3]
[--kill-at 40] [--down 15] [--tick 1] [--lock-timeout 10] [--work 0.3] [--out FILE.json]``:
a fleet of replica processes runs five schedules, one replica is killed and restarted, and
every fire time due in the run is accounted for from the database afterwards.

Each replica is a process (``python -m bench.schedules --replica NAME ...``) running a
threaded ``Orchestrator`` that declares the same ``SCHEDULES`` (every 1 s, 2 s and 5 s, a
seconds cron in a named timezone, and one every 3 s that an operator paused before the
run, through ``queries.schedules.pause_update``) and the step of their runs (a sleep of
up to twice ``--work``). A listener records every ``ScheduleFiredEvent`` in ``fires``, so
a fire with no document can be told skipped or missed from one silently dropped.

The run's window is from the moment every replica is up to ``--seconds`` later; at
``--kill-at`` seconds into it one replica gets SIGKILL (mid-step or not: whatever it held
waits for its lease to expire) and comes back ``--down`` seconds later. Afterwards, for
each schedule, every fire time its stored spec has in the window is classified: started
(its document exists), skipped, missed, other (failed, declined, coalesced, still
buffered), paused, or absent (none of these: the goal is 0), with duplicates (two
documents for one fire time, or a document whose ``_id`` is not the fire's: goal 0) and
the lag from each fire time to its document's ``createdAt`` (p50, p99). Nothing is
asserted here: ``tests/test_bench.py`` checks the accounting.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database

from bench import server_uri
from orchestrator import Lease, Listener, Orchestrator, ScheduleFiredEvent
from orchestrator.core.fire_times import fires_between
from orchestrator.core.queries import schedules as schedule_queries
from orchestrator.core.schedules import SCHEDULED_FIELD, run_id, spec_of

RUNS = "runs"
FIRES = "fires"
"""Every ``ScheduleFiredEvent`` of every replica, one document each."""
READY = "replicas"
"""One document per replica process: its pid once its orchestrator has started."""
PAUSED = "paused-3s"
OTHER = ("failed", "declined", "coalesced", "buffered")
"""Results of a fire that started no document, besides skipped and missed."""


@dataclass(frozen=True)
class Declared:
    name: str
    every: float | None = None
    cron: str | None = None
    timezone: str = "UTC"
    overlap: str = "skip"


SCHEDULES = (
    Declared("every-1s", every=1),
    Declared("every-2s", every=2, overlap="buffer_one"),
    Declared("every-5s", every=5, overlap="allow_all"),
    Declared("cron-15s", cron="*/15 * * * * *", timezone="America/New_York"),
    Declared(PAUSED, every=3),
)


class Recorder(Listener):
    """Writes each fire event to ``fires`` (from the step's own thread: a record is in
    before the schedule's document moves on, so a killed replica loses none)."""

    def __init__(self, fires: Collection[dict[str, Any]]) -> None:
        self._fires = fires

    def schedule_fired(self, event: ScheduleFiredEvent) -> None:
        self._fires.insert_one(
            {
                "replica": event.replica,
                "schedule": event.schedule,
                "fire": event.fire,
                "result": event.result,
                "count": event.count,
                "lag": event.lag,
                "run": event.run,
            }
        )


def declare(orch: Orchestrator, work: float) -> None:
    """The schedules and the step of their runs, as every replica declares them."""
    for declared in SCHEDULES:
        orch.schedule(
            declared.name,
            RUNS,
            every=declared.every,
            cron=declared.cron,
            timezone=declared.timezone,
            overlap=declared.overlap,
        )(_fire)

    @orch.phase(RUNS, "Run")
    def run(lease: Lease[Any]) -> Any:
        time.sleep(random.Random(str(lease.id)).uniform(0, 2 * work))
        return lease.advance("Done", by=orch.replica_id)


def _fire(fire: datetime) -> dict[str, Any]:
    return {"phase": "Run"}


# -- the fleet -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    seconds: float = 120.0
    replicas: int = 3
    kill_at: float = 40.0
    down: float = 15.0
    tick: float = 1.0
    lock_timeout: float = 10.0
    work: float = 0.3


class Fleet:
    """The replica processes, started, killed and restarted by name."""

    def __init__(self, uri: str, db: Database[dict[str, Any]], options: Options) -> None:
        self._env = {**os.environ, "MONGODB_URI": uri}
        self._db = db
        self._options = options
        self._logs = Path(tempfile.mkdtemp(prefix="bench-schedules-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        o = self._options
        argv = [
            sys.executable,
            "-m",
            "bench.schedules",
            f"--replica={name}",
            f"--db={self._db.name}",
            f"--tick={o.tick}",
            f"--lock-timeout={o.lock_timeout}",
            f"--work={o.work}",
        ]
        with open(self._logs / name, "ab") as log:  # the child keeps it open
            self.procs[name] = subprocess.Popen(
                argv, env=self._env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every process has started its orchestrator (published its pid)."""
        deadline = time.monotonic() + timeout
        while True:
            ready = {doc["_id"]: doc.get("pid") for doc in self._db[READY].find({})}
            if all(ready.get(name) == proc.pid for name, proc in self.procs.items()):
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {self._last(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replicas were not up within {timeout:g}s")
            time.sleep(0.1)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()  # SIGKILL: no stop, no release, whatever it held waits for its lease
        proc.wait()

    def stop(self) -> list[str]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        wrong = []
        for name, proc in self.procs.items():
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = -9
            if code != 0:
                wrong.append(f"{name} exited with {code}: {self._last(name)}")
        return wrong

    def _last(self, name: str) -> str:
        lines = (self._logs / name).read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(nothing on stderr)"


def run(uri: str, options: Options) -> dict[str, Any]:
    """Run the fleet against ``uri`` and account for every fire time of its window."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    db = client[f"bench_schedules_{os.getpid()}"]
    try:
        # The schedules' documents exist, and one is paused, before any replica starts.
        setup = Orchestrator(db, replica_id="setup", lock_timeout=options.lock_timeout)
        declare(setup, options.work)
        setup.ensure_indexes()
        db[setup.settings.schedules_collection].update_one(
            {"_id": PAUSED}, schedule_queries.pause_update(True)
        )
        fleet = Fleet(uri, db, options)
        names = [f"replica-{n + 1}" for n in range(options.replicas)]
        for name in names:
            fleet.start(name)
        fleet.wait_ready()
        setup.measure_clock()
        start = setup.clock.now()
        began = time.monotonic()
        victim = names[-1]
        _sleep_until(began + options.kill_at)
        fleet.kill(victim)
        killed = setup.clock.now()
        _sleep_until(began + options.kill_at + options.down)
        fleet.start(victim)
        fleet.wait_ready()
        restarted = setup.clock.now()
        _sleep_until(began + options.seconds)
        end = setup.clock.now()
        # Fires due by the end get their ticks to start before anyone stops.
        time.sleep(2 * options.tick + options.work * 2 + 1)
        wrong = fleet.stop()
        rows = account(db, start, end, setup.settings.schedules_collection)
    finally:
        client.drop_database(db.name)
        client.close()
    return {
        "options": options.__dict__,
        "window": {"start": start.isoformat(), "end": end.isoformat()},
        "killed": {"replica": victim, "at": killed.isoformat(), "back": restarted.isoformat()},
        "stop_problems": wrong,
        "rows": rows,
    }


def _sleep_until(moment: float) -> None:
    time.sleep(max(moment - time.monotonic(), 0.0))


# -- the accounting --------------------------------------------------------------------------


def account(
    db: Database[dict[str, Any]], start: datetime, end: datetime, schedules: str
) -> list[dict[str, Any]]:
    """For each schedule, its fire times in (``start``, ``end``] classified, its
    duplicates, and the lag of its starts; a last row sums them."""
    rows = []
    events: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for event in db[FIRES].find({}):
        events[event["schedule"]].append(event)
    for doc in db[schedules].find({}).sort("_id"):
        name = doc["_id"]
        spec = spec_of(name, doc["spec"])
        due, _ = fires_between(spec.times, start, end, 10**6)
        runs = list(db[spec.collection].find({f"{SCHEDULED_FIELD}.name": name}))
        per_fire = Counter(_utc(r[SCHEDULED_FIELD]["fire"]) for r in runs)
        created = {_utc(r[SCHEDULED_FIELD]["fire"]): _utc(r["createdAt"]) for r in runs}
        said = _results(events[name], due)
        kinds: Counter[str] = Counter()
        lags = []
        for fire in due:
            if per_fire[fire]:
                kinds["started"] += 1
                lags.append((created[fire] - fire).total_seconds())
            elif said.get(fire) in ("skipped", "missed"):
                kinds[said[fire]] += 1
            elif said.get(fire) in OTHER:
                kinds["other"] += 1
            elif doc.get("paused") is True and fire not in said:
                kinds["paused"] += 1
            else:
                kinds["absent"] += 1
        rows.append(
            {
                "schedule": name,
                "spec": f"{spec.describe()}, {spec.overlap.value}",
                "due": len(due),
                **{k: kinds[k] for k in ("started", "skipped", "missed", "other", "paused")},
                "absent": kinds["absent"],
                "duplicates": sum(1 for n in per_fire.values() if n > 1),
                "wrong_ids": sum(
                    1 for r in runs if r["_id"] != run_id(name, _utc(r[SCHEDULED_FIELD]["fire"]))
                ),
                "lags": lags,
            }
        )
    total: dict[str, Any] = {"schedule": "all", "spec": ""}
    for key in ("due", "started", "skipped", "missed", "other", "paused", "absent"):
        total[key] = sum(r[key] for r in rows)
    total["duplicates"] = sum(r["duplicates"] for r in rows)
    total["wrong_ids"] = sum(r["wrong_ids"] for r in rows)
    total["lags"] = [lag for r in rows for lag in r["lags"]]
    rows.append(total)
    for row in rows:
        lags = sorted(row.pop("lags"))
        row["lag_p50_ms"] = _percentile(lags, 50)
        row["lag_p99_ms"] = _percentile(lags, 99)
    return rows


def _results(events: Sequence[Mapping[str, Any]], due: Sequence[datetime]) -> dict[datetime, str]:
    """What the events said of each fire of ``due`` (a missed event stands for ``count``
    fire times ending at its own; the first word on a fire stands)."""
    index = {fire: n for n, fire in enumerate(due)}
    found: dict[datetime, str] = {}
    for event in events:
        fire = _utc(event["fire"])
        if fire not in index:
            continue
        if event["result"] == "missed":
            last = index[fire]
            for n in range(max(last - int(event["count"]) + 1, 0), last + 1):
                found.setdefault(due[n], "missed")
        else:
            found.setdefault(fire, event["result"])
    return found


def _percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank, in milliseconds; None without values."""
    if not values:
        return None
    rank = max(math.ceil(p / 100 * len(values)), 1)
    return round(values[rank - 1] * 1000, 1)


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


COLUMNS = (
    ("schedule", "schedule"),
    ("spec", "spec, overlap"),
    ("due", "due"),
    ("started", "started"),
    ("skipped", "skipped"),
    ("missed", "missed"),
    ("other", "other"),
    ("paused", "paused"),
    ("absent", "absent (goal 0)"),
    ("duplicates", "duplicates (goal 0)"),
    ("wrong_ids", "wrong _id (goal 0)"),
    ("lag_p50_ms", "lag p50 ms"),
    ("lag_p99_ms", "lag p99 ms"),
)


def markdown(result: Mapping[str, Any]) -> str:
    """The table, with the run's shape in a line above it."""
    o, k = result["options"], result["killed"]
    lines = [
        f"{o['replicas']} replica processes, {o['seconds']:g} s from {result['window']['start']};"
        f" {k['replica']} killed (SIGKILL) at {o['kill_at']:g} s, back {o['down']:g} s later;"
        f" tick {o['tick']:g} s, lock_timeout {o['lock_timeout']:g} s, runs of up to"
        f" {2 * o['work']:g} s",
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in result["rows"]:
        cells = ["-" if row[key] is None else str(row[key]) for key, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    for problem in result["stop_problems"]:
        lines.append(f"\nstop: {problem}")
    return "\n".join(lines) + "\n"


# -- the commands ----------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench schedules", description=__doc__)
    defaults = Options()
    parser.add_argument("--seconds", type=float, default=defaults.seconds)
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--kill-at", type=float, default=defaults.kill_at)
    parser.add_argument("--down", type=float, default=defaults.down)
    parser.add_argument("--tick", type=float, default=defaults.tick)
    parser.add_argument("--lock-timeout", type=float, default=defaults.lock_timeout)
    parser.add_argument("--work", type=float, default=defaults.work)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    uri = server_uri("schedules")
    if uri is None:
        return 2
    options = Options(
        seconds=args.seconds,
        replicas=args.replicas,
        kill_at=args.kill_at,
        down=args.down,
        tick=args.tick,
        lock_timeout=args.lock_timeout,
        work=args.work,
    )
    result = run(uri, options)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(markdown(result))
    return 0


def replica(argv: Sequence[str]) -> int:
    """One replica process: its orchestrator started until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.schedules")
    parser.add_argument("--replica", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--tick", type=float, required=True)
    parser.add_argument("--lock-timeout", type=float, required=True)
    parser.add_argument("--work", type=float, required=True)
    args = parser.parse_args(argv)
    client: MongoClient[dict[str, Any]] = MongoClient(os.environ["MONGODB_URI"])
    db = client[args.db]
    orch = Orchestrator(
        db,
        replica_id=args.replica,
        tick=args.tick,
        lock_timeout=args.lock_timeout,
        listeners=[Recorder(db[FIRES])],
    )
    declare(orch, args.work)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    orch.start()
    db[READY].update_one({"_id": args.replica}, {"$set": {"pid": os.getpid()}}, upsert=True)
    stop.wait()
    orch.stop(timeout=10)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(replica(sys.argv[1:]))
