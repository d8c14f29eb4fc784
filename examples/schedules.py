"""Schedules, runnable: a nightly report at 02:00 Berlin time and a session cleanup every
30 seconds, declared by every replica and started once across them.

uv run python -m examples.schedules     # three replicas on the in-memory store, 01:58-02:03

Each replica declares the same schedules; the first to find a fire time due starts its
document (``_id`` ``name@fire``), so three replicas make one report a night, not three. The
fire function gets the fire time as scheduled, not the moment it runs: the report covers
the 24 hours before it and a late or retried fire computes the same one. The work itself
is a step like any other (a lease, retries, the history), here one step per document.
In a service each replica calls ``orch.start()``; this script drives them tick by tick on
a fake clock to show a few minutes of a night in a second.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.database import Database

from orchestrator import Clock, Lease, Orchestrator
from orchestrator.testing import FakeClock, memory_database

START = datetime(2026, 1, 15, 0, 58, tzinfo=UTC)  # 01:58 in Berlin (CET, UTC+1)
MINUTES = 5


def build(db: Database[Any], replica_id: str, clock: Clock | None = None) -> Orchestrator:
    """What every replica runs: the schedules and the steps that do their work."""
    orch = Orchestrator(db, tick=1.0, replica_id=replica_id, clock=clock)

    @orch.schedule("nightly-report", "reports", cron="0 2 * * *", timezone="Europe/Berlin")
    def nightly(fire: datetime) -> dict[str, Any]:
        return {"phase": "Compute", "since": fire - timedelta(days=1), "until": fire}

    @orch.phase("reports", "Compute")
    def compute(lease: Lease[Any]) -> Any:
        window = {"$gte": lease.doc["since"], "$lt": lease.doc["until"]}
        orders = db.orders.count_documents({"at": window})
        return lease.advance("Done", orders=orders, by=orch.replica_id)

    # A sweep still running when the next fire comes makes that fire skip (the default
    # overlap, "skip"): two sweeps never race over the same sessions.
    @orch.schedule("session-cleanup", "cleanups", every=timedelta(seconds=30))
    def cleanup(fire: datetime) -> dict[str, Any]:
        return {"phase": "Sweep", "expiredBefore": fire}

    @orch.phase("cleanups", "Sweep")
    def sweep(lease: Lease[Any]) -> Any:
        deleted = db.sessions.delete_many({"expires": {"$lt": lease.doc["expiredBefore"]}})
        return lease.advance("Done", deleted=deleted.deleted_count, by=orch.replica_id)

    return orch


def main() -> int:
    clock = FakeClock(START)
    db = memory_database(clock=clock)
    for hour in range(30):
        db.orders.insert_one({"at": START - timedelta(hours=hour)})  # 24 in the report's day
    for second in range(0, MINUTES * 60, 10):
        db.sessions.insert_one({"expires": START + timedelta(seconds=second)})
    replicas = [build(db, f"pod-{n}", clock) for n in range(1, 4)]
    order = random.Random(7)
    for _ in range(MINUTES * 60):
        clock.advance(1)
        for orch in order.sample(replicas, len(replicas)):  # replicas tick in no set order
            orch.run_once(heartbeat=False)

    reports = list(db.reports.find())
    cleanups = list(db.cleanups.find())
    for report in reports:
        print(f"{report['_id']}: {report['orders']} orders, by {report['by']}")
    by_replica = Counter(doc["by"] for doc in cleanups)
    print(f"session-cleanup: {len(cleanups)} runs ({dict(sorted(by_replica.items()))})")
    print(f"sessions deleted: {sum(doc['deleted'] for doc in cleanups)}, left: ", end="")
    print(db.sessions.count_documents({}))
    ok = (
        [(r["_id"], r["phase"], r["orders"]) for r in reports]
        == [("nightly-report@2026-01-15T01:00:00Z", "Done", 24)]
        and len(cleanups) == MINUTES * 2
        and all(doc["phase"] == "Done" for doc in cleanups)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
