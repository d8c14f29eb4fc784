"""The contention benchmark: K clients claiming and releasing on one collection of your own
MongoDB, through the library's own store, and the fleet model's parameters from its output.

    MONGODB_URI=mongodb://... uv run python -m bench contention \\
        [--clients 1,2,4,8,16,32,64,128,256] [--seconds 5] [--documents 1000] [--out run.json]
    uv run python -m bench contention --calibrate run.json > params.json

For each K, K clients loop "claim, then release" for ``--seconds``: each claim is
``AsyncStore.claim`` (the sorted ``find_one_and_update`` of ``claims.claim_filter`` with
``claims.claim_update``), each release ``AsyncStore.write`` of ``lease_writes.release_update``
fenced on the claim's token (``lease_writes.fenced``), both at the library's default settings
(write concern "majority", 30 s leases), so what is measured is what a replica sends. A
release keeps ``updatedAt``, as an unlock does, so the released document is the head of the
queue again: every client aims at the same few documents, the regime where MongoDB retries
conflicting writes inside the server (issue 19). Before the sweep one client measures each
command kind alone (``ping``, a probe's ``find``, the tick's probe aggregate, sorted and targeted
claims, releases; writes at "majority" and at w:1): the calibration's sources.

The clients are asyncio tasks on one ``AsyncMongoClient`` whose pool holds one connection
per client (warmed before each K): one event loop drives 256 commands in flight with less
client CPU than 256 threads contending for the GIL, and ``AsyncStore`` is the store the
library writes by hand (``Store`` is generated from it). The client is one process: its CPU
per K is reported, and where it nears one core the client, not the server, bounds that row.

Nothing here is asserted: the figures are the server's and the machine's. The runner
(``run``) takes any async database, so the tests drive it on the in-memory store; only the
command line connects, to ``MONGODB_URI``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from bench import report
from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.queries import claims, lease_writes, submissions
from orchestrator.core.redact import redact
from orchestrator.core.settings import DEFAULT_DATABASE, Settings
from orchestrator.mongo import AsyncStore

T = TypeVar("T")

CLIENTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PHASE = "Work"
MATCH: dict[str, Any] = {"phase": PHASE}
"""The one handler's filter every client claims with."""

COMMIT = re.compile(r"[0-9a-f]{40}")
"""MongoDB's ``buildInfo`` gitVersion: the commit it was built from. Another implementation
names itself there (mongoeco: "mongoeco") or gives none."""

CONFLICT_METRICS: dict[str, tuple[str, ...]] = {
    "writeConflicts": ("metrics", "operation", "writeConflicts"),
    "wiredTiger update conflicts": ("wiredTiger", "transaction", "update conflicts"),
}
"""``serverStatus`` counters of write conflicts, read before and after each K: MongoDB's
count of the conflicts it retried inside the server, and WiredTiger's of its update
conflicts. Server-wide: other load on the server counts too."""

TICKETS: tuple[tuple[str, ...], ...] = (
    ("queues", "execution", "write", "totalTickets"),
    ("admission", "execution", "write", "totalTickets"),
    ("wiredTiger", "concurrentTransactions", "write", "totalTickets"),
)
"""Where ``serverStatus`` reports the write tickets: 7.0 and later, then 6.x and earlier."""

DEFAULT_WRITE_TICKETS = 128
"""MongoDB's default (``wiredTigerConcurrentWriteTransactions`` before 7.0; the ceiling of
the dynamic adjustment from 7.0)."""

PROBES: dict[str, str] = {
    "ping": "`ping`: the round trip",
    "read": "a `find` of the claim filter (limit 1, `_id` only): the probe per collection",
    "aggregate": "`AsyncStore.probe`: the tick's one probe (`$unionWith` of its branches)",
    "claim_sorted": "`AsyncStore.claim`: the sorted `find_one_and_update`, w: majority",
    "claim_sorted_w1": "the same claim, w: 1",
    "claim_targeted": "`AsyncStore.claim` of one `_id` (a targeted claim), w: majority",
    "claim_targeted_w1": "the same targeted claim, w: 1",
    "update": "`AsyncStore.write`: the fenced release, w: majority",
    "update_w1": "the same release, w: 1",
}
"""The commands one client measures alone before the sweep, and what each is."""


# -- figures -------------------------------------------------------------------------------


def percentiles(samples: Sequence[float]) -> dict[str, float | int | None]:
    """p50, p90, p99 and max of ``samples`` (seconds) in milliseconds, nearest rank; None
    for a kind with no sample."""
    ordered = sorted(samples)
    out: dict[str, float | int | None] = {"count": len(ordered)}
    for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0)):
        out[name] = ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1e3 if ordered else None
    return out


def dig(doc: Mapping[str, Any] | None, path: Sequence[str]) -> float | None:
    """The number at ``path`` in ``doc``, or None where the server reports none."""
    value: Any = doc
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


async def identify(db: AsyncDatabase[Any]) -> dict[str, Any]:
    """The server as it names itself (``buildInfo``'s version and gitVersion, as figure 7
    names it) and whether that is MongoDB: a gitVersion that is a commit hash."""
    try:
        info = await db.command("buildInfo")
    except (PyMongoError, NotImplementedError) as exc:  # mongomock lacks the command
        name = f"unknown (it refuses buildInfo: {type(exc).__name__})"
        return {"version": "?", "gitVersion": "?", "name": name, "mongodb": False}
    version, git = str(info.get("version", "?")), str(info.get("gitVersion", "?"))
    return {
        "version": version,
        "gitVersion": git,
        "name": f"version {version} ({git})",
        "mongodb": COMMIT.fullmatch(git) is not None,
    }


async def server_status(db: AsyncDatabase[Any]) -> dict[str, Any] | None:
    """``serverStatus``, or None where the server refuses it (no ``clusterMonitor`` role,
    or a server without it): its counters are then "not reported"."""
    try:
        return dict(await db.command("serverStatus"))
    except (PyMongoError, NotImplementedError):
        return None


# -- the runner ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What K clients did in one row: every command's latency by kind, and the counts."""

    claim: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)
    empty: int = 0
    lost: int = 0


class Bench:
    """One collection of ``documents`` claimable documents, and the two stores on it."""

    def __init__(self, db: AsyncDatabase[Any], clock: Clock, settings: Settings) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.name = f"contention_{secrets.token_hex(4)}"
        self.store = AsyncStore(db, settings.write_concern, settings.write_timeout)
        self.store_w1 = AsyncStore(db, 1, settings.write_timeout)

    async def fill(self, documents: int) -> None:
        now = self.clock.now()
        coll = self.store.collection(self.name)
        for first in range(0, documents, 10_000):
            batch = []
            for n in range(first, min(first + 10_000, documents)):
                doc = submissions.new_document({"phase": PHASE, "seq": n}, now)
                doc["_id"] = n
                batch.append(doc)
            await coll.insert_many(batch)
        await self.store.ensure_claim_index(self.name)

    async def claim(
        self, store: AsyncStore, client: str, match: Mapping[str, Any] = MATCH
    ) -> tuple[Any, str] | None:
        """The library's claim, as a replica sends it: (the document's _id, the token)."""
        token = secrets.token_hex(8)
        now = self.clock.now()
        until = now + timedelta(seconds=self.settings.lock_timeout)
        update = claims.claim_update(now, until, token, client)
        doc = await store.claim(
            self.name, claims.ClaimRequest(match, now, self.settings.horizon, update)
        )
        return None if doc is None else (doc["_id"], token)

    async def release(self, store: AsyncStore, held: tuple[Any, str]) -> bool:
        """The release fenced on the claim's token: False if the lease was no longer held."""
        return await store.write(
            self.name, lease_writes.fenced(held[0], held[1]), lease_writes.release_update()
        )

    async def client(self, client: str, tally: Tally, deadline: float, cycles: int | None) -> None:
        """Claim then release until ``deadline`` (or ``cycles`` claims), each timed; at
        least one claim, however late the client starts on a busy machine."""
        done = 0
        while done == 0 or (time.monotonic() < deadline and (cycles is None or done < cycles)):
            done += 1
            began = time.perf_counter()
            held = await self.claim(self.store, client)
            tally.claim.append(time.perf_counter() - began)
            if held is None:
                tally.empty += 1
                continue
            began = time.perf_counter()
            released = await self.release(self.store, held)
            tally.release.append(time.perf_counter() - began)
            if not released:
                tally.lost += 1

    async def held(self) -> int:
        """Documents still leased after a row (every client ends with a release: 0)."""
        return await self.store.collection(self.name).count_documents(
            {"lockToken": {"$exists": True}}
        )

    async def probes(self, samples: int, target: Any) -> dict[str, list[float]]:
        """Each command kind ``samples`` times, one at a time, the kinds interleaved so the
        machine's mood spreads over all of them alike. ``target``: the targeted claims'
        document, at the tail of the queue (the sorted claims take its head)."""
        times: dict[str, list[float]] = {kind: [] for kind in PROBES}
        coll = self.store.collection(self.name)

        async def timed(kind: str, command: Callable[..., Awaitable[T]], *args: Any) -> T:
            began = time.perf_counter()
            result = await command(*args)
            times[kind].append(time.perf_counter() - began)
            return result

        async def aggregate() -> Any:
            now = self.clock.now()
            groups = [(self.name, [(MATCH, None)])]
            return await self.store.probe(groups, now, self.settings.horizon)

        async def read() -> Any:
            probe = claims.probe_filter([(MATCH, None)], self.clock.now(), self.settings.horizon)
            return await coll.find_one(probe, claims.PROBE_PROJECTION)

        for _ in range(samples):
            await timed("ping", self.db.command, "ping")
            await timed("read", read)
            await timed("aggregate", aggregate)
            for kind, match in (("claim_sorted", MATCH), ("claim_targeted", {"_id": target})):
                for suffix, store in (("", self.store), ("_w1", self.store_w1)):
                    held = await timed(kind + suffix, self.claim, store, "probe", match)
                    if held is None:
                        raise RuntimeError(f"the {kind} probe found nothing to claim")
                    if not await timed("update" + suffix, self.release, store, held):
                        raise RuntimeError(f"the {kind} probe's release lost its lease")
        return times

    async def warm(self, clients: int) -> None:
        """``clients`` pings at once, so the pool holds a connection per client before the
        row is timed (the driver opens only a few connections at a time)."""
        await asyncio.gather(*(self.db.command("ping") for _ in range(clients)))

    async def row(self, clients: int, seconds: float, cycles: int | None) -> dict[str, Any]:
        await self.warm(clients)
        before = await server_status(self.db)
        tally = Tally()
        cpu, began = time.process_time(), time.perf_counter()
        deadline = time.monotonic() + seconds
        async with asyncio.TaskGroup() as group:
            for n in range(clients):
                group.create_task(self.client(f"bench-{clients}-{n}", tally, deadline, cycles))
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu
        after = await server_status(self.db)
        claims = len(tally.release)
        return {
            "clients": clients,
            "seconds": wall,
            "claim_commands": len(tally.claim),
            "claims": claims,
            "releases": claims - tally.lost,
            "lost_releases": tally.lost,
            "empty_claims": tally.empty,
            "left_held": await self.held(),
            "claims_per_s": claims / wall if wall > 0 else 0.0,
            "latency_ms": {
                "claim": percentiles(tally.claim),
                "release": percentiles(tally.release),
            },
            "conflicts": {
                name: _delta(before, after, path) for name, path in CONFLICT_METRICS.items()
            },
            "client_cpu": cpu / wall if wall > 0 else 0.0,
        }


def _delta(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, path: Sequence[str]
) -> float | None:
    old, new = dig(before, path), dig(after, path)
    return None if old is None or new is None else new - old


async def run(
    db: AsyncDatabase[Any],
    *,
    clients: Sequence[int] = CLIENTS,
    seconds: float = 5.0,
    documents: int = 1000,
    samples: int = 200,
    cycles: int | None = None,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """The benchmark on ``db``, in a collection of its own that is dropped at the end.

    ``cycles``: each client stops after that many claims, whatever the time (the tests'
    bound, with no timing in it); ``clock``: the lease times' clock (the server's clock
    is not measured: every client runs in this process, on this clock)."""
    began = time.perf_counter()
    settings = Settings.build()
    bench = Bench(db, clock if clock is not None else SystemClock(), settings)
    server = await identify(db)
    try:
        await bench.fill(documents)
        probes = await bench.probes(samples, target=documents - 1)
        rows = [await bench.row(k, seconds, cycles) for k in clients]
        status = await server_status(db)
    finally:
        await bench.store.drop(bench.name)
    tickets = next((t for t in (dig(status, p) for p in TICKETS) if t is not None), None)
    return {
        "meta": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "server": server,
            "server_status": status is not None,
            "write_tickets": tickets,
            "documents": documents,
            "seconds_per_row": seconds,
            "cycles": cycles,
            "samples": samples,
            "write_concern": settings.write_concern,
            "lock_timeout_s": settings.lock_timeout,
            "client_machine": report.machine(),
            "clients": "asyncio tasks on one AsyncMongoClient (one pooled connection each)",
            "seconds": time.perf_counter() - began,
        },
        "probes": {kind: percentiles(values) for kind, values in probes.items()},
        "rows": rows,
        "notes": notes(server),
    }


def notes(server: Mapping[str, Any]) -> list[str]:
    found = [
        "Each client loops: claim (`AsyncStore.claim`, the sorted `find_one_and_update` a "
        "replica sends), then release (`AsyncStore.write` of `release_update`, fenced on the "
        "claim's token), at write concern majority. A release keeps `updatedAt`, as an unlock "
        "does, so the released document is the head of the queue again: every client aims at "
        "the same few documents.",
        "Clients are asyncio tasks on one `AsyncMongoClient` with a pooled connection each "
        "(warmed before each row): one event loop keeps 256 commands in flight with less "
        "client CPU than 256 threads under the GIL, and `AsyncStore` is the library's "
        "hand-written store. Client CPU is the benchmark process's CPU time over the row's "
        "wall time: near 100% (one core), the client bounds that row, not the server.",
        "Latencies are from the call to the awaited reply, round trip included; claim "
        "latencies count empty claims too. A lost release is a release whose fence found "
        "another token: a lease held twice would show as one, so 0 proves none was.",
        "Write conflicts are `serverStatus` counters (`metrics.operation.writeConflicts`: "
        "conflicts MongoDB retried inside the server; WiredTiger's `transaction.update "
        "conflicts`) read before and after each row: server-wide, so other load on the "
        'server counts too. "not reported": the server gives no such counter, or refuses '
        "`serverStatus` (it needs the `clusterMonitor` role).",
    ]
    if not server.get("mongodb"):
        found.insert(0, f"**Not MongoDB**: {not_mongodb(server)}")
    return found


def not_mongodb(server: Mapping[str, Any]) -> str:
    return (
        f"the server names itself {server['name']} (its `buildInfo` "
        "gitVersion is no MongoDB commit), so these figures are not MongoDB's and say "
        "nothing of MongoDB's contention. A wire-protocol server such as mongoeco (CI's) "
        "serves one request at a time: there K clients queue behind one another instead of "
        "contending, and no write conflict can happen."
    )


# -- the table -----------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _spread(stats: Mapping[str, Any]) -> str:
    return " / ".join(_ms(stats[q]) for q in ("p50", "p90", "p99", "max"))


def _conflicts(conflicts: Mapping[str, float | None]) -> str:
    found = [f"{name} {value:.0f}" for name, value in conflicts.items() if value is not None]
    return ", ".join(found) if found else "not reported"


def markdown(results: Mapping[str, Any]) -> str:
    meta = results["meta"]
    server = meta["server"]
    kind = "MongoDB" if server["mongodb"] else "**not MongoDB**"
    lines = [
        "# Contention benchmark",
        "",
        f"Server: {server['name']}, {kind}; {meta['documents']} documents, "
        f"{meta['seconds_per_row']:g} s per row, write concern {meta['write_concern']}, "
        f"leases of {meta['lock_timeout_s']:g} s; run {meta['date']} from "
        f"{meta['client_machine']['system']}, {meta['client_machine']['cpus']} CPUs, "
        f"Python {meta['client_machine']['python']} ({meta['seconds']:.0f} s).",
        "",
        "One client, one command at a time (the calibration's sources; ms):",
        "",
        "| command | what is sent | n | p50 | p90 | p99 | max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, stats in results["probes"].items():
        lines.append(
            f"| {kind} | {PROBES[kind]} | {stats['count']} | "
            + " | ".join(_ms(stats[q]) for q in ("p50", "p90", "p99", "max"))
            + " |"
        )
    lines += [
        "",
        "K clients looping claim then release (latencies in ms: p50 / p90 / p99 / max):",
        "",
        "| clients | claims/s | claim latency | release latency | empty claims "
        "| lost releases | write conflicts | client CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["rows"]:
        latency = row["latency_ms"]
        lines.append(
            f"| {row['clients']} | {row['claims_per_s']:.0f} | {_spread(latency['claim'])} "
            f"| {_spread(latency['release'])} | {row['empty_claims']} | {row['lost_releases']} "
            f"| {_conflicts(row['conflicts'])} | {row['client_cpu']:.0%} |"
        )
    lines += ["", "Notes:", ""]
    lines += [f"- {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


# -- calibration ---------------------------------------------------------------------------


def calibrate(results: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The fleet model's parameters from a run's results, and where each came from.

    Every figure (in ms, to the microsecond) is a median (p50) of one client's commands
    sent one at a time (the probes), so a noisy machine's outliers do not move it; in the
    model a command's latency is ``rtt + service (+ majority_commit for a write)``,
    queueing and conflicts apart:

    - ``rtt_ms``: the ``ping``'s p50.
    - ``majority_commit_ms``: how much longer a write takes at w: majority than at w: 1,
      the median of that difference over the three write kinds (sorted claim, targeted
      claim, release); 0 on a standalone server, which acknowledges both alike.
    - ``service_ms``: each kind's p50 less the round trip: ``read`` the idle probe's
      ``find``, ``aggregate`` that probe as a pipeline, ``claim_sorted`` the library's
      claim, ``claim_targeted`` a claim of one ``_id``, ``update`` the fenced release;
      the writes at w: 1, so the majority wait is not counted twice. Never below 0.
    - ``conflict_window_ms``: how long a claim stays open to conflict. A claim conflicts
      when another commits on the document it is writing within that window; every
      client aims at the head of the queue, which each successful claim moves, so at K
      clients conflicts per claim ~= claims/s x window. From each row of K >= 2 with a
      reported ``writeConflicts`` count and at most 0.5 conflicts per claim (where that
      linear estimate holds; else the row of fewest clients with conflicts): the median of
      (conflicts per claim command) / (claims per second). Where the server reports no
      conflicts, or none happened, the claim's own service time (the time its storage
      transaction is open), marked as not measured.
    - ``write_tickets``: the ``serverStatus`` totalTickets, where the server reports them;
      else MongoDB's default, 128, marked so.
    """
    probes, rows = results["probes"], results["rows"]
    source: dict[str, str] = {}

    def p50(kind: str) -> float:
        value = probes[kind]["p50"]
        if value is None:
            raise OrchestratorError(f"the results have no {kind} measurement")
        return float(value)

    rtt = p50("ping")
    source["rtt_ms"] = f"measured: p50 of {probes['ping']['count']} pings"
    diffs = [p50(k) - p50(f"{k}_w1") for k in ("claim_sorted", "claim_targeted", "update")]
    majority = max(statistics.median(diffs), 0.0)
    source["majority_commit_ms"] = (
        "measured: median over sorted claims, targeted claims and releases of p50 at "
        "w: majority less p50 at w: 1"
    )
    service = {
        "read": max(p50("read") - rtt, 0.0),
        "aggregate": max(p50("aggregate") - rtt, 0.0),
        "claim_sorted": max(p50("claim_sorted_w1") - rtt, 0.0),
        "claim_targeted": max(p50("claim_targeted_w1") - rtt, 0.0),
        "update": max(p50("update_w1") - rtt, 0.0),
    }
    source["service_ms"] = "measured: each command's p50 less rtt (writes at w: 1)"
    window, source["conflict_window_ms"] = _conflict_window(rows, service["claim_sorted"])
    tickets = results["meta"].get("write_tickets")
    if tickets is None:
        source["write_tickets"] = (
            f"MongoDB's default ({DEFAULT_WRITE_TICKETS}): not reported by the server"
        )
        tickets = DEFAULT_WRITE_TICKETS
    else:
        source["write_tickets"] = "reported by the server (serverStatus totalTickets)"
    params = {
        "rtt_ms": round(rtt, 3),
        "service_ms": {kind: round(ms, 3) for kind, ms in service.items()},
        "conflict_window_ms": round(window, 3),
        "majority_commit_ms": round(majority, 3),
        "write_tickets": int(tickets),
    }
    return params, source


def _conflict_window(rows: Sequence[Mapping[str, Any]], claim_ms: float) -> tuple[float, str]:
    """``calibrate``'s conflict window (ms) and its source."""
    seen = [
        r
        for r in rows
        if r["clients"] >= 2
        and r["conflicts"].get("writeConflicts")
        and r["claims_per_s"] > 0
        and r["claim_commands"] > 0
    ]
    if not seen:
        reported = any(r["conflicts"].get("writeConflicts") is not None for r in rows)
        why = "no write conflict at any K" if reported else "the server reports no conflicts"
        return claim_ms, f"not measured ({why}): the sorted claim's service time"

    def per_claim(row: Mapping[str, Any]) -> float:
        return float(row["conflicts"]["writeConflicts"]) / int(row["claim_commands"])

    linear = [r for r in seen if per_claim(r) <= 0.5] or [min(seen, key=lambda r: r["clients"])]
    estimates = [per_claim(r) / r["claims_per_s"] * 1e3 for r in linear]
    used = ", ".join(str(r["clients"]) for r in linear)
    return float(statistics.median(estimates)), (
        f"measured: conflicts per claim / claims per second, median over K = {used}"
    )


# -- the command line ------------------------------------------------------------------------


def _clients(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected client counts like 1,2,4, not {text!r}")
    return values


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, not {text!r}")
        return value

    return parse


async def _on_server(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark on ``MONGODB_URI``'s database (``orchestrator`` if it names none),
    with a pool as large as the most clients."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        uri,
        maxPoolSize=max(100, *args.clients),
        serverSelectionTimeoutMS=5000,
        appname="orchestrator-bench",
    )
    try:
        db = client.get_default_database(DEFAULT_DATABASE)
        await db.command("ping")
        return await run(
            db,
            clients=args.clients,
            seconds=args.seconds,
            documents=args.documents,
            samples=args.samples,
        )
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench contention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=_clients, default=list(CLIENTS), help="1,2,4,...")
    parser.add_argument("--seconds", type=_positive(float), default=5.0, help="per row")
    parser.add_argument("--documents", type=_positive(int), default=1000)
    parser.add_argument(
        "--samples", type=_positive(int), default=200, help="of each command, one at a time"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument(
        "--calibrate",
        type=Path,
        metavar="RESULTS.json",
        help="print the fleet model's parameters from a run's --out (sources on stderr)",
    )
    args = parser.parse_args(argv)
    if args.calibrate is not None:
        return _calibrate_file(args.calibrate)
    uri = os.environ.get("MONGODB_URI")
    if not uri:
        print(
            "MONGODB_URI is not set: the contention benchmark runs against your MongoDB "
            "(MONGODB_URI=mongodb://host/db uv run python -m bench contention)",
            file=sys.stderr,
        )
        return 2
    try:
        results = asyncio.run(_on_server(uri, args))
    except (PyMongoError, OrchestratorError) as exc:
        print(f"contention benchmark on {redact(uri)}: {redact(str(exc))}", file=sys.stderr)
        return 1
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report.write_json(results, args.out)
    sys.stdout.write(markdown(results))
    return 0


def _calibrate_file(path: Path) -> int:
    try:
        results = json.loads(path.read_text())
        params, source = calibrate(results)
    except (OSError, ValueError, KeyError, TypeError, OrchestratorError) as exc:
        print(
            f"{path}: not a contention benchmark's --out results ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
        return 2
    server = results["meta"]["server"]
    if not server.get("mongodb"):
        print(f"warning: not MongoDB: {not_mongodb(server)}", file=sys.stderr)
    for key, where in source.items():
        print(f"{key}: {where}", file=sys.stderr)
    sys.stdout.write(json.dumps(params, indent=2) + "\n")
    return 0
