"""The README's quickstart, runnable: three replicas share a deletion cascade.

uv run python -m examples.quickstart            # embedded in-memory store
MONGODB_URI=mongodb://localhost:27017/?directConnection=true uv run python -m examples.quickstart
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from typing import Any

from pymongo import MongoClient
from pymongo.database import Database

from orchestrator import DEFAULT_DATABASE, Lease, Orchestrator, Resource
from orchestrator.testing import memory_database

CHILDREN = ("triggers", "functions", "stages")


class Gateway(Resource):
    collection = "gateways"
    unique = ("name",)
    name: str


def build(db: Database[Any], replica_id: str) -> Orchestrator:
    """Every replica registers the same handlers; the leases decide who runs each step."""
    orch = Orchestrator(db, lock_timeout=30, tick=1.0, replica_id=replica_id)

    @orch.when(Gateway, {"state": "Deleted", "phase": "Created"})
    def begin_deletion(lease: Lease[Gateway]) -> Any:
        return lease.advance("Deleting")

    @orch.phase(Gateway, "Deleting")
    def delete_children(lease: Lease[Gateway]) -> Any:
        for kind in CHILDREN:  # one kind per step; a retry resumes at the first left
            if db[kind].count_documents({"gateway": lease.resource.name}):
                db[kind].delete_many({"gateway": lease.resource.name})
                db.log.insert_one(
                    {"gateway": lease.resource.name, "deleted": kind, "by": orch.replica_id}
                )
                return lease.unlock()
        return lease.advance("Deleted")

    return orch


def database() -> Database[Any]:
    """``MONGODB_URI``'s server (the default database, as every tool), else in memory."""
    uri = os.environ.get("MONGODB_URI")
    return MongoClient(uri)[DEFAULT_DATABASE] if uri else memory_database()


def main() -> int:
    db = database()
    replicas = [build(db, f"pod-{n}") for n in range(1, 4)]
    for n in range(30):
        name = f"gw-{n}"
        replicas[0].submit(
            Gateway, {"name": name, "phase": "Created", "state": "Deleted"}, unique="name"
        )
        for kind in CHILDREN:
            db[kind].insert_one({"gateway": name})

    threads = [threading.Thread(target=orch.run_once) for orch in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    phases = Counter(doc["phase"] for doc in db.gateways.find({}, {"phase": 1}))
    by_replica = Counter(entry["by"] for entry in db.log.find({}))
    print(f"gateways by phase: {dict(phases)}")
    print(f"deletion steps by replica: {dict(sorted(by_replica.items()))}")
    print(f"deletion steps in all: {db.log.count_documents({})} (30 gateways x 3 kinds = 90)")
    ok = phases == Counter({"Deleted": 30}) and db.log.count_documents({}) == 90
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
