"""Live replicas: each replica records itself while it runs, readers list the live ones and
flag the settings they disagree on, and no trouble with the record touches the steps."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.database import Database

from orchestrator import AsyncOrchestrator, ConfigError, Orchestrator, Settings
from orchestrator.cli import connecting
from orchestrator.cli import main as cli
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.distribution import library_version
from orchestrator.core.fire_times import Every
from orchestrator.core.names import REPLICAS_COLLECTION
from orchestrator.core.queries import replica_records
from orchestrator.core.replicas import (
    MAX_REFRESH,
    MIN_TTL,
    RECORD_INTERVAL,
    ReplicaIdentity,
    ReplicaRecord,
    ReplicaSettings,
    RunningStep,
    ScheduleInfo,
    disagreements,
    new_record,
    record_ttl,
    refresh_interval,
)
from orchestrator.core.settings import MAX_LOCK_TIMEOUT
from orchestrator.mongo import Store
from orchestrator.operations import Reports
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.faults import Faults
from orchestrator.testing.memory import MemoryDatabase
from tests.conftest import MONGODB_URI, MakeEither, MakeReplica
from tests.engines import hold, new_replica, wait

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(
    replica_id: str, now: datetime = T0, steps: list[RunningStep] | None = None, **changes: Any
) -> ReplicaRecord:
    """A record of ``replica_id``, with ``changes`` to its identity and settings."""
    identity = ReplicaIdentity(replica_id, "i-" + replica_id, "host", 1, "1.0.0", "threaded", T0)
    settings = ReplicaSettings(lock_timeout=30.0, tick=1.0, max_concurrency=4)
    named = {f.name for f in fields(ReplicaIdentity)}
    identity = replace(identity, **{k: v for k, v in changes.items() if k in named})
    settings = replace(settings, **{k: v for k, v in changes.items() if k not in named})
    return new_record(identity, settings, now=now, steps=steps or ())


# -- what a record is, and what readers make of several ------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize("lock_timeout", [0.01, 1, 30, 60, 300, 3600, MAX_LOCK_TIMEOUT])
def test_a_record_outlives_several_refreshes(lock_timeout: float) -> None:
    interval = refresh_interval(lock_timeout)
    assert interval <= MAX_REFRESH
    assert interval <= lock_timeout / 6  # the heartbeat still renews leases in time
    assert record_ttl(lock_timeout) >= max(3 * interval, MIN_TTL)


@pytest.mark.pure
def test_a_record_round_trips_through_its_stored_form() -> None:
    step = RunningStep("gateways", "gw-1", "Deleting", T0 + timedelta(seconds=1, microseconds=7))
    original = record("pod-1", steps=[step], now=T0 + timedelta(seconds=5))
    stored = replica_records.replica_document(original)
    parsed = ReplicaRecord.from_document({**stored, "lastSeen": stored["lastSeen"]})
    assert parsed is not None
    assert parsed.replica_id == "pod-1"
    assert parsed.expires_at == T0 + timedelta(seconds=5 + record_ttl(30))
    assert parsed.steps == (
        RunningStep("gateways", "gw-1", "Deleting", T0 + timedelta(seconds=1)),  # BSON: ms
    )
    assert replace(parsed, steps=()) == replace(original, steps=())
    assert parsed.to_dict()["steps"] == [
        {
            "collection": "gateways",
            "id": "gw-1",
            "phase": "Deleting",
            "since": "2026-01-01T00:00:01+00:00",
        }
    ]


@pytest.mark.pure
def test_a_record_as_json_for_the_status_command_and_the_page() -> None:
    step = RunningStep("gateways", "gw-1", None, T0)
    shown = record("pod-1", steps=[step], now=T0 + timedelta(seconds=5)).to_dict()
    assert shown == {
        "replica_id": "pod-1",
        "instance": "i-pod-1",
        "host": "host",
        "pid": 1,
        "version": "1.0.0",
        "engine": "threaded",
        "started": "2026-01-01T00:00:00+00:00",
        "last_seen": "2026-01-01T00:00:05+00:00",
        "expires_at": (T0 + timedelta(seconds=5 + record_ttl(30))).isoformat(),
        "lock_timeout": 30.0,
        "tick": 1.0,
        "max_concurrency": 4,
        "steps": [{"collection": "gateways", "id": "gw-1", "phase": None, "since": T0.isoformat()}],
        "handlers": [],
        "unique": [],
        "cancelled_phase": "",
        "history": 0,
        "paused": [],
        "claim_strategy": "",
        "claim_candidates": 0,
        "legacy_lock_timeout": None,
        "retention": [],
        "schedules": [],
    }
    assert json.loads(json.dumps(shown)) == shown


@pytest.mark.pure
def test_a_record_keeps_the_schedules_it_declares_and_skips_garbage_entries() -> None:
    every = Every(5).stored()
    declared = replace(
        record("pod-1"),
        schedules=(ScheduleInfo("b", {**every, "collection": "r"}), ScheduleInfo("a", {})),
    )
    stored = replica_records.replica_document(declared)
    stored["schedules"] += [7, {"name": 3}, {"name": "c", "spec": "x"}]
    parsed = ReplicaRecord.from_document(stored)
    assert parsed is not None
    assert [(s.name, s.shown) for s in parsed.schedules] == [
        ("b", "every 5s into r, overlap skip, catch-up 3600s, jitter 0s"),
        ("a", "an unreadable spec"),
        ("c", "an unreadable spec"),
    ]


@pytest.mark.pure
def test_a_record_reads_its_times_as_utc_and_what_it_may_lack_as_empty() -> None:
    stored = replica_records.replica_document(
        record("pod-1", steps=[RunningStep("c", "1", None, T0)])
    )
    for optional in ("instance", "host", "pid", "version", "engine"):
        del stored[optional]
    stored["started"] = T0.replace(tzinfo=None)
    stored["lastSeen"] = T0.astimezone(timezone(timedelta(hours=2)))
    parsed = ReplicaRecord.from_document(stored)
    assert parsed is not None
    assert (parsed.instance, parsed.host, parsed.pid, parsed.version, parsed.engine) == (
        "",
        "",
        0,
        "",
        "",
    )
    assert parsed.started == T0 and parsed.started.tzinfo is UTC
    assert parsed.last_seen == T0 and parsed.last_seen.tzinfo is UTC
    assert parsed.steps == (RunningStep("c", "1", None, T0),)
    assert (parsed.lock_timeout, parsed.tick, parsed.max_concurrency) == (30.0, 1.0, 4)
    assert ReplicaRecord.from_document({**stored, "lockTimeout": 30, "steps": None}) == replace(
        parsed, steps=()
    )


@pytest.mark.pure
@pytest.mark.parametrize(
    "junk",
    [
        {"_id": "x"},
        {**replica_records.replica_document(record("x")), "lastSeen": "yesterday"},
        {**replica_records.replica_document(record("x")), "maxConcurrency": 2.5},
        {**replica_records.replica_document(record("x")), "lockTimeout": True},
        {**replica_records.replica_document(record("x")), "steps": [{"collection": "c"}]},
        {**replica_records.replica_document(record("x")), "steps": 3},
        *(
            {k: v for k, v in replica_records.replica_document(record("x")).items() if k != missing}
            for missing in (
                "started",
                "lastSeen",
                "expiresAt",
                "lockTimeout",
                "tick",
                "maxConcurrency",
            )
        ),
        {**replica_records.replica_document(record("x")), "pid": "1"},
        {**replica_records.replica_document(record("x")), "pid": False},
        {**replica_records.replica_document(record("x")), "tick": "1"},
        {**replica_records.replica_document(record("x")), "steps": [{"collection": "c", "id": 1}]},
        {
            **replica_records.replica_document(record("x")),
            "steps": [{"collection": "c", "id": 1, "since": "today"}],
        },
    ],
)
def test_a_document_that_is_no_record_is_skipped_not_fatal(junk: dict[str, Any]) -> None:
    assert ReplicaRecord.from_document(junk) is None


@pytest.mark.pure
def test_alike_replicas_have_no_disagreement() -> None:
    assert disagreements([record("a"), record("b"), record("c", engine="async")]) == []
    assert disagreements([]) == []


@pytest.mark.pure
def test_disagreements_name_each_setting_lock_timeout_first() -> None:
    found = disagreements(
        [
            record("a"),
            record("b", tick=2.0, version="1.1.0"),
            record("c", lock_timeout=300.0, max_concurrency=8),
        ]
    )
    assert [d.setting for d in found] == ["lock_timeout", "tick", "max_concurrency", "version"]
    lock = found[0]
    assert lock.values == (("30s", ("a", "b")), ("300s", ("c",)))  # the majority first
    assert lock.message == "replicas disagree on lock_timeout: 30s (a, b); 300s (c)"
    assert found[3].to_dict() == {
        "setting": "version",
        "values": {"1.0.0": ["a", "c"], "1.1.0": ["b"]},
        "message": "replicas disagree on version: 1.0.0 (a, c); 1.1.0 (b)",
    }


# -- the in-memory store's TTL index -------------------------------------------------------


def test_memory_ttl_index_expires_by_the_server_clock_once_a_minute(clock: FakeClock) -> None:
    """As a server's TTL monitor: by the database's clock (the fake one here, not the
    machine's), at its passes once a minute, so an expired document lingers a while."""
    db = memory_database(clock=clock)
    store = Store(db)
    store.ensure_replica_index()
    store.record_replica(record("pod-1", now=clock.now() + timedelta(seconds=10)))  # expires :50
    clock.advance(55)
    assert db[REPLICAS_COLLECTION].find_one({"_id": "pod-1"}) is not None  # no pass since :00
    assert Reports(db).live_replicas(clock.now()) == []  # but no reader lists it
    clock.advance(5)  # the monitor's pass at 00:01:00
    assert db[REPLICAS_COLLECTION].find_one({"_id": "pod-1"}) is None


# -- replicas of both engines --------------------------------------------------------------


def listed(db: Database[Any], now: datetime) -> dict[str, ReplicaRecord]:
    return {r.replica_id: r for r in Reports(db).live_replicas(now)}


async def test_each_engine_records_itself_on_start_and_refreshes_on_heartbeat(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas("pod-1", lock_timeout=45, tick=2.0, max_concurrency=3)
    assert listed(db, replica.clock.now()) == {}  # not started: not recorded
    await replica.start()
    first = listed(db, replica.clock.now())["pod-1"]
    engine = "threaded" if replica.threaded else "async"
    assert (first.engine, first.host, first.pid) == (engine, socket.gethostname(), os.getpid())
    assert first.version == library_version()
    assert (first.lock_timeout, first.tick, first.max_concurrency) == (45.0, 2.0, 3)
    assert first.steps == ()
    assert first.expires_at == first.last_seen + timedelta(seconds=record_ttl(45))

    clock.advance(20)
    await replica.heartbeat()
    second = listed(db, replica.clock.now())["pod-1"]
    assert second.last_seen >= first.last_seen + timedelta(seconds=20)
    assert second.started == first.started
    assert replica.stats()["replica_records"] >= 2
    assert "replica_errors" not in replica.stats()


async def test_the_record_lists_the_steps_running_now(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas("pod-1")
    box = hold(replica)
    await replica.submit("jobs", {"_id": "j1", "phase": "Running"})
    await replica.start()
    assert await wait(box["claimed"])
    await replica.heartbeat()
    [step] = listed(db, replica.clock.now())["pod-1"].steps
    assert (step.collection, step.id, step.phase) == ("jobs", "j1", "Running")
    assert step.since == as_utc(bson_time(box["lease"].claimed_at))
    box["go"].set()
    assert await wait(box["returned"])


async def test_a_stopped_replica_is_removed(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    stopping = await replicas("pod-1")
    staying = await replicas("pod-2")
    await stopping.start()
    await staying.start()
    assert set(listed(db, stopping.clock.now())) == {"pod-1", "pod-2"}
    await stopping.stop()
    assert set(listed(db, stopping.clock.now())) == {"pod-2"}
    assert db[REPLICAS_COLLECTION].find_one({"_id": "pod-1"}) is None
    await stopping.heartbeat()  # a heartbeat after stop does not bring it back
    assert db[REPLICAS_COLLECTION].find_one({"_id": "pod-1"}) is None


@pytest.mark.parametrize("engine", ["threaded", "async"])
async def test_a_dead_replica_is_not_listed_past_its_expiry(
    engine: str, db: Database[Any], clock: FakeClock
) -> None:
    """Cut off from the database, a replica can neither refresh nor remove its record: it
    is listed until its own expiry, not a moment longer, whether or not the TTL monitor
    has deleted it yet."""
    faults = Faults(clock=clock)
    client: AsyncMongoClient[Any] | None = None
    if isinstance(db, MemoryDatabase):
        adb: Any = async_view(db)
    else:
        client = AsyncMongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
        adb = client[db.name]
    dying = new_replica(
        engine, 1, faults.wrap(db), faults.wrap(adb), clock, "pod-dead", clock_refresh=1e6
    )
    await dying.measure_clock()
    await dying.start()
    try:
        expires = listed(db, dying.clock.now())["pod-dead"].expires_at
        faults.cut_off(3600)
        clock.advance(record_ttl(30) - 1)
        await dying.heartbeat()  # fails: the record is not refreshed
        errors = dying.stats()["replica_errors"]
        assert errors >= 1
        assert "pod-dead" in listed(db, expires - timedelta(seconds=1))
        clock.advance(1)
        assert listed(db, dying.clock.now()) == {}
        assert db[REPLICAS_COLLECTION].find_one({"_id": "pod-dead"}) is not None
    finally:
        await dying.stop()  # its removal fails too: logged and counted
        if client is not None:
            await client.close()
    assert dying.stats()["replica_errors"] > errors


@pytest.mark.parametrize("engine", ["threaded", "async"])
async def test_a_failing_replica_write_does_not_break_steps(engine: str, clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    faults = Faults(rates={"find_one_and_replace": 1.0}, clock=clock)  # the record's write, only
    replica = new_replica(
        engine, 0, faults.wrap(db), faults.wrap(async_view(db)), clock, "pod-1", clock_refresh=1e6
    )
    done = threading.Event()
    finished: list[str] = []

    @replica.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        outcome = await lease.advance("Done")
        finished.append(lease.doc["_id"])
        if len(finished) == 3:
            done.set()
        return outcome

    await replica.measure_clock()
    await replica.start()  # its first record fails: start goes on
    try:
        for n in range(3):
            await replica.submit("jobs", {"_id": f"j{n}", "phase": "Running"})
        assert await wait(done)
        await replica.heartbeat()  # fails again, and raises nothing
        errors = replica.stats()["replica_errors"]
        assert errors >= 2
        assert Reports(db).live_replicas(replica.clock.now()) == []
        assert sorted(d["_id"] for d in db.jobs.find({"phase": "Done"})) == ["j0", "j1", "j2"]

        faults.rates["find_one_and_replace"] = 0.0  # the next heartbeat writes it
        await replica.heartbeat()
        assert [r.replica_id for r in Reports(db).live_replicas(replica.clock.now())] == ["pod-1"]
    finally:
        await replica.stop()
    assert Reports(db).live_replicas(replica.clock.now()) == []


def _pause(orch: Orchestrator) -> None:
    """Stop a started replica's own ticks and heartbeats (its timer), keeping it started."""
    timer = orch._books.timer
    assert timer is not None
    timer.pause()


def test_two_processes_with_one_replica_id_are_told(
    make: MakeReplica, db: Database[Any], caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    """Leases name their holder by replica id: two live processes sharing one is a
    mistake each of them logs, the first time the other's record replaced its own."""
    first, second = make("pod-1"), make("pod-1")
    first.start()
    _pause(first)  # only this test's heartbeats: the counts below are exact
    clock.advance(RECORD_INTERVAL)  # an idle replica writes its record this often
    first.heartbeat()
    second.start()  # replaces a record of its namesake's: its own first, nothing to tell
    _pause(second)
    assert "replica_namesakes" not in second.stats()
    clock.advance(RECORD_INTERVAL)
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        first.heartbeat()
    assert first.stats()["replica_namesakes"] == 1
    assert "another live process records itself as replica 'pod-1'" in caplog.text
    clock.advance(RECORD_INTERVAL)
    first.heartbeat()  # its own record this time
    assert first.stats()["replica_namesakes"] == 1
    second.heartbeat()
    assert second.stats()["replica_namesakes"] == 1
    first.stop()
    [left] = Reports(db).live_replicas(second.clock.now())
    assert left.instance == second._record.instance  # the stopping one removed only its own


async def test_sync_and_async_replicas_with_mixed_settings_are_flagged(clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    threaded = Orchestrator(db, replica_id="pod-sync", clock=clock, lock_timeout=30)
    aio = AsyncOrchestrator(
        async_view(db), replica_id="pod-async", clock=clock, lock_timeout=120, tick=2.0
    )
    threaded.start()
    try:
        await aio.start()
        try:
            live = Reports(db).live_replicas(threaded.clock.now())
            assert [(r.replica_id, r.engine) for r in live] == [
                ("pod-async", "async"),
                ("pod-sync", "threaded"),
            ]
            found = disagreements(live)
            assert [d.setting for d in found] == ["lock_timeout", "tick"]
            assert found[0].message == (
                "replicas disagree on lock_timeout: 30s (pod-sync); 120s (pod-async)"
            )
        finally:
            await aio.stop()
    finally:
        threaded.stop()


async def test_the_collection_is_a_setting(clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    orch = Orchestrator(db, replica_id="pod-1", clock=clock, replicas_collection="ops.replicas")
    orch.start()
    try:
        assert Reports(db).live_replicas(orch.clock.now()) == []
        [found] = Reports(db).live_replicas(orch.clock.now(), "ops.replicas")
        assert found.replica_id == "pod-1"
    finally:
        orch.stop()


# -- orchestrator status -------------------------------------------------------------------


@pytest.fixture
def two_replicas(make: MakeReplica) -> list[Orchestrator]:
    """Two started replicas on the tests' database whose lock timeouts and concurrency
    differ."""
    started = [make("pod-a", lock_timeout=30), make("pod-b", lock_timeout=300, max_concurrency=2)]
    for orch in started:
        orch.start()
    return started


def status(
    db: Database[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
) -> tuple[int, str]:
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    code = cli.main(["status", "--uri", "mongodb://db.internal/platform", *args])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def test_status_lists_the_live_replicas_and_flags_their_disagreement(
    db: Database[Any],
    two_replicas: list[Orchestrator],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = status(db, monkeypatch, capsys)
    assert code == 0  # a rolling change disagrees on purpose: a warning, not a failure
    assert "live replicas" in out
    assert "pod-a" in out and "pod-b" in out and "300s" in out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: replicas disagree on lock_timeout: 30s (pod-a); 300s (pod-b)",
        "warning: replicas disagree on max_concurrency: 2 (pod-b); 4 (pod-a)",
    ]


def test_status_json_has_the_replicas_and_their_disagreements(
    db: Database[Any],
    two_replicas: list[Orchestrator],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = status(db, monkeypatch, capsys, "--json")
    assert code == 0
    report = json.loads(out)
    rows = {r["replica_id"]: r for r in report["replicas"]}
    assert set(rows) == {"pod-a", "pod-b"}
    assert rows["pod-b"]["lock_timeout"] == 300
    assert rows["pod-a"]["pid"] == os.getpid()
    assert rows["pod-a"]["steps"] == []
    assert 0 <= rows["pod-a"]["seen_ago"] < record_ttl(30)
    assert [d["setting"] for d in report["disagreements"]] == ["lock_timeout", "max_concurrency"]
    assert all(p["collection"] != REPLICAS_COLLECTION for p in report["phases"])


def test_status_says_when_no_replica_is_live(
    db: Database[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = status(db, monkeypatch, capsys)
    assert code == 0
    assert "no live replicas" in out
    assert "warning" not in out


@pytest.mark.pure
@pytest.mark.parametrize("name", ["", "system.replicas", "ops.$replicas", "a\x00b", "r" * 121])
def test_the_replicas_collection_must_be_a_usable_name(name: str) -> None:
    with pytest.raises(ConfigError, match="replicas_collection"):
        Settings.build(replicas_collection=name)


@pytest.mark.pure
def test_a_replica_silent_past_two_record_intervals_is_stale() -> None:
    """Its record lives four record intervals (``record_ttl``); past two missed, operators
    are told: it died, stalled or lost the database, and its leases will be taken over."""
    seen = record("pod-1", now=T0)
    beat = RECORD_INTERVAL
    assert not seen.stale(T0 + timedelta(seconds=2 * beat))
    assert seen.stale(T0 + timedelta(seconds=2 * beat + 0.001))
    assert seen.live(T0 + timedelta(seconds=2 * beat + 0.001))
