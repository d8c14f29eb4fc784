"""When schedules fire (``orchestrator/core/fire_times.py``): crontab's meaning in a named
timezone across DST transitions, intervals every replica counts alike, and specs refused
at declaration with one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from orchestrator import ConfigError
from orchestrator.core.fire_times import Cron, Every, FireTimes, fire_times_of, fires_between

pytestmark = pytest.mark.pure

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def walk(times: FireTimes, start: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    moment = start
    for _ in range(count):
        fire = times.after(moment)
        assert fire is not None
        found.append(fire)
        moment = fire
    return found


def local(fires: list[datetime], zone: ZoneInfo) -> list[str]:
    return [f.astimezone(zone).strftime("%m-%d %H:%M%z") for f in fires]


# -- DST --------------------------------------------------------------------------------


def test_a_daily_time_the_spring_forward_skips_fires_once_that_day() -> None:
    fires = walk(Cron("30 2 * * *", "Europe/Berlin"), datetime(2026, 3, 27, 12, tzinfo=UTC), 4)
    assert local(fires, BERLIN) == [
        "03-28 02:30+0100",
        "03-29 03:30+0200",  # 02:30 does not exist that day: once, an hour on
        "03-30 02:30+0200",
        "03-31 02:30+0200",
    ]


def test_a_daily_time_the_fall_back_repeats_fires_once_that_day() -> None:
    fires = walk(Cron("30 1 * * *", "America/New_York"), datetime(2026, 10, 31, 12, tzinfo=UTC), 3)
    assert local(fires, NEW_YORK) == ["11-01 01:30-0400", "11-02 01:30-0500", "11-03 01:30-0500"]


def test_berlin_fall_back_and_new_york_spring_forward_alike() -> None:
    autumn = walk(Cron("30 2 * * *", "Europe/Berlin"), datetime(2026, 10, 24, 12, tzinfo=UTC), 3)
    assert local(autumn, BERLIN) == ["10-25 02:30+0200", "10-26 02:30+0100", "10-27 02:30+0100"]
    spring = walk(Cron("30 2 * * *", "America/New_York"), datetime(2026, 3, 7, 12, tzinfo=UTC), 3)
    assert local(spring, NEW_YORK) == ["03-08 03:30-0400", "03-09 02:30-0400", "03-10 02:30-0400"]


def test_an_hourly_cron_keeps_its_cadence_in_real_time_through_both_transitions() -> None:
    autumn = walk(Cron("30 * * * *", "America/New_York"), datetime(2026, 11, 1, 4, tzinfo=UTC), 4)
    assert [f - autumn[0] for f in autumn] == [timedelta(hours=h) for h in range(4)]
    spring = walk(Cron("30 * * * *", "Europe/Berlin"), datetime(2026, 3, 28, 23, tzinfo=UTC), 4)
    assert [f - spring[0] for f in spring] == [timedelta(hours=h) for h in range(4)]


# -- crontab's meaning ------------------------------------------------------------------


def test_weekday_numbers_are_crontabs_zero_and_seven_are_sunday() -> None:
    start = datetime(2026, 11, 27, tzinfo=UTC)  # a Friday
    for field in ("0", "7", "sun", "SUN"):
        fire = Cron(f"0 2 * * {field}").after(start)
        assert fire is not None and fire.strftime("%a %d") == "Sun 29"
    weekdays = walk(Cron("0 9 * * 1-5"), start, 5)
    assert [f.strftime("%a") for f in weekdays] == ["Fri", "Mon", "Tue", "Wed", "Thu"]
    every_other = walk(Cron("0 0 * * */2"), start, 4)
    assert [f.strftime("%a") for f in every_other] == ["Sat", "Sun", "Tue", "Thu"]


def test_day_of_month_and_weekday_both_restricted_fire_on_either() -> None:
    fires = walk(Cron("0 2 1 * mon"), datetime(2026, 11, 27, tzinfo=UTC), 3)
    assert [f.strftime("%a %d") for f in fires] == ["Mon 30", "Tue 01", "Mon 07"]


def test_six_fields_put_seconds_first() -> None:
    fires = walk(Cron("*/15 * * * * *"), datetime(2026, 1, 1, tzinfo=UTC), 3)
    assert [f.second for f in fires] == [15, 30, 45]


def test_fire_times_are_strictly_after_the_moment_asked() -> None:
    at = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)
    assert Cron("0 2 * * *").after(at) == at + timedelta(days=1)
    assert Every(5).after(at) == at + timedelta(seconds=5)


# -- intervals --------------------------------------------------------------------------


def test_an_interval_counts_from_one_anchor_so_replicas_agree() -> None:
    every = Every(5)
    assert every.after(datetime(2026, 1, 1, 0, 0, 1, 400_000, tzinfo=UTC)) == datetime(
        2026, 1, 1, 0, 0, 5, tzinfo=UTC
    )
    anchored = Every(60, datetime(2026, 1, 1, 0, 0, 7, tzinfo=UTC))
    assert anchored.after(datetime(2026, 1, 1, 0, 5, tzinfo=UTC)) == datetime(
        2026, 1, 1, 0, 5, 7, tzinfo=UTC
    )


def test_fires_between_bounds_what_it_lists_and_says_where_to_go_on() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    found, after = fires_between(Every(1), start, start + timedelta(seconds=10), 3)
    assert found == [start + timedelta(seconds=s) for s in (1, 2, 3)]
    assert after == start + timedelta(seconds=4)


def test_a_stored_spec_reads_back_as_the_same_fire_times() -> None:
    for times in (Cron("0 2 * * 1", "Europe/Berlin"), Every(90.5)):
        assert fire_times_of(times.stored()) == times
    assert Cron("0 2 * * *", "Europe/Berlin").describe() == "cron 0 2 * * * (Europe/Berlin)"
    assert Every(300).describe() == "every 5m"


# -- refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (lambda: Cron("* * *"), "five fields"),
        (lambda: Cron("0 2 * * 8"), "weekday '8'"),
        (lambda: Cron("0 2 * * mon-"), "weekday 'mon-'"),
        (lambda: Cron("61 * * * *"), "61"),
        (lambda: Cron("0 2 * * *", "Mars/Olympus"), "unknown timezone"),
        (lambda: Every(0.5), "between 1s"),
        (lambda: Every(10, datetime(2026, 1, 1)), "aware"),
    ],
)
def test_a_bad_spec_is_refused_with_one_line(spec: object, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as raised:
        spec()  # type: ignore[operator]
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "stored",
    [
        None,
        5,
        {},
        {"cron": 5},
        {"cron": "0 2 * * *", "every": 5},
        {"every": True},
        {"every": "5"},
        {"every": 5, "anchor": "yesterday"},
        {"cron": "x"},
    ],
)
def test_a_stored_spec_that_is_garbage_is_a_config_error(stored: object) -> None:
    with pytest.raises(ConfigError):
        fire_times_of(stored)
