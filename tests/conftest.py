"""Fixtures: a fake clock, and a database that is in-memory, or real when MONGODB_URI is set.

Against a real server the replicas still share the fake clock: the server clock is only
the anchor of their offset, and every lease time is written from the estimate, so time
travel with ``clock.advance`` works there too (the refresh is pushed out of the way).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from orchestrator import Orchestrator
from orchestrator.testing import FakeClock, memory_database

MONGODB_URI = os.environ.get("MONGODB_URI")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(
    params=[
        "memory",
        pytest.param(
            "mongodb",
            marks=[
                pytest.mark.mongodb,
                pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set"),
            ],
        ),
    ]
)
def db(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[Database[Any]]:
    if request.param == "memory":
        yield memory_database(clock=clock)
        return
    client: MongoClient[Any] = MongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
    name = f"orchestrator_test_{uuid.uuid4().hex[:8]}"
    try:
        yield client[name]
    finally:
        client.drop_database(name)
        client.close()


MakeReplica = Callable[..., Orchestrator]


@pytest.fixture
def make(db: Database[Any], clock: FakeClock) -> Iterator[MakeReplica]:
    """Replicas sharing ``db``; each is stopped at the end of the test."""
    made: list[Orchestrator] = []

    def factory(replica_id: str = "pod-1", **options: Any) -> Orchestrator:
        options.setdefault("lock_timeout", 30)
        options.setdefault("tick", 1.0)
        options.setdefault("clock_refresh", 1e6)
        local = options.pop("clock", clock)
        orch = Orchestrator(db, replica_id=replica_id, clock=local, **options)
        made.append(orch)
        return orch

    yield factory
    for orch in made:
        orch.stop(timeout=5)
