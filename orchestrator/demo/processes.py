"""The demo's replicas as separate OS processes, as the pods of a deployment run.

``orchestrator demo --processes N`` (with a real server) starts N copies of this module,
each one replica of the gateway workflow, an ``AsyncOrchestrator`` run by ``asyncio.run``
(the workflow is written once, async). They share nothing but the database: each
publishes its step counts (and, when it stops, its final report) to the
``demoReplicas`` collection, where the demo's display and report read them.
SIGTERM stops a replica as ``orchestrator run`` does, through the loop's signal handler.
The server's URI reaches them in ``MONGODB_URI``, never on a command line that ``ps`` shows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.steps import started
from orchestrator.demo.logs import quiet_logs
from orchestrator.demo.run import DemoOptions
from orchestrator.mongo import connect_async

if TYPE_CHECKING:
    from orchestrator.demo.workflows.gateway import Platform

REPLICAS = "demoReplicas"
"""One document per replica process: its step counts, then its final report."""

PUBLISH_EVERY = 0.5
STOP_TIMEOUT = 20.0


class Processes:
    """The parent's handle on the replica processes (the demo's ``Fleet``)."""

    def __init__(self, platform: Platform, options: DemoOptions) -> None:
        self.platform = platform
        self._options = options
        self._reports = platform.db[REPLICAS]
        self._names = [f"replica-{n + 1}" for n in range(options.processes)]
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stderr = Path(tempfile.mkdtemp(prefix="orchestrator-demo-"))

    def describe(self) -> str:
        return f"{len(self._names)} replica processes"

    async def start(self) -> None:
        await self._reports.drop()
        # The collections and their indexes exist before anyone counts them, as after a
        # deployment's migration; the replicas' own start() finds them done.
        await self.platform.orch.ensure_indexes()
        options = self._options
        env = {**os.environ, "MONGODB_URI": str(options.uri)}
        for name in self._names:
            argv = [
                sys.executable,
                "-m",
                "orchestrator.demo.processes",
                f"--db={self.platform.db.name}",
                f"--replica-id={name}",
                f"--tick={options.tick}",
                f"--lock-timeout={options.lock_timeout}",
                f"--cert-delay={options.cert_delay}",
                f"--fail-rate={options.fail_rate}",
                f"--seed={options.seed}",
            ]
            if options.log_file is not None:
                argv.append(f"--log-file={options.log_file}")
            with open(self._stderr / name, "wb") as errors:  # the child keeps it open
                self._procs[name] = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=errors, stderr=errors
                )

    def submitters(self) -> list[Platform]:
        return [self.platform]

    async def _published(self) -> dict[str, Mapping[str, Any]]:
        return {str(doc["_id"]): doc async for doc in self._reports.find({})}

    async def steps(self) -> int:
        published = await self._published()
        return sum(started(_counts(doc.get("stats"))) for doc in published.values())

    def trouble(self) -> str | None:
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                return f"{name} (pid {proc.pid}) exited with {code}: {self._last_words(name)}"
        return None

    async def stop(self) -> list[str]:
        wrong: list[str] = []
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for name, proc in self._procs.items():
            try:
                code = await asyncio.to_thread(proc.wait, max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
                wrong.append(f"{name} did not stop within {STOP_TIMEOUT:g}s and was killed")
                continue
            if code != 0:
                wrong.append(f"{name} exited with {code}: {self._last_words(name)}")
        published = await self._published()
        for name in self._names:
            report = published.get(name, {})
            if not report.get("stopped"):
                wrong.append(f"{name} left no final report")
            elif report.get("stillRunning"):
                wrong.append(f"{name}: {report['stillRunning']} steps still running at stop")
        shutil.rmtree(self._stderr, ignore_errors=True)
        return wrong

    def _last_words(self, name: str) -> str:
        """The last line a child wrote (a traceback ends with its exception)."""
        lines = (self._stderr / name).read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(nothing on stderr)"

    async def stats(self) -> list[tuple[str, Mapping[str, int]]]:
        published = await self._published()
        return [(name, dict(published.get(name, {}).get("stats", {}))) for name in self._names]


def main(argv: Sequence[str] | None = None) -> int:
    """One replica process: run the workflow until SIGTERM, publishing its counts."""
    parser = argparse.ArgumentParser(prog="python -m orchestrator.demo.processes")
    parser.add_argument("--db", required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--tick", type=float, required=True)
    parser.add_argument("--lock-timeout", type=float, required=True)
    parser.add_argument("--cert-delay", type=float, required=True)
    parser.add_argument("--fail-rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--log-file", type=Path)
    args = parser.parse_args(argv)
    uri = os.environ.get("MONGODB_URI")
    if not uri:
        parser.error("MONGODB_URI is not set")
    return asyncio.run(_replica(args, uri))


async def _replica(args: argparse.Namespace, uri: str) -> int:
    from orchestrator.demo.workflows.gateway import Faults, build  # noqa: PLC0415

    db = await connect_async(uri, args.db, timeout=10)
    workflow = build(
        db,
        replica_id=args.replica_id,
        cert_delay=args.cert_delay,
        faults=Faults(args.fail_rate, args.seed),
        tick=args.tick,
        lock_timeout=args.lock_timeout,
    )
    orch = workflow.orch
    reports = db[REPLICAS]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with quiet_logs(args.log_file):
        await orch.start()
        fields: dict[str, Any] = {"pid": os.getpid()}
        while not await _wait(stop, PUBLISH_EVERY):
            fields["stats"] = orch.stats()
            await reports.update_one({"_id": args.replica_id}, {"$set": fields}, upsert=True)
        report = await orch.stop(timeout=10)
    fields.update(stillRunning=len(report.still_running))
    fields.update(stats=orch.stats(), stopped=True)
    await reports.update_one({"_id": args.replica_id}, {"$set": fields}, upsert=True)
    return 0


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` was set within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())


def _counts(stats: object) -> dict[str, int]:
    """A published ``stats()``, its counts as numbers (what is not one counts 0)."""
    if not isinstance(stats, Mapping):
        return {}
    return {str(k): v for k, v in stats.items() if isinstance(v, int) and not isinstance(v, bool)}
