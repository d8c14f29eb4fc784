"""Schedules on both engines and every store: each fire time starts one document across
replicas, whatever their crashes, disagreements and the operators; the overlap policies;
missed fires; functions that raise or return garbage; declarations refused at once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.database import Database
from pymongo.errors import WriteError

from orchestrator import ConfigError, Orchestrator
from orchestrator.core.queries import schedules as queries
from orchestrator.core.schedules import SCHEDULED_FIELD, run_id
from orchestrator.testing import FakeClock, memory_database
from orchestrator.testing.faults import Faults
from tests.conftest import MakeEither
from tests.engines import Replica

pytestmark = pytest.mark.anyio

SCHEDULES = "orchestrator.schedules"


def runs(db: Database[Any], name: str) -> list[dict[str, Any]]:
    return sorted(
        db["jobs"].find({f"{SCHEDULED_FIELD}.name": name}),
        key=lambda d: d[SCHEDULED_FIELD]["fire"],
    )


def fires(db: Database[Any], name: str) -> list[datetime]:
    return [d[SCHEDULED_FIELD]["fire"].replace(tzinfo=UTC) for d in runs(db, name)]


def schedule_doc(db: Database[Any], name: str) -> dict[str, Any]:
    doc = db[SCHEDULES].find_one({"_id": name})
    assert doc is not None
    return doc


async def ticks(replicas: list[Replica], clock: FakeClock, seconds: int) -> None:
    """Every replica runs a tick each second of fake time, in turn."""
    for _ in range(seconds):
        for replica in replicas:
            await replica.run_once(heartbeat=False)
        clock.advance(1)


def workflow(replica: Replica, box: dict[str, Any] | None = None) -> None:
    """The runs' handler: done at once, or waiting while ``box["hold"]`` is set."""

    @replica.phase("jobs", "Make")
    async def make(lease: Any) -> Any:
        if box is not None and box.get("hold"):
            return await lease.relock(600)
        return await lease.advance("Done")


def every(replica: Replica, name: str = "tick", seconds: float = 5, **opts: Any) -> None:
    @replica.schedule(name, "jobs", every=seconds, **opts)
    def fire(at: datetime) -> dict[str, Any]:
        return {"phase": "Make", "at": at}


def due_between(start: datetime, end: datetime, step: float) -> list[datetime]:
    """The fire times of an every-``step`` schedule in (start, end]."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    k = int((start - epoch).total_seconds() // step) + 1
    found = []
    while (at := epoch + timedelta(seconds=k * step)) <= end:
        found.append(at)
        k += 1
    return found


# -- one document per fire time ---------------------------------------------------------


async def test_each_fire_time_starts_one_document_across_replicas(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    fleet = [await replicas(f"pod-{n}") for n in range(3)]
    for replica in fleet:
        workflow(replica)
        every(replica, seconds=2)
    start = fleet[0].clock.now()
    await ticks(fleet, clock, 30)
    end = fleet[0].clock.now() - timedelta(seconds=1)
    started = fires(db, "tick")
    assert started == due_between(start, end, 2)[: len(started)]
    assert len(started) >= len(due_between(start, end, 2)) - 1  # the last may be due now
    assert [d["_id"] for d in runs(db, "tick")] == [run_id("tick", f) for f in started]
    assert {d["phase"] for d in runs(db, "tick")} == {"Done"}
    assert schedule_doc(db, "tick")["counts"] == {"started": len(started)}


async def test_a_fire_whose_step_died_after_its_submit_is_not_started_twice(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    first, second = await replicas("pod-1"), await replicas("pod-2")
    for replica in (first, second):
        workflow(replica)
        every(replica, seconds=5)
    await ticks([first], clock, 12)
    before = fires(db, "tick")
    assert before
    # The step's own write never landed: the document still says the fire is next, and
    # its lease is free (expired), so another replica takes the fire again.
    db[SCHEDULES].update_one(
        {"_id": "tick"},
        {
            "$set": {
                "next": before[-1],
                "lockedUntil": datetime(2000, 1, 1),
                "counts": {"started": len(before) - 1},
            }
        },
    )
    await second.run_once(heartbeat=False)
    after = fires(db, "tick")
    assert after[: len(before)] == before  # each once; a fire due since may follow
    assert schedule_doc(db, "tick")["counts"] == {"started": len(after)}


async def test_a_replica_that_does_not_declare_a_schedule_never_claims_it(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    declaring, other = await replicas("pod-1"), await replicas("pod-2")
    workflow(declaring)
    workflow(other)
    every(declaring, seconds=2, overlap="allow_all")
    await declaring.run_once(heartbeat=False)
    for _ in range(10):
        await other.run_once(heartbeat=False)
        clock.advance(1)
    assert fires(db, "tick") == []
    assert other.stats().get("claimed", 0) == 0
    await declaring.run_once(heartbeat=False)
    assert len(fires(db, "tick")) >= 4


# -- the overlap policies ---------------------------------------------------------------


async def test_skip_leaves_a_fire_while_the_previous_run_goes_on(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    box = {"hold": True}
    workflow(replica, box)
    every(replica, seconds=5)
    await ticks([replica], clock, 16)
    assert len(fires(db, "tick")) == 1
    counts = schedule_doc(db, "tick")["counts"]
    assert counts["started"] == 1 and counts["skipped"] >= 2


async def test_buffer_one_starts_one_waiting_fire_when_the_previous_run_ends(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    box = {"hold": True}
    workflow(replica, box)
    every(replica, seconds=5, overlap="buffer_one")
    await ticks([replica], clock, 16)
    doc = schedule_doc(db, "tick")
    assert len(fires(db, "tick")) == 1
    assert "buffered" not in doc["counts"] and doc["counts"]["skipped"] >= 1
    buffered = doc["buffered"].replace(tzinfo=UTC)
    box["hold"] = False
    db["jobs"].update_many({"phase": "Make"}, {"$set": {"lockedUntil": datetime(2000, 1, 1)}})
    await ticks([replica], clock, 6)
    assert buffered in fires(db, "tick")
    still = schedule_doc(db, "tick")["buffered"]
    assert still is None or still.replace(tzinfo=UTC) > buffered  # a later one, if any


async def test_allow_all_starts_every_fire(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica, {"hold": True})
    every(replica, seconds=5, overlap="allow_all")
    start = replica.clock.now()
    await ticks([replica], clock, 16)
    assert fires(db, "tick") == due_between(start, start + timedelta(seconds=15), 5)
    assert {d["phase"] for d in runs(db, "tick")} == {"Make"}


async def test_cancel_previous_cancels_the_runs_going_on_and_starts_the_fire(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica, {"hold": True})
    every(replica, seconds=5, overlap="cancel_previous")
    await ticks([replica], clock, 16)
    phases = [d["phase"] for d in runs(db, "tick")]
    assert len(phases) >= 3
    assert set(phases[:-1]) == {"Cancelled"} and phases[-1] == "Make"


async def test_an_overlap_policy_needs_the_runs_handlers_on_the_replica(
    replicas: MakeEither,
) -> None:
    replica = await replicas()
    every(replica, seconds=5)
    with pytest.raises(ConfigError, match="needs the handlers of 'jobs'"):
        await replica.run_once(heartbeat=False)


# -- missed fires -----------------------------------------------------------------------


async def test_fires_missed_in_an_outage_start_inside_the_window_and_count_outside(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=10, catch_up=35, overlap="allow_all")
    await replica.run_once(heartbeat=False)
    clock.advance(100)  # no replica runs
    await replica.run_once(heartbeat=False)
    doc = schedule_doc(db, "tick")
    assert 3 <= len(fires(db, "tick")) <= 4  # those of the last 35 s (the last may be now)
    assert doc["counts"]["missed"] >= 6
    assert doc["lastMissed"]["last"].replace(tzinfo=UTC) < fires(db, "tick")[0]


async def test_coalesce_starts_one_document_for_the_fires_missed(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=10, catch_up=3600, coalesce=True)
    await replica.run_once(heartbeat=False)
    clock.advance(60)
    await replica.run_once(heartbeat=False)
    assert len(fires(db, "tick")) == 1
    assert schedule_doc(db, "tick")["counts"]["coalesced"] >= 4


async def test_a_paused_schedule_waits_and_resumes_with_its_catch_up(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=10, catch_up=25, overlap="allow_all")
    await replica.run_once(heartbeat=False)
    db[SCHEDULES].update_one({"_id": "tick"}, queries.pause_update(True))
    await ticks([replica], clock, 60)
    assert fires(db, "tick") == []
    db[SCHEDULES].update_one({"_id": "tick"}, queries.pause_update(False))
    await replica.run_once(heartbeat=False)
    assert 2 <= len(fires(db, "tick")) <= 3
    assert schedule_doc(db, "tick")["counts"]["missed"] >= 3


# -- the schedule's function ------------------------------------------------------------


async def test_a_function_that_raises_fails_its_fire_and_the_next_fire_still_comes(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    calls: list[datetime] = []

    @replica.schedule("flaky", "jobs", every=5)
    def fire(at: datetime) -> dict[str, Any]:
        calls.append(at)
        if len(calls) == 1:
            raise RuntimeError("the report service is down")
        return {"phase": "Make"}

    await ticks([replica], clock, 12)
    doc = schedule_doc(db, "flaky")
    assert doc["counts"]["failed"] == 1 and doc["counts"]["started"] >= 1
    assert fires(db, "flaky") == calls[1:]


@pytest.mark.parametrize(
    ("returned", "result", "said"),
    [
        (None, "declined", None),
        (5, "failed", "returned a int, not a document"),
        ({"_id": "mine", "phase": "Make"}, "failed", "sets _id"),
        ({"phase": "Make", SCHEDULED_FIELD: 1}, "failed", "sets _id or 'scheduled'"),
        ({"no": "phase"}, "failed", "needs a 'phase'"),
        ({"phase": "Make", "lockedUntil": 1}, "failed", "managed by the orchestrator"),
    ],
)
async def test_what_the_function_returns_is_started_declined_or_recorded_failed(
    replicas: MakeEither,
    db: Database[Any],
    clock: FakeClock,
    returned: Any,
    result: str,
    said: str | None,
) -> None:
    replica = await replicas()
    workflow(replica)

    @replica.schedule("odd", "jobs", every=5)
    def fire(at: datetime) -> Any:
        return returned

    await ticks([replica], clock, 7)
    doc = schedule_doc(db, "odd")
    assert fires(db, "odd") == []
    assert doc["last"]["result"] == result
    if said is None:
        assert doc["last"]["error"] is None
    else:
        assert said in doc["last"]["error"]
    assert doc["phase"] == "Scheduled"


# -- declarations -----------------------------------------------------------------------


async def test_the_replica_started_last_writes_its_spec_and_every_replica_fires_by_it(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    old, new = await replicas("pod-old"), await replicas("pod-new")
    workflow(old)
    workflow(new)
    every(old, seconds=5)
    every(new, seconds=20)
    await old.run_once(heartbeat=False)
    assert schedule_doc(db, "tick")["spec"]["every"] == 5
    await new.run_once(heartbeat=False)
    assert schedule_doc(db, "tick")["spec"]["every"] == 20
    await ticks([old], clock, 61)
    gaps = {b - a for a, b in zip(fires(db, "tick"), fires(db, "tick")[1:], strict=False)}
    assert gaps == {timedelta(seconds=20)}


async def test_a_new_spec_goes_on_past_the_fires_a_step_started_before_its_write_was_lost(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    old = await replicas("pod-old")
    workflow(old)
    every(old, seconds=5)
    await ticks([old], clock, 31)
    started = fires(db, "tick")
    assert len(started) >= 4
    # The last step's write never landed: the stored next fire is two fires back, and
    # the counts do not have those two.
    db[SCHEDULES].update_one(
        {"_id": "tick"},
        {"$set": {"next": started[-2], "counts": {"started": len(started) - 2}}},
    )
    new = await replicas("pod-new")
    workflow(new)
    every(new, seconds=20)
    await new.run_once(heartbeat=False)
    doc = schedule_doc(db, "tick")
    assert doc["spec"]["every"] == 20
    # From past the latest run the old spec started, on the new spec's times; the two
    # runs whose record was lost are counted, once.
    assert (
        doc["next"].replace(tzinfo=UTC)
        == due_between(started[-1], started[-1] + timedelta(seconds=20), 20)[0]
    )
    assert doc["counts"] == {"started": len(started)}
    await ticks([old, new], clock, 60)
    later = fires(db, "tick")[len(started) :]
    assert later and all(f > started[-1] and f.second % 20 == 0 for f in later)
    assert schedule_doc(db, "tick")["counts"]["started"] == len(fires(db, "tick"))


async def test_a_step_of_the_old_spec_writing_after_the_new_one_leaves_the_new_times_firing(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=20)
    await replica.run_once(heartbeat=False)
    # A replica of the old deploy (every 5 s) was mid-step when this spec was written:
    # its write sets the next fire on its own times.
    now = replica.clock.now()
    off_grid = due_between(now, now + timedelta(seconds=20), 5)
    off_grid = [f for f in off_grid if f.second % 20][:1]
    db[SCHEDULES].update_one(
        {"_id": "tick"}, {"$set": {"next": off_grid[0], "lockedUntil": off_grid[0]}}
    )
    await ticks([replica], clock, 70)
    started = fires(db, "tick")
    assert started[0] == due_between(off_grid[0], off_grid[0] + timedelta(seconds=20), 20)[0]
    assert len(started) >= 3
    assert all(f.second % 20 == 0 for f in started)


async def test_a_stored_spec_that_is_garbage_is_replaced_by_the_declared_one(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    db[SCHEDULES].insert_one(
        {"_id": "tick", "phase": "Scheduled", "spec": "nonsense", "next": "soon", "counts": 3}
    )
    every(replica, seconds=5)
    await ticks([replica], clock, 12)
    doc = schedule_doc(db, "tick")
    assert doc["spec"]["every"] == 5
    assert len(fires(db, "tick")) >= 2


@pytest.mark.parametrize(
    ("opts", "said"),
    [
        ({}, "give cron=... or every=..."),
        ({"cron": "0 2 * * *", "every": 5}, "give cron=... or every=..."),
        ({"cron": "0 2 * *"}, "five fields"),
        ({"cron": "0 2 * * *", "timezone": "Nowhere/City"}, "unknown timezone"),
        ({"every": 0.2}, "between 1s"),
        ({"every": 5, "timezone": "Europe/Berlin"}, "timezone applies to cron only"),
        ({"every": 5, "overlap": "sometimes"}, "overlap is one of"),
        ({"every": 5, "catch_up": -1}, "catch_up"),
        ({"every": 5, "jitter": "a bit"}, "jitter"),
        ({"every": 5, "coalesce": "yes"}, "coalesce"),
    ],
)
async def test_a_bad_declaration_is_refused_at_once_with_one_line(
    replicas: MakeEither, opts: dict[str, Any], said: str
) -> None:
    replica = await replicas()
    with pytest.raises(ConfigError, match=said) as raised:
        replica.schedule("s", "jobs", **opts)
    assert "\n" not in str(raised.value)


async def test_a_name_is_declared_once(replicas: MakeEither) -> None:
    replica = await replicas()
    every(replica, "s", overlap="allow_all")
    with pytest.raises(ConfigError, match="declared twice"):
        every(replica, "s", overlap="allow_all")


def test_the_threaded_engine_refuses_an_async_function(make: Callable[..., Any]) -> None:
    orch = make()

    async def fire(at: datetime) -> dict[str, Any]:
        return {"phase": "Make"}

    with pytest.raises(ConfigError):
        orch.schedule("s", "jobs", every=5, overlap="allow_all")(fire)


# -- the operators' requests ------------------------------------------------------------


async def test_a_trigger_starts_one_document_for_its_own_fire_time(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=3600)
    await replica.run_once(heartbeat=False)
    at = replica.clock.now().replace(microsecond=0)
    request = {"id": "r1", "kind": "trigger", "start": at, "by": "ops", "why": "now"}
    db[SCHEDULES].update_one({"_id": "tick"}, queries.request_update(request))
    db[SCHEDULES].update_one(queries.wake_filter("tick"), {"$set": {"lockedUntil": at}})
    await replica.run_once(heartbeat=False)
    await replica.run_once(heartbeat=False)
    assert at in fires(db, "tick")
    assert len(fires(db, "tick")) <= 2  # the hourly fire too, if the clocks crossed an hour
    assert schedule_doc(db, "tick")["requests"] == []
    assert schedule_doc(db, "tick")["counts"]["requested"] == 1


async def test_a_backfill_starts_only_the_fire_times_that_have_no_document(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=10, overlap="allow_all")
    await ticks([replica], clock, 25)
    ran = fires(db, "tick")
    start = ran[0] - timedelta(seconds=30)
    request = {"id": "b1", "kind": "backfill", "start": start, "end": ran[-1]}
    db[SCHEDULES].update_one({"_id": "tick"}, queries.request_update(request))
    db[SCHEDULES].update_one(
        queries.wake_filter("tick"), {"$set": {"lockedUntil": datetime(2000, 1, 1)}}
    )
    await replica.run_once(heartbeat=False)
    after = fires(db, "tick")
    assert after == sorted(set(after))
    assert set(ran) <= set(after)  # and a fire due since may follow them
    assert [f for f in after if f < ran[0]] == [start + timedelta(seconds=s) for s in (0, 10, 20)]


async def test_start_makes_the_index_a_schedule_finds_its_runs_by(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=3600)
    await replica.start()
    await replica.stop()
    keys = [list(index["key"]) for index in db["jobs"].list_indexes()]
    assert [f"{SCHEDULED_FIELD}.name", f"{SCHEDULED_FIELD}.fire"] in keys
    assert schedule_doc(db, "tick")["phase"] == "Scheduled"


async def test_a_schedule_an_operator_cancelled_is_said_at_start_not_revived(
    replicas: MakeEither, db: Database[Any], caplog: pytest.LogCaptureFixture
) -> None:
    db[SCHEDULES].insert_one({"_id": "tick", "phase": "Cancelled", "spec": {}})
    replica = await replicas()
    workflow(replica)
    every(replica, seconds=5)
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        await replica.run_once(heartbeat=False)
    assert any("is in phase 'Cancelled'" in r.getMessage() for r in caplog.records)
    assert schedule_doc(db, "tick")["phase"] == "Cancelled"


async def test_a_backfill_starts_every_fire_asked_whatever_the_overlap_policy(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    workflow(replica, {"hold": True})  # runs go on: a due fire would be skipped
    every(replica, seconds=3600)
    await replica.run_once(heartbeat=False)
    end = replica.clock.now().replace(microsecond=0)
    start = end - timedelta(hours=3)
    request = {"id": "b1", "kind": "backfill", "start": start, "end": end}
    db[SCHEDULES].update_one({"_id": "tick"}, queries.request_update(request))
    db[SCHEDULES].update_one(queries.wake_filter("tick"), {"$set": {"lockedUntil": start}})
    await replica.run_once(heartbeat=False)
    asked = due_between(start - timedelta(microseconds=1), end, 3600)
    assert fires(db, "tick") == asked
    assert schedule_doc(db, "tick")["counts"] == {"requested": len(asked)}


def test_a_document_the_server_refuses_for_good_fails_its_fire_and_the_next_comes(
    clock: FakeClock,
) -> None:
    db = memory_database(clock=clock)
    faults = Faults(clock=clock, delay=clock.advance)
    # One worker: the refusal scripted in the function is met by its own submit, not by
    # another worker's claim at that moment.
    orch = Orchestrator(
        faults.wrap(db), replica_id="pod-1", clock=clock, clock_refresh=1e6, max_concurrency=1
    )
    orch.phase("jobs", "Make")(lambda lease: lease.advance("Done"))
    calls: list[datetime] = []

    @orch.schedule("checked", "jobs", every=5)
    def fire(at: datetime) -> dict[str, Any]:
        calls.append(at)
        if len(calls) == 1:  # the collection's validator refuses it: for good, not for now
            faults.fail_next("find_one_and_update", WriteError("Document failed validation", 121))
        return {"phase": "Make"}

    orch.run_once(heartbeat=False)
    for _ in range(2):
        clock.advance(5)
        orch.run_once(heartbeat=False)
    doc = schedule_doc(db, "checked")
    assert doc["counts"] == {"failed": 1, "started": 1}
    assert fires(db, "checked") == calls[1:]
    assert doc["phase"] == "Scheduled" and doc.get("attempts", 0) == 0
