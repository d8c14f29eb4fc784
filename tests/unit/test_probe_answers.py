"""The idle probe's rows as the scheduler reads them (``orchestrator/mongo/probe_answers.py``):
the handlers with work now, each collection's due times with their documents' phases, the
pauses and the live replicas; a probe read in parts is one answer; a row that is none of
those is skipped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.core.in_house import InHouse
from orchestrator.core.queries import claims
from orchestrator.core.scheduler import Due, Found
from orchestrator.mongo.probe_answers import found, merged

pytestmark = pytest.mark.pure

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _due(at: datetime, collection: str = "jobs", phase: Any = "A") -> dict[str, Any]:
    return {
        claims.PROBE_DUE: at,
        claims.PROBE_COLLECTION: collection,
        claims.PROBE_PHASE: phase,
    }


def test_a_probe_s_rows_are_the_ready_handlers_the_due_times_and_the_live_count() -> None:
    rows: list[dict[str, Any]] = [
        {claims.PROBE_HANDLER: 2},
        _due(T0 + timedelta(seconds=5), "jobs", "A"),
        _due(T0 + timedelta(seconds=3), "other", {"not": "a phase"}),
        {claims.PROBE_LIVE: 3},
        {claims.PROBE_HANDLER: True},  # not a handler's number: skipped
        {claims.PROBE_DUE: T0},  # names no collection: nothing to wake
        {"other": 1},
    ]
    answer = found(rows)
    assert answer == Found(
        frozenset({2}),
        (Due("jobs", T0 + timedelta(seconds=5), "A"), Due("other", T0 + timedelta(seconds=3))),
        None,
        3,
    )
    assert answer.next_due == T0 + timedelta(seconds=3)
    assert [d.collection for d in answer.earliest()] == ["other", "jobs"]


def test_the_pauses_are_read_only_when_the_probe_asked_for_them() -> None:
    assert found([]).pauses is None
    assert found([], with_pauses=True).pauses == []


def test_while_migrating_an_in_house_lease_comes_due_when_its_locked_at_runs_out() -> None:
    in_house = InHouse(60)
    rows = [{claims.PROBE_HELD_AT: T0, claims.PROBE_COLLECTION: "jobs"}]
    assert found(rows, in_house=in_house).next_due == in_house.expiry(T0)
    assert found(rows).next_due is None


def test_a_probe_read_in_parts_numbers_each_part_s_handlers_after_the_parts_before() -> None:
    late, soon = Due("jobs", T0 + timedelta(seconds=9)), Due("jobs", T0 + timedelta(seconds=4))
    first = Found(frozenset({0, 1}), (late,), [], 2)
    second = Found(frozenset({0}), (soon,), None, None)
    both = merged([first, second], [3, 2])
    assert both == Found(frozenset({0, 1, 3}), (late, soon), [], 2)
    assert both.earliest() == [soon]
