"""``MONGODB_URI=... uv run python -m bench server-time [--workflows 60] [--finished 0,300]
[--out FILE.json]``: where the server's time goes, per command kind, and how large the
history makes a document.

One ``AsyncOrchestrator`` with one worker runs ``--workflows`` workflows of 3 steps (each
step inserts a ledger entry, as an application's would, and advances), each submitted
once the one before finished, in a collection that also holds ``--finished`` documents
in a finished phase (each row one such count: what the server scans grows with them on a
server that plans no query). One worker and one client: the server answers one command
at a time, so a command's latency is its time on the server plus a round trip (``ping``
measures the round trip alone). Every command is classified by what it is:

- submit: the insert of a new document (an upsert on its unique keys);
- claim: the sorted ``findAndModify`` that takes a free document;
- carry: a step's outcome that carries its lease on into the next step;
- release: a step's outcome that frees the document (the last step of a workflow);
- extend: a heartbeat's (or a step start's) renewal;
- probe: the tick's ``aggregate``;
- record: the replica's record;
- other: anything else the library sent (the clock's ``hello``, indexes).

Then the document size: one document with ``history`` (20) entries whose errors carry
tracebacks of 4,000 characters, as ``bson.encode`` measures it, and the same with none:
every write rewrites the whole document on MongoDB's storage engine too.

Last, what the carrying write replaced (``replaced``): on one document among ``--finished``
finished ones, with 0, 2 and 20 step entries in its history, the server's median time of
a carry (an advance that takes the lease on into the next step) against the release and
the claim of the next step it does the work of, each built by the library's own queries.

Nothing is asserted: the figures are the server's and the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bson
from pymongo import AsyncMongoClient, MongoClient, ReturnDocument, WriteConcern, monitoring

from bench import server_uri
from orchestrator import AsyncLease, AsyncOrchestrator, Outcome
from orchestrator.core import history
from orchestrator.core.clock import bson_time
from orchestrator.core.names import REPLICAS_COLLECTION
from orchestrator.core.queries import claims, lease_writes
from orchestrator.core.resource import EPOCH

COLLECTION = "work"
NEXT = {"S1": "S2", "S2": "S3", "S3": "Done"}
KINDS = ("submit", "claim", "carry", "release", "extend", "probe", "record", "other")
TRACEBACK = 4000
"""Characters of each history entry's traceback in the document-size figure."""


def kind(name: str, command: Mapping[str, Any]) -> str | None:
    """What a command the library sent is (``KINDS``), or None: the application's own
    (the ledger)."""
    target = command.get(name)
    if target == "ledger":
        return None
    if target == REPLICAS_COLLECTION:
        return "record"
    if name == "findAndModify":
        return _found_and_modified(command)
    if name == "update":
        return _updated(command)
    return {"aggregate": "probe", "insert": "submit"}.get(name, "other")


def _found_and_modified(command: Mapping[str, Any]) -> str:
    if command.get("upsert"):
        return "submit"
    if "sort" in command:
        return "claim"
    return "carry" if "lockToken" in command.get("query", {}) else "other"


def _updated(command: Mapping[str, Any]) -> str:
    for update in command.get("updates", []):
        change = update.get("u", {})
        if "lockToken" in change.get("$unset", {}):
            return "release"
        if set(change.get("$set", {})) <= {"lockedUntil", "lockedAt"}:
            return "extend"
    return "other"


class _Commands(monitoring.CommandListener):
    """Each command's kind and latency, while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self._kinds: dict[int, str] = {}
        self.micros: dict[str, list[int]] = defaultdict(list)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        found = kind(event.command_name, event.command) if self.on else None
        if found is not None:
            self._kinds[event.request_id] = found

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        found = self._kinds.pop(event.request_id, None)
        if found is not None:
            self.micros[found].append(event.duration_micros)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._kinds.pop(event.request_id, None)


async def measure(uri: str, workflows: int, finished: int) -> dict[str, Any]:
    listener = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[listener])
    db = client[f"bench_server_time_{os.getpid()}_{finished}"]
    orch = AsyncOrchestrator(db, replica_id="bench", max_concurrency=1)
    done = asyncio.Event()

    for phase, following in NEXT.items():

        async def step(lease: AsyncLease[Any], following: str = following) -> Outcome:
            await db.ledger.insert_one({"job": lease.doc["n"], "step": lease.phase})
            outcome = await lease.advance(following)
            if following == "Done":
                done.set()
            return outcome

        orch.phase(COLLECTION, phase)(step)
    if finished:
        await db[COLLECTION].insert_many([{"n": -1 - n, "phase": "Done"} for n in range(finished)])
    await orch.start()
    pings = []
    for _ in range(20):
        began = time.perf_counter()
        await db.command("ping")
        pings.append(time.perf_counter() - began)
    listener.on = True
    began = time.perf_counter()
    for n in range(workflows):
        done.clear()
        await orch.submit(COLLECTION, {"n": n, "phase": "S1"})
        await done.wait()
    seconds = time.perf_counter() - began
    listener.on = False
    await orch.stop()
    await client.drop_database(db.name)
    await client.close()
    steps = workflows * len(NEXT)
    kinds: dict[str, dict[str, Any]] = {}
    for name in KINDS:
        times = listener.micros.get(name, [])
        kinds[name] = {
            "count": len(times),
            "mean_ms": statistics.fmean(times) / 1000 if times else None,
            "ms_per_step": sum(times) / 1000 / steps,
        }
    return {
        "finished": finished,
        "workflows": workflows,
        "steps_per_s": steps / seconds,
        "ping_ms": statistics.median(pings) * 1000,
        "commands_per_step": sum(k["count"] for k in kinds.values()) / steps,
        "ms_per_step": sum(k["ms_per_step"] for k in kinds.values()),
        "kinds": kinds,
    }


def document_sizes(entries: int = 20) -> dict[str, int]:
    """Bytes of a document with ``entries`` history entries whose errors carry a
    traceback of ``TRACEBACK`` characters, and of the same document with none."""
    bare: dict[str, Any] = {"_id": "doc", "phase": "S1", "n": 1, "lockedUntil": None}
    entry = {
        "kind": "step",
        "at": None,
        "took": 0.5,
        "by": "replica-1",
        "outcome": "failed",
        "phase": "S1",
        "error": "RuntimeError: " + "x" * TRACEBACK,
    }
    full = {**bare, history.HISTORY_FIELD: [dict(entry) for _ in range(entries)]}
    return {"without_history": len(bson.encode(bare)), "with_history": len(bson.encode(full))}


HISTORIES = (0, 2, 20)
"""Step entries in the document's history in each row of ``replaced``."""


def replaced(
    uri: str, finished: int = 300, histories: Sequence[int] = HISTORIES, rounds: int = 60
) -> list[dict[str, Any]]:
    """Per history length: the median milliseconds of a carry, and of the release and the
    claim it replaced, each on a document reset to a held lease before it (as a step's
    write finds it), beside ``finished`` documents in a finished phase."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    db = client[f"bench_replaced_{os.getpid()}"]
    work = db.get_collection("work", write_concern=WriteConcern(w="majority", wtimeout=10_000))
    work.create_index(claims.CLAIM_INDEX)
    now = bson_time(datetime.now(UTC))
    until = now + timedelta(seconds=30)
    if finished:
        work.insert_many([{"n": n, "phase": "Done", "lockedUntil": EPOCH} for n in range(finished)])
    entry = history.step_entry(
        replica="bench", claimed_at=now, now=now, outcome="advanced", phase="S1", to="S2"
    )

    def advance() -> dict[str, Any]:
        update = lease_writes.stamp_release(lease_writes.advance_update("S2", now, {}), "t0")
        return history.merge(update, history.push(entry, history.DEFAULT_HISTORY, []))

    def carry() -> None:
        update = lease_writes.carry_update(advance(), now, until, "t1", "bench")
        found = work.find_one_and_update(
            lease_writes.fenced("doc", "t0", "S1"),
            update,
            projection=history.CLAIM_PROJECTION,
            return_document=ReturnDocument.AFTER,
        )
        if found is None:
            raise RuntimeError("the carry matched nothing: the figure would time a miss")

    def release() -> None:
        if not work.update_one(lease_writes.fenced("doc", "t0", "S1"), advance()).matched_count:
            raise RuntimeError("the release matched nothing: the figure would time a miss")

    def claim() -> None:
        found = work.find_one_and_update(
            claims.claim_filter({"phase": "S2"}, now, 3600),
            claims.claim_update(now, until, "t1", "bench"),
            sort=claims.CLAIM_SORT,
            projection=history.CLAIM_PROJECTION,
        )
        if found is None:
            raise RuntimeError("the claim found nothing: the figure would time a miss")

    def timed(command: Any, held: Mapping[str, Any], *, released: bool = False) -> float:
        times = []
        for _ in range(rounds):
            work.replace_one({"_id": "doc"}, held, upsert=True)
            if released:
                release()
            began = time.perf_counter()
            command()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1000

    rows = []
    for entries in histories:
        held = {
            "_id": "doc",
            "phase": "S1",
            "lockedUntil": until,
            "lockToken": "t0",
            "lockedBy": "bench",
            "lockedAt": now,
            "updatedAt": now,
            history.HISTORY_FIELD: [dict(entry) for _ in range(entries)],
        }
        rows.append(
            {
                "entries": entries,
                "carry_ms": timed(carry, held),
                "release_ms": timed(release, held),
                "claim_ms": timed(claim, held, released=True),
            }
        )
    client.drop_database(db.name)
    client.close()
    return rows


def markdown(rows: Sequence[Mapping[str, Any]], sizes: Mapping[str, int]) -> str:
    lines = [
        "| finished docs | kind | commands | mean ms | ms per step |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        for name, stats in row["kinds"].items():
            if not stats["count"]:
                continue
            lines.append(
                f"| {row['finished']} | {name} | {stats['count']} | {stats['mean_ms']:.2f} | "
                f"{stats['ms_per_step']:.2f} |"
            )
        lines.append(
            f"| {row['finished']} | **all** | {row['commands_per_step']:.2f}/step | "
            f"ping {row['ping_ms']:.2f} | **{row['ms_per_step']:.2f}** "
            f"({row['steps_per_s']:.1f} steps/s) |"
        )
    lines.append("")
    lines.append(
        f"A document with 20 history entries of {TRACEBACK}-character tracebacks: "
        f"{sizes['with_history']} bytes; without history: {sizes['without_history']} bytes."
    )
    return "\n".join(lines) + "\n"


def replaced_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| history entries | carry ms | release ms | claim ms | carry / (release + claim) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        pair = row["release_ms"] + row["claim_ms"]
        lines.append(
            f"| {row['entries']} | {row['carry_ms']:.2f} | {row['release_ms']:.2f} | "
            f"{row['claim_ms']:.2f} | {row['carry_ms'] / pair:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 0,300, not {text!r}") from None
    if not counts or any(c < 0 for c in counts):
        raise argparse.ArgumentTypeError(f"expected counts >= 0, not {text!r}")
    return counts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench server-time", description=__doc__)
    parser.add_argument("--workflows", type=int, default=60)
    parser.add_argument("--finished", type=_counts, default=[0, 300])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    uri = server_uri("server-time")
    if uri is None:
        return 2
    rows = [asyncio.run(measure(uri, args.workflows, finished)) for finished in args.finished]
    sizes = document_sizes()
    pairs = replaced(uri, max(args.finished))
    if args.out is not None:
        result = {"rows": rows, "sizes": sizes, "replaced": pairs}
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(markdown(rows, sizes) + "\n" + replaced_markdown(pairs))
    return 0
