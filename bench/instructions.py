"""``uv run python -m bench instructions [--docs N] [--out FILE.json]``: CPU instructions
per step, counted by valgrind's callgrind, for both engines and their bare loops.

Wall-clock ratios on a shared machine spread 0.55-1.43 from run to run; callgrind counts
the instructions a process executes, the same count for the same program and input
whatever else the machine does, so a change of a few percent per step shows. Each side
runs twice under callgrind, on the in-memory store, with ``N`` documents of three steps
at concurrency 1: once filling the documents only, once filling them and running every
step. The difference, divided by the steps, is the instructions per step (the
interpreter's start, the imports and the fill cancel out). The bare loops send the same
operations as the engine (a claim, then one write per step carrying the lease on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from bench.figures import abare_loop, bare_loop
from bench.workloads import counting, register, register_async
from orchestrator import AsyncOrchestrator, Orchestrator
from orchestrator.core.steps import started
from orchestrator.mongo import AsyncStore, Store
from orchestrator.testing import FakeClock, async_memory_database, memory_database

SIDES = ("threaded", "threaded-bare", "async", "async-bare")
STEPS_PER_DOC = 3

_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def target(side: str, docs: int, run: bool) -> int:
    """What runs under callgrind: fill ``docs`` documents, then (``run``) every step of
    them on ``side``; returns the steps run."""
    work = counting("items", "Count", STEPS_PER_DOC)
    clock = FakeClock()
    if side.startswith("threaded"):
        db = memory_database(clock=clock)
        orch = Orchestrator(db, clock=clock, replica_id="bench", max_concurrency=1)
        register(orch, [work])
        orch.ensure_indexes()
        for n in range(docs):
            orch.submit("items", {"phase": "Count", "seq": n})
        if not run:
            return 0
        if side == "threaded":
            orch.run_once()
            return started(orch.stats())
        return bare_loop(Store(cast(Database[Any], db)), work, clock)
    return asyncio.run(_async_target(side, docs, run, work, clock))


async def _async_target(side: str, docs: int, run: bool, work: Any, clock: FakeClock) -> int:
    db = async_memory_database(clock=clock)
    orch = AsyncOrchestrator(db, clock=clock, replica_id="bench", max_concurrency=1)
    register_async(orch, [work])
    await orch.ensure_indexes()
    for n in range(docs):
        await orch.submit("items", {"phase": "Count", "seq": n})
    if not run:
        return 0
    if side == "async":
        await orch.run_once()
        return started(orch.stats())
    return await abare_loop(AsyncStore(cast(AsyncDatabase[Any], db)), work, clock)


def count(side: str, docs: int, run: bool) -> int:
    """Instructions callgrind counts for ``target(side, docs, run)`` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.instructions",
            "--target",
            side,
            str(docs),
            "run" if run else "fill",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind failed for {side}: {done.stderr[-2000:]}")
        return total(out.read_text(errors="replace"))


def total(report: str) -> int:
    """The instruction total of a callgrind output file."""
    found = _TOTAL.search(report)
    if found is None:
        raise ValueError("no summary or totals line in the callgrind output")
    return int(found.group(1))


def measure(docs: int) -> dict[str, Any]:
    steps = docs * STEPS_PER_DOC
    rows = {}
    for side in SIDES:
        filled, ran = count(side, docs, False), count(side, docs, True)
        rows[side] = {"instructions_per_step": (ran - filled) / steps, "fill": filled, "run": ran}
    for engine in ("threaded", "async"):
        bare = rows[f"{engine}-bare"]["instructions_per_step"]
        rows[engine]["over_bare"] = rows[engine]["instructions_per_step"] / bare
    return {"documents": docs, "steps": steps, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Instructions per step (callgrind), {result['documents']} documents x "
        f"{STEPS_PER_DOC} steps, concurrency 1, in-memory store:",
        "",
        "| side | instructions per step | vs its bare loop |",
        "| --- | --- | --- |",
    ]
    for side, row in result["rows"].items():
        ratio = f"{row['over_bare']:.2f}x" if "over_bare" in row else "-"
        lines.append(f"| {side} | {row['instructions_per_step']:,.0f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--target"]:
        side, docs, mode = argv[1], int(argv[2]), argv[3]
        target(side, docs, mode == "run")
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench instructions")
    parser.add_argument("--docs", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    result = measure(args.docs)
    print(markdown(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
