"""``MONGODB_URI=... uv run python -m bench relocks [--documents 200] [--seconds 20]
[--replicas 2] [--out FILE.json]``: what replicas send while many documents relock on
spread-out waits (certificates waiting for DNS), per replica per second, by command kind.

Each replica is an ``AsyncOrchestrator`` on its own ``AsyncMongoClient``, whose commands a
``CommandListener`` counts. ``--documents`` documents each relock ``RELOCKS`` times with a
wait drawn from ``WAITS`` seconds (a seeded draw), then advance; a second handler on another
phase makes the probe cover more than one handler. Counted over ``--seconds`` from the
last submit: probes (``aggregate``), claims and carrying writes (``findAndModify``), other
writes (``update``), and all commands, with probes per tick (a replica ticks every
``tick`` seconds). A probe per distinct due time shows as probes per tick well above one.

Nothing is asserted: the figures are the server's and the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient, monitoring

from bench import server_uri
from orchestrator import AsyncLease, AsyncOrchestrator, Outcome

RELOCKS = 4
"""How many times each document relocks before it advances."""

WAITS = (1.0, 10.0)
"""The range of each relock's wait, seconds."""

TICK = 1.0
COLLECTION = "certificates"


class _Counts(monitoring.CommandListener):
    """The commands one client sends, by name, while ``on`` is set."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.on = False

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on:
            self.counts[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        return None

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        return None


def _replica(uri: str, db: str, name: str, seed: int) -> tuple[AsyncOrchestrator, _Counts]:
    counts = _Counts()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[counts])
    orch = AsyncOrchestrator(client[db], replica_id=name, tick=TICK)
    draw = random.Random(seed)

    @orch.phase(COLLECTION, "Waiting")
    async def wait(lease: AsyncLease[Any]) -> Outcome:
        relocks = int(lease.doc.get("relocks", 0))
        if relocks >= RELOCKS:
            return await lease.advance("Ready")
        return await lease.relock(draw.uniform(*WAITS))

    @orch.phase(COLLECTION, "Ready")
    async def ready(lease: AsyncLease[Any]) -> Outcome:
        return await lease.advance("Done")

    return orch, counts


async def run(uri: str, documents: int, seconds: float, replicas: int) -> dict[str, Any]:
    db = f"bench_relocks_{os.getpid()}"
    fleet = [_replica(uri, db, f"replica-{n}", n) for n in range(replicas)]
    for orch, _ in fleet:
        await orch.start()
    submitter = fleet[0][0]
    for n in range(documents):
        await submitter.submit(COLLECTION, {"n": n, "phase": "Waiting"})
    # Counted once every document is in: the steady state of waits ending one by one.
    for _, counts in fleet:
        counts.on = True
    await asyncio.sleep(seconds)
    for _, counts in fleet:
        counts.on = False
    for orch, _ in fleet:
        await orch.stop()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    finished = await client[db][COLLECTION].count_documents({"phase": "Done"})
    await client.drop_database(db)
    await client.close()
    rows = []
    for orch, counts in fleet:
        total = sum(counts.counts.values())
        rows.append(
            {
                "replica": orch.settings.replica_id,
                "per_second": {k: v / seconds for k, v in sorted(counts.counts.items())},
                "all_per_second": total / seconds,
                "probes_per_tick": counts.counts["aggregate"] / (seconds / TICK),
            }
        )
    return {"documents": documents, "seconds": seconds, "finished": finished, "replicas": rows}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench relocks", description=__doc__)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    uri = server_uri("relocks")
    if uri is None:
        return 2
    result = asyncio.run(run(uri, args.documents, args.seconds, args.replicas))
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0
