"""What operators do with the schedules, on both engines and the MONGODB_URI tier: list
them (garbage in a schedule's document listed as such), one with its runs, pause and
resume, trigger now and backfill a range, each audited; while a replica's step holds the
schedule too. And the replicas' records: the specs each declares, flagged when they
disagree."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator.core.fire_times import Every, fires_between
from orchestrator.core.names import SCHEDULES_COLLECTION
from orchestrator.core.replicas import disagreements
from orchestrator.core.schedules import MAX_BACKFILL, run_id
from orchestrator.operations import Operations, OperatorError, Refusal
from orchestrator.operations._sync import schedules as sync_schedules
from orchestrator.testing import FakeClock
from tests.conftest import MakeEither
from tests.engines import Replica

pytestmark = pytest.mark.anyio


async def every_five(replicas: MakeEither, replica_id: str = "pod-1", **spec: Any) -> Replica:
    """A replica declaring ``reports`` (its one phase ends at once) and the schedule
    ``every5`` (every 5 s, overlap allow_all unless ``spec`` says otherwise)."""
    replica = await replicas(replica_id)

    @replica.phase("reports", "Make")
    async def make(lease: Any) -> Any:
        return await lease.advance("Done")

    spec.setdefault("every", 5)
    spec.setdefault("overlap", "allow_all")
    replica.orch.schedule("every5", "reports", **spec)(lambda fire: {"phase": "Make"})
    return replica


async def ran(replica: Replica, clock: FakeClock, seconds: int) -> None:
    for _ in range(seconds):
        await replica.run_once(heartbeat=False)
        clock.advance(1)


def runs_of(db: Database[Any]) -> list[str]:
    return sorted(d["_id"] for d in db.reports.find({"scheduled.name": "every5"}))


async def test_listing_shows_each_schedule_with_its_last_run_and_that_runs_phase_now(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await every_five(replicas)
    await ran(replica, clock, 12)
    [row] = Operations(db).schedules()
    assert (row.name, row.spec, row.collection, row.overlap) == (
        "every5",
        "every 5s",
        "reports",
        "allow_all",
    )
    assert row.last is not None and row.last.result == "started"
    assert row.last.exists and row.last.phase == "Done"
    assert row.counts["started"] == len(runs_of(db)) >= 2
    assert row.missed == 0 and not row.paused
    assert row.declared_by == "pod-1" and row.next is not None
    shown, found = Operations(db).schedule("every5", runs=1)
    assert shown.name == "every5"
    [newest] = found
    assert newest.id == runs_of(db)[-1] and newest.phase == "Done"


async def test_an_unknown_schedule_is_refused_naming_those_there_are(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await every_five(replicas)
    await ran(replica, clock, 1)
    ops = Operations(db)
    for act in (
        lambda: ops.schedule("nope"),
        lambda: ops.pause_schedule("nope", why="x"),
        lambda: ops.trigger("nope", why="x"),
    ):
        with pytest.raises(OperatorError, match=r"no schedule 'nope'.*it has: every5") as caught:
            act()
        assert caught.value.refusal is Refusal.NOT_FOUND
        assert "\n" not in str(caught.value)


async def test_garbage_in_every_field_of_a_schedule_is_listed_as_such(db: Database[Any]) -> None:
    db[SCHEDULES_COLLECTION].insert_many(
        [
            {
                "_id": "junk",
                "spec": {"every": "often", "collection": 7},
                "next": "soon",
                "buffered": 3,
                "paused": "yes",
                "counts": {"started": "many", "weird": 1},
                "last": {"fire": "x", "result": 9, "run": {"bad": 1}, "error": ["e"]},
                "requests": "all of them",
                "declaredBy": 42,
            },
            {"_id": 17, "spec": None, "last": [1, 2], "counts": [], "requests": [1, {"id": 2}]},
            {"_id": "bare"},
        ]
    )
    ops = Operations(db)
    rows = {row.name: row for row in ops.schedules()}
    junk = rows["junk"]
    assert junk.spec.startswith("unreadable spec") and junk.collection is None
    assert junk.next is None and not junk.paused and junk.counts == {}
    assert set(junk.unreadable) >= {"spec", "next", "buffered", "paused", "counts", "requests"}
    assert junk.unreadable["next"] == "'soon'"
    assert junk.last is not None and junk.last.result is None and junk.last.fire is None
    numbered = rows['{"$numberInt": "17"}']  # an id that is no name: shown exactly
    assert numbered.unreadable["_id"] == "17" and "last" in numbered.unreadable
    assert rows["bare"].last is None and rows["bare"].spec.startswith("unreadable spec")
    for row in rows.values():
        row.to_dict()
    assert ops.schedule("junk")[1] == []  # no collection to read runs from
    assert ops.status().schedules is not None
    with pytest.raises(OperatorError, match="no readable spec"):
        ops.backfill("junk", clock_now(ops), clock_now(ops), why="x")


def clock_now(ops: Operations) -> Any:
    return ops.now()


async def test_pause_stops_the_fires_and_resume_starts_them_again_each_audited(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await every_five(replicas)
    await ran(replica, clock, 6)
    ops = Operations(db)
    before = runs_of(db)
    assert ops.pause_schedule("every5", by="ana", why="freeze")
    assert not ops.pause_schedule("every5", by="ana", why="again")
    await ran(replica, clock, 11)
    assert runs_of(db) == before
    assert ops.schedules()[0].paused
    assert ops.resume_schedule("every5", by="bo", why="thaw")
    assert not ops.resume_schedule("every5", by="bo", why="again")
    await ran(replica, clock, 2)
    assert len(runs_of(db)) > len(before)
    trail = [(e.action, e.by, e.why, e.scope.get("schedule")) for e in ops.audit()]
    assert trail == [("resume", "bo", "thaw", "every5"), ("pause", "ana", "freeze", "every5")]


async def test_a_trigger_starts_exactly_one_document_at_the_next_run_once(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await every_five(replicas, every=3600)
    await ran(replica, clock, 2)
    before = runs_of(db)
    triggered = Operations(db).trigger("every5", by="ana", why="rerun")
    assert triggered.woken
    assert triggered.run == run_id("every5", triggered.fire)
    await replica.run_once(heartbeat=False)
    await replica.run_once(heartbeat=False)
    new = set(runs_of(db)) - set(before)
    assert triggered.run in new
    assert len(new) <= 2  # the hourly fire too, if the clocks crossed an hour meanwhile
    [entry] = Operations(db).audit()
    assert (entry.action, entry.by, entry.why) == ("trigger", "ana", "rerun")
    assert Operations(db).schedules()[0].pending == 0


async def test_a_backfill_of_a_range_that_partly_ran_creates_only_the_missing_ones(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await every_five(replicas)
    start = replica.clock.now()
    await ran(replica, clock, 21)
    ran_already = runs_of(db)
    assert len(ran_already) >= 4
    db.reports.delete_one({"_id": ran_already[1]})
    ops = Operations(db)
    whole = start.replace(microsecond=0)
    begin, end = whole - timedelta(seconds=10), whole + timedelta(seconds=20)
    fires, _ = fires_between(Every(5), begin - timedelta(microseconds=1), end, 100)
    done = ops.backfill("every5", begin, end, why="gap")
    assert done.fires == len(fires) >= 6
    await replica.run_once(heartbeat=False)
    expected = {run_id("every5", fire) for fire in fires} | set(ran_already)
    later = set(runs_of(db)) - expected  # the schedule's own fires come due meanwhile
    assert expected <= set(runs_of(db))
    assert all(rid > run_id("every5", end) for rid in later)
    started = [e for e in db.reports.find() if e["_id"] in ran_already]
    assert all(doc["phase"] == "Done" for doc in started)


async def test_a_backfill_is_refused_backwards_or_past_its_limit_in_one_line(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await every_five(replicas)
    await ran(replica, clock, 1)
    ops, now = Operations(db), replica.clock.now()
    with pytest.raises(OperatorError, match="before its start"):
        ops.backfill("every5", now, now - timedelta(seconds=1), why="x")
    with pytest.raises(OperatorError, match=f"more than {MAX_BACKFILL} times"):
        ops.backfill("every5", now - timedelta(days=1), now, why="x")
    assert ops.audit() == []


async def test_a_trigger_while_a_step_holds_the_schedule_is_served_by_a_later_step(
    replicas: MakeEither, db: Database[Any], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_schedules, "WAKE_PAUSE", 0.0)
    replica = await every_five(replicas, every=3600)
    await ran(replica, clock, 1)
    now = replica.clock.now()
    # A replica's step holds the schedule: a lease that outlives the wake's tries.
    held = {"lockToken": "held-by-pod-9", "lockedUntil": now + timedelta(seconds=30)}
    db[SCHEDULES_COLLECTION].update_one({"_id": "every5"}, {"$set": held})
    ops = Operations(db)
    triggered = ops.trigger("every5", by="ana", why="now")
    assert not triggered.woken and triggered.until is not None
    assert ops.pause_schedule("every5", why="held too")  # no lease is needed to pause
    assert ops.resume_schedule("every5", why="held too")
    doc = db[SCHEDULES_COLLECTION].find_one({"_id": "every5"}) or {}
    assert doc["lockToken"] == "held-by-pod-9"  # nobody's lease was taken
    clock.advance(31)
    await replica.run_once(heartbeat=False)
    await replica.run_once(heartbeat=False)
    assert triggered.run in runs_of(db)


async def test_records_publish_declared_specs_and_flag_replicas_that_disagree(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    old = await every_five(replicas, "pod-1")
    new = await every_five(replicas, "pod-2", every=10)
    await old.start()
    await new.start()
    ops = Operations(db)
    records = {r.replica_id: r for r in ops.replicas()}
    assert [s.name for s in records["pod-1"].schedules] == ["every5"]
    [found] = [d for d in disagreements(records.values()) if d.setting == "schedule of every5"]
    assert {ids for _, ids in found.values} == {("pod-1",), ("pod-2",)}
    [row] = ops.schedules()
    assert row.disagreement == found
    assert row.declared_by == "pod-2"  # the replica started last wrote its spec
    assert row.spec == "every 10s"
    assert found in ops.status().disagreements
