"""One replica of the multi-process test, run as its own OS process with
``orchestrator run tests.process_replica:replica`` (see tests/test_processes.py).

Configured by the environment the test gives it: ``MONGODB_URI``, ``PROCESS_TEST_DB``,
``PROCESS_TEST_REPLICA``, ``PROCESS_TEST_HANG_AT`` (a step at which this replica, once it
has run ``PROCESS_TEST_HANG_AFTER`` steps, does the step's side effect and then hangs
until it is killed) and ``PROCESS_TEST_CONCURRENCY``. Each step records its side effect
in ``effects``, whose unique index on (doc, step) turns a second run into a
``DuplicateKeyError``: that run is recorded in ``repeats`` with the time its lease was
claimed.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

from orchestrator import Lease, Orchestrator

STEPS = ("A", "B", "C")
COLLECTION = "items"
LOCK_TIMEOUT = 4.0


def replica() -> Orchestrator:
    client: MongoClient[dict[str, Any]] = MongoClient(os.environ["MONGODB_URI"])
    db = client[os.environ["PROCESS_TEST_DB"]]
    name = os.environ["PROCESS_TEST_REPLICA"]
    hang_at = os.environ.get("PROCESS_TEST_HANG_AT") or None
    hang_after = int(os.environ.get("PROCESS_TEST_HANG_AFTER", "0"))
    orch = Orchestrator(
        db,
        replica_id=name,
        lock_timeout=LOCK_TIMEOUT,
        tick=0.2,
        max_concurrency=int(os.environ.get("PROCESS_TEST_CONCURRENCY", "2")),
    )
    hung = threading.Event()
    ran = itertools.count(1)
    for step, nxt in zip(STEPS, [*STEPS[1:], "Done"], strict=True):

        def run(lease: Lease[Any], step: str = step, nxt: str = nxt) -> Any:
            effect(db, lease, step, name)
            if next(ran) > hang_after and step == hang_at and not hung.is_set():
                hung.set()
                db.markers.insert_one({"_id": "hanging", "doc": lease.id, "step": step})
                threading.Event().wait()  # mid-step until the test kills this process
            return lease.advance(nxt)

        orch.phase(COLLECTION, step, to=nxt)(run)
    return orch


def effect(db: Database[dict[str, Any]], lease: Lease[Any], step: str, by: str) -> None:
    """The step's side effect; a second run of one step is recorded, not hidden."""
    try:
        db.effects.insert_one({"doc": lease.id, "step": step, "by": by})
    except DuplicateKeyError:
        db.repeats.insert_one(
            {"doc": lease.id, "step": step, "by": by, "claimedAt": lease.doc["lockedAt"]}
        )
