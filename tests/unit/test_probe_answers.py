"""The idle probe's rows as the scheduler reads them (``orchestrator/mongo/probe_answers.py``):
the handlers with work now, the earliest due time of the others, the pauses and the live
replicas; a probe read in parts is one answer; a row that is none of those is skipped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.core.in_house import InHouse
from orchestrator.core.queries import claims
from orchestrator.core.scheduler import Found
from orchestrator.mongo.probe_answers import found, merged

pytestmark = pytest.mark.pure

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_probe_s_rows_are_the_ready_handlers_the_earliest_due_time_and_the_live_count() -> None:
    rows: list[dict[str, Any]] = [
        {claims.PROBE_HANDLER: 2},
        {claims.PROBE_DUE: T0 + timedelta(seconds=5)},
        {claims.PROBE_DUE: T0 + timedelta(seconds=3)},
        {claims.PROBE_LIVE: 3},
        {claims.PROBE_HANDLER: True},  # not a handler's number: skipped
        {"other": 1},
    ]
    assert found(rows) == Found(frozenset({2}), T0 + timedelta(seconds=3), None, 3)


def test_the_pauses_are_read_only_when_the_probe_asked_for_them() -> None:
    assert found([]).pauses is None
    assert found([], with_pauses=True).pauses == []


def test_while_migrating_an_in_house_lease_comes_due_when_its_locked_at_runs_out() -> None:
    in_house = InHouse(60)
    rows = [{claims.PROBE_HELD_AT: T0}]
    assert found(rows, in_house=in_house).next_due == in_house.expiry(T0)
    assert found(rows).next_due is None


def test_a_probe_read_in_parts_numbers_each_part_s_handlers_after_the_parts_before() -> None:
    first = Found(frozenset({0, 1}), T0 + timedelta(seconds=9), [], 2)
    second = Found(frozenset({0}), T0 + timedelta(seconds=4), None, None)
    assert merged([first, second], [3, 2]) == Found(
        frozenset({0, 1, 3}), T0 + timedelta(seconds=4), [], 2
    )
