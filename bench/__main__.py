"""``uv run python -m bench [--size tiny|small|full] [--out docs/benchmarks.md]``

Runs the figures side by side against the classic pattern (and figures 1, 2, 8 and 9 for
both engines, the threaded ``Orchestrator`` and the ``AsyncOrchestrator``) and prints the
Markdown table. Only with ``--out`` does it write files: the table there, the JSON results
and the PNG plot next to it (the committed ones are ``--size full --out docs/benchmarks.md``,
run on a quiet machine). ``full`` (the default) takes a few minutes; set MONGODB_URI to add
the real-server figure (7).

``uv run python -m bench contention`` is the contention benchmark on your own MongoDB
(``bench/contention.py``: its options with ``--help``); ``uv run python -m bench
instructions`` counts CPU instructions per step under callgrind (``bench/instructions.py``);
``uv run python -m bench scale`` is the fleet model (``bench/scale.py``), which writes
``docs/scale.md``; ``MONGODB_URI=... uv run python -m bench relocks`` counts what replicas
send while many documents relock on spread-out waits (``bench/relocks.py``);
``MONGODB_URI=... uv run python -m bench server-time`` is the server's time per command kind
and the history's document size (``bench/server_time.py``); ``MONGODB_URI=... uv run
python -m bench schedules`` runs a fleet of replica processes on five schedules, kills and
restarts one, and accounts for every fire time (``bench/schedules.py``); ``uv run python -m
bench trees`` counts what a child's completion costs and times the wakes of a parent and of
a signal (``bench/trees.py``; on ``MONGODB_URI``'s server too when set).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    contention,
    figures,
    instructions,
    relocks,
    report,
    scale,
    schedules,
    server_time,
    trees,
)


def run(size_name: str) -> dict[str, Any]:
    size = figures.SIZES[size_name]
    began = time.perf_counter()
    throughput = [figures.throughput(size, e, c) for e in figures.ENGINES for c in (1, 4)]
    results: dict[str, Any] = {
        "figures": {
            "throughput": throughput,
            "overhead": {e: figures.overhead(throughput, e) for e in figures.ENGINES},
            "latency": figures.multi_step_latency(size),
            "batch": figures.batch(size),
            "commands": figures.commands_per_step(size),
            "idle": figures.idle_cost(size),
            "pickup": figures.pickup(size),
            "intake": {e: figures.intake(size, e) for e in figures.ENGINES},
            "io_bound": figures.io_bound(size),
            "real_server": figures.real_server(size),
        },
    }
    real = results["figures"]["real_server"]
    results["meta"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "size": size_name,
        "machine": report.machine(),
        "store": f"the MONGODB_URI server {real['server']['name']} for figure 7, "
        "in-memory (orchestrator.testing) otherwise"
        if "rows" in real
        else "in-memory (orchestrator.testing.memory_database; its async view, "
        "async_memory_database, for the async engine)",
        "seconds": time.perf_counter() - began,
        "command": f"uv run python -m bench --size {size_name}",
    }
    return results


NOTES = [
    "Every ratio compares both sides on the same store in the same run. The in-memory "
    "store (mongomock behind a lock) costs ~0.4-4 ms per claim, 10-100x a localhost "
    "round trip to a real server, so it dominates figure 1 (both sides wait on it) and "
    "figure 2 is the meaningful per-step cost: the orchestrator's time outside database "
    "calls minus the bare loop's (which builds the same queries through the same "
    "instrumentation).",
    "Ticks of the classic pattern (figures 3, 4, 5) and the batch's ticks are simulated "
    "with a FakeClock: each tick's real work is measured and the next tick starts one "
    "second later, or when that work ends if it took longer. The classic pattern's jobs "
    "of one tick claim together, so a step waits for the next tick, as with one scheduled "
    "job per handler. Its six-step document is submitted just before a tick (its best "
    "case); the orchestrator's figures 3 and 6 run for real with `start()` and a 1 s tick.",
    "Figures 1 and 2 run each engine against a bare loop of the same operations (a claim "
    "for a document's first step, then one write per step that carries the lease on and "
    "pushes the step's history entry, as the engine's) on the same kind of store: threads"
    " on `Store` over `memory_database` for the threaded `Orchestrator`, asyncio tasks on"
    " `AsyncStore` over its async view for the `AsyncOrchestrator` (each async database "
    "call also gives the event loop a turn, as a round trip would, and the meter times it"
    " until its result is awaited). Each orchestrator run is paired with a bare run next "
    "to it, and the table shows the median of the pairs: other work on a shared machine "
    "stretches single runs by 2x either way (the spread is shown). The JSON keeps the CPU"
    " time per step of both sides too (`cpu_ratio`), which that other work does not "
    "stretch.",
    "Figure 2 is wall time outside database calls per step, minus the bare loop's, at "
    "concurrency 1. Both engines run a step in the worker that claimed it (no hand-off); "
    "what is left is the library's own work per step: the scheduler's decisions under "
    "the lock, the lease object, the outcome's update (field checks, the phase fence) and "
    "the counters.",
    "Figure 5 counts every command of a started replica (its ticks, heartbeats and "
    "record writes; its timer paused and its jobs run on a fake clock, a tick a second and "
    "a heartbeat every `lock_timeout / 6`): one probe per tick, an aggregation reading "
    "every handler's claim filter on every collection (`$limit` 1 each, joined by "
    "`$unionWith`) and the operators' pauses; it claims only for the handlers it found "
    "work for; its one write is its record, every 10 s. The clock's `hello` (one a minute) "
    "is shown apart. Its last row declares 100 schedules too (daily, none due while counted): "
    "their documents are claimed by one more handler of the same probe, due at each "
    "schedule's next fire, so they add no command.",
    "Figure 10 counts every command the replicas send (claims, the writes that carry a "
    "lease on into the next step, releases, probes, the clock's `hello`; the submits are "
    "not counted) while 3 replicas drain workflows of 3 and of 5 steps. A workflow of n "
    "steps costs one claim and n writes, so (n + 1) / n commands per step at the least: "
    "1.33 for 3 steps, 1.2 for 5; the usual pattern sends a claim and a release per step.",
    "Figure 6, classic: a document waits for the next tick, half a tick on average.",
    "Figure 8 inserts the document through the database's sync face, as another process "
    "would (no local wake-up): the next tick finds it, within one tick.",
    "Figure 9: each document's step waits 50 ms (`await asyncio.sleep` in an `async def` "
    "handler; `time.sleep` in the threaded engine's), drained by one replica's `run_once`. "
    "The ceiling of each side is its slots / 50 ms; the async engine's 100 tasks share one "
    "event loop with the in-memory store, whose claims and writes (~0.5-1 ms each here) "
    "then bound it well below its ceiling. The issue sets no number for this figure: the "
    "goal shown is only that the async engine is faster.",
    "Figure 7 names the server it ran on as the server names itself (`buildInfo`'s version "
    "and gitVersion). A wire-protocol server that is not MongoDB (CI runs mongoeco) serves "
    "one request at a time and plans no query: its latencies are not MongoDB's, and where "
    "its `explain` has no `queryPlanner` the plan goal is n/a, not met or missed.",
]


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "contention": contention.main,
    "instructions": instructions.main,
    "scale": scale.main,
    "relocks": relocks.main,
    "server-time": server_time.main,
    "schedules": schedules.main,
    "trees": trees.main,
}
"""The benchmarks apart from the figures, by their first argument."""


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    command = COMMANDS.get(given[0]) if given else None
    if command is not None:
        return command(given[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--size", choices=sorted(figures.SIZES), default="full")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the table here and the .json/.png beside it (default: print only)",
    )
    args = parser.parse_args(given)
    results = run(args.size)
    text = report.markdown(results, NOTES)
    out: Path | None = args.out
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        report.write_json(results, out.with_suffix(".json"))
        report.plot(results, out.with_suffix(".png"))
        out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
