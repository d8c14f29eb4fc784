"""What a schedule's step decides (``orchestrator/core/schedules.py``): which fires are due,
which are missed or coalesced, what the overlap policy does, the ``_id`` and jitter every
replica computes alike, and a stored document read whatever it holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from orchestrator import ConfigError
from orchestrator.core.fire_times import Cron, Every
from orchestrator.core.schedules import (
    MAX_FIRES_PER_STEP,
    Decision,
    Overlap,
    Request,
    ScheduleSpec,
    ScheduleState,
    Source,
    decide,
    due_plan,
    jitter_of,
    run_id,
    spec_of,
    takeover,
)

pytestmark = pytest.mark.pure

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def spec(**given: Any) -> ScheduleSpec:
    given.setdefault("times", Every(10))
    return ScheduleSpec(name="s", collection="jobs", **given)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- what is due ------------------------------------------------------------------------


def test_nothing_is_due_before_the_next_fire() -> None:
    plan = due_plan(spec(), at(10), at(9.9))
    assert (plan.start, plan.missed, plan.next, plan.more) == ([], 0, at(10), False)


def test_the_fires_passed_are_due_in_order_and_the_next_is_the_first_ahead() -> None:
    plan = due_plan(spec(), at(10), at(35))
    assert plan.start == [at(10), at(20), at(30)]
    assert plan.next == at(40)


def test_fires_older_than_the_catch_up_window_are_counted_missed_not_started() -> None:
    plan = due_plan(spec(catch_up=25), at(10), at(100))
    assert plan.missed == 7  # 10..70 are older than 100 - 25
    assert (plan.missed_first, plan.missed_last) == (at(10), at(70))
    assert plan.start == [at(80), at(90), at(100)]


def test_coalesce_starts_only_the_latest_due_fire() -> None:
    plan = due_plan(spec(coalesce=True), at(10), at(45))
    assert plan.start == [at(40)]
    assert plan.coalesced == [at(10), at(20), at(30)]


def test_a_long_catch_up_goes_on_in_the_next_step() -> None:
    plan = due_plan(spec(times=Every(1)), at(1), at(1000))
    assert len(plan.start) == MAX_FIRES_PER_STEP and plan.more
    assert plan.next == at(1 + MAX_FIRES_PER_STEP)


def test_an_outage_of_years_counts_its_misses_without_walking_each_one() -> None:
    plan = due_plan(spec(times=Every(1), catch_up=5), at(1), at(3 * 365 * 86_400))
    assert plan.missed >= 100_000
    assert plan.start and plan.start[-1] == at(3 * 365 * 86_400)


def test_a_fire_is_due_once_its_jitter_has_passed() -> None:
    jittered = spec(jitter=8)
    offset = jitter_of("s", at(10), 8).total_seconds()
    assert 0 <= offset < 8
    assert due_plan(jittered, at(10), at(10 + offset) - timedelta(milliseconds=1)).start == []
    assert due_plan(jittered, at(10), at(10 + offset)).start == [at(10)]


def test_jitter_is_the_same_on_every_replica_and_spreads_fires() -> None:
    offsets = {jitter_of("s", at(10 * n), 60) for n in range(50)}
    assert len(offsets) > 40
    assert jitter_of("s", at(10), 60) == jitter_of("s", at(10), 60)
    assert jitter_of("s", at(10), 0) == timedelta(0)


# -- overlap ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", list(Overlap))
def test_what_an_operator_asked_for_starts_and_a_buffered_fire_waits_for_the_runs(
    overlap: Overlap,
) -> None:
    assert decide(overlap, True, True, Source.REQUESTED) is Decision.START
    assert decide(overlap, True, True, Source.BUFFERED) is Decision.BUFFER
    assert decide(overlap, False, True, Source.BUFFERED) is Decision.START


@pytest.mark.parametrize(
    ("overlap", "active", "buffered", "decision"),
    [
        (Overlap.SKIP, False, False, Decision.START),
        (Overlap.SKIP, True, False, Decision.SKIP),
        (Overlap.BUFFER_ONE, True, False, Decision.BUFFER),
        (Overlap.BUFFER_ONE, True, True, Decision.SKIP),
        (Overlap.ALLOW_ALL, True, True, Decision.START),
        (Overlap.CANCEL_PREVIOUS, True, False, Decision.CANCEL_AND_START),
        (Overlap.CANCEL_PREVIOUS, False, False, Decision.START),
    ],
)
def test_the_overlap_policy_decides_a_fire_while_runs_go_on(
    overlap: Overlap, active: bool, buffered: bool, decision: Decision
) -> None:
    assert decide(overlap, active, buffered) is decision


# -- a new spec taking over --------------------------------------------------------------


def test_a_new_spec_goes_on_from_the_stored_next_fire_on_its_own_times() -> None:
    taken = takeover(spec(), spec(times=Every(15)), at(20), [], at(100))
    assert (taken.first, taken.started, taken.missed) == (at(30), 0, 0)


def test_a_new_spec_goes_on_past_the_runs_a_step_started_before_its_write_was_lost() -> None:
    # The stored next fire is 20; a step started 40 and 50 (not 20, 30) and lost its
    # write: the old spec got to 60, its fires 20..50 passed, two of them started.
    runs = [at(40), at(50), at(7), at(55)]  # 7 and 55: a trigger's own instants, no fire
    taken = takeover(spec(), spec(times=Every(15)), at(20), runs, at(100))
    assert (taken.first, taken.started, taken.missed) == (at(60), 2, 2)
    assert taken.counted({"started": 3, "skipped": 1}) == {
        "started": 5,
        "skipped": 1,
        "missed": 2,
    }


def test_a_garbage_spec_or_next_fire_leaves_nothing_to_account_for() -> None:
    assert takeover(None, spec(), at(20), [at(40)], at(100)) == takeover(
        None, spec(), at(20), [], at(0)
    )
    assert takeover(spec(), spec(), None, [at(40)], at(95)).first == at(100)


# -- names and ids ----------------------------------------------------------------------


def test_a_fire_times_document_id_is_its_schedule_and_its_instant() -> None:
    assert (
        run_id("nightly", datetime(2026, 3, 29, 1, 30, tzinfo=UTC))
        == "nightly@2026-03-29T01:30:00Z"
    )
    berlin = datetime(2026, 3, 29, 3, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert run_id("n", berlin) == "n@2026-03-29T01:30:00Z"
    assert run_id("n", at(1.5)) == "n@2026-01-01T00:00:01.500Z"


@pytest.mark.parametrize("name", ["", "$x", "a\nb", 5, "x" * 201])
def test_a_bad_name_is_refused(name: Any) -> None:
    with pytest.raises(ConfigError, match="schedule's name"):
        ScheduleSpec(name=name, collection="jobs", times=Every(10))


def test_a_spec_that_never_fires_is_refused_at_declaration() -> None:
    with pytest.raises(ConfigError, match="never fires"):
        spec(times=Cron("0 0 30 2 *"))


# -- the stored document ----------------------------------------------------------------


def test_a_stored_spec_reads_back_equal_and_garbage_is_a_config_error() -> None:
    declared = spec(times=Cron("0 2 * * *", "Europe/Berlin"), overlap=Overlap.BUFFER_ONE, jitter=3)
    assert spec_of("s", declared.stored()) == declared
    assert declared.same(declared.stored())
    assert not declared.same({**declared.stored(), "jitter": 4.0})
    for garbage in (
        None,
        [],
        {"cron": "0 2 * * *"},
        {**declared.stored(), "overlap": "x"},
        {**declared.stored(), "catchUp": -1},
        {**declared.stored(), "jitter": "a"},
    ):
        assert not declared.same(garbage)
        with pytest.raises(ConfigError):
            spec_of("s", garbage)


def test_a_schedule_document_holding_garbage_reads_as_absent_fields() -> None:
    state = ScheduleState.read(
        {
            "next": "tomorrow",
            "buffered": 5,
            "counts": {"started": 3, "bogus": 1, "skipped": "x"},
            "requests": [
                {"id": "r1", "kind": "trigger", "start": at(5)},
                {"id": "r2", "kind": "backfill", "start": at(0), "end": at(30)},
                {"kind": "trigger"},
                "junk",
            ],
        }
    )
    assert (state.next, state.buffered, state.counts) == (None, None, {"started": 3})
    assert [r.id for r in state.requests] == ["r1", "r2"]
    assert state.dropped == [{"kind": "trigger"}, "junk"]
    assert ScheduleState.read({"counts": 7, "requests": "x"}).requests == []


def test_a_request_names_its_fire_times() -> None:
    trigger = Request.read({"id": "r", "kind": "trigger", "start": at(7)})
    backfill = Request.read({"id": "r", "kind": "backfill", "start": at(10), "end": at(40)})
    assert trigger is not None and backfill is not None
    assert trigger.fires(Every(10)) == [at(7)]
    assert backfill.fires(Every(10)) == [at(10), at(20), at(30), at(40)]
