"""Fixtures: a fake clock, and a database in one of three modes.

- ``memory``: the in-memory store, whose ``hello`` reports the fake clock itself.
- ``memory-offset``: the in-memory store whose ``hello`` reports the system clock, as a
  real server reports its own wall clock, not the tests' fake one. It runs everywhere,
  with no server, so a test that mixes the two clocks fails here first.
- ``mongodb``: the server named by ``MONGODB_URI`` (skipped when it is unset).

With a server clock that is not the fake clock, a replica's offset is whatever separates
them (months, against the fake clock's 2026-01-01). Lease times are written from the
replica's estimate, ``orch.clock.now()``, so time travel with ``clock.advance`` still
works, on two conditions the tests keep: every time a test writes or compares is taken
from a replica's estimate, never from the raw ``clock.now()``; and each replica measures
the server clock before the fake clock first moves (the server's own clock does not follow
an advance, so a replica that first measured after it would never see it). ``make``
measures as it builds a replica; the refresh is pushed out of the way.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any

import pytest
from hypothesis import Phase, settings
from pymongo import AsyncMongoClient, MongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database
from pymongo.errors import PyMongoError

from orchestrator import Orchestrator
from orchestrator.core.clock import SystemClock
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.memory import MemoryDatabase
from tests.engines import Replica, new_replica

MONGODB_URI = os.environ.get("MONGODB_URI")
NO_SERVER = "MONGODB_URI is not set"
"""Why the ``mongodb`` tier is skipped (the reason every skip of that tier gives)."""


def server_name(db: Database[Any]) -> str:
    """A server as it names itself (``buildInfo``): its version and gitVersion, a commit
    hash on MongoDB, another implementation's name elsewhere. A test that cannot show on a
    server what it shows on MongoDB says which server that was."""
    info = db.command("buildInfo")
    return f"version {info.get('version')} ({info.get('gitVersion')})"


def pytest_report_header(config: pytest.Config) -> str | None:
    """Name the server the MONGODB_URI tier runs on: the same tests prove different things
    on MongoDB and on another wire-protocol implementation."""
    if not MONGODB_URI:
        return None
    client: MongoClient[Any] = MongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
    try:
        return f"MONGODB_URI server: {server_name(client.admin)}"
    except PyMongoError as exc:
        return f"MONGODB_URI server: unreachable ({type(exc).__name__})"
    finally:
        client.close()


settings.register_profile("mutation", phases=(Phase.explicit, Phase.reuse, Phase.generate))
"""``--hypothesis-profile=mutation``, as ``scripts/mutation`` runs: a failing example is
enough to kill a mutant, so none is shrunk (the randomized tests' own profiles, made after
it is loaded, inherit that). Shrinking a broken state machine's run took minutes a mutant."""

DATABASE_FIXTURES = frozenset({"db", "adb", "make", "replicas", "aorch"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``pure`` (the mutation run's selection, ``scripts/mutation``) asks for
    no database: the mark stays true as tests change."""
    for item in items:
        used = DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if used and item.get_closest_marker("pure") is not None:
            raise pytest.UsageError(f"{item.nodeid} is marked pure but uses {sorted(used)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Without MONGODB_URI the ``mongodb`` tier's skips are filed here, under one location,
    so ``-ra`` folds them into one line with their count instead of one line per test
    function (some 180 lines that bury a failure). Every other skip keeps its own line."""
    report = yield
    if report.skipped and item.get_closest_marker("mongodb") is not None:
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and longrepr[2].removeprefix("Skipped: ") == NO_SERVER:
            report.longrepr = (
                __file__,
                pytest_runtest_makereport.__code__.co_firstlineno,
                NO_SERVER,
            )
    return report


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(
    params=[
        "memory",
        "memory-offset",
        pytest.param(
            "mongodb",
            marks=[
                pytest.mark.mongodb,
                pytest.mark.skipif(not MONGODB_URI, reason=NO_SERVER),
            ],
        ),
    ]
)
def db(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[Database[Any]]:
    if request.param == "memory":
        yield memory_database(clock=clock)
        return
    if request.param == "memory-offset":
        yield memory_database(clock=SystemClock())
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
    """Replicas sharing ``db``, each with its server clock measured now, before any
    ``clock.advance``; each is stopped at the end of the test."""
    made: list[Orchestrator] = []

    def factory(replica_id: str = "pod-1", **options: Any) -> Orchestrator:
        options.setdefault("lock_timeout", 30)
        options.setdefault("tick", 1.0)
        options.setdefault("clock_refresh", 1e6)
        local = options.pop("clock", clock)
        orch = Orchestrator(db, replica_id=replica_id, clock=local, **options)
        orch.measure_clock()
        made.append(orch)
        return orch

    yield factory
    for orch in made:
        orch.stop(timeout=5)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


MakeEither = Callable[..., Awaitable[Replica]]


@pytest.fixture(params=["threaded", "async"])
async def replicas(
    request: pytest.FixtureRequest, db: Database[Any], clock: FakeClock
) -> AsyncIterator[MakeEither]:
    """``make`` for both engines (``tests.engines``): ``await replicas(...)`` is a
    ``Replica`` on ``db`` (the async engine on its async view, or an async client of the
    same server), measured now. A test may ask for ``mixed`` too (indirect
    parametrization): threaded and async replicas in turn."""
    made: list[Replica] = []
    client: AsyncMongoClient[Any] | None = None
    if isinstance(db, MemoryDatabase):
        adb: Any = async_view(db)
    else:
        client = AsyncMongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
        adb = client[db.name]

    async def factory(replica_id: str = "pod-1", **options: Any) -> Replica:
        replica = new_replica(request.param, len(made), db, adb, clock, replica_id, **options)
        made.append(replica)
        await replica.measure_clock()
        return replica

    yield factory
    for replica in made:
        await replica.stop(timeout=5)
    if client is not None:
        await client.close()


@pytest.fixture
async def adb(db: Database[Any]) -> AsyncIterator[AsyncDatabase[Any]]:
    """``db`` behind PyMongo's async API: its async view in memory, an async client of the
    same database on a server (so a test reads with ``db`` what async code wrote)."""
    if isinstance(db, MemoryDatabase):
        yield async_view(db)
        return
    client: AsyncMongoClient[Any] = AsyncMongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
    try:
        yield client[db.name]
    finally:
        await client.close()
