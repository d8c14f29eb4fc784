"""The fleet model (``python -m bench scale``): its server's rules, its determinism, and
its reproduction of what was measured at 3 replicas (at the tiny size, from the committed
calibration and benchmark figures, so nothing here is timed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench import scale
from bench.__main__ import main
from bench.fleet import BEFORE, NOW, Fleet, Strategy, Workload, chain, simulate
from bench.model import MONGODB, Params, backoff_s
from orchestrator.core.registry import Handler


def test_the_parameters_load_from_the_agreed_keys_and_refuse_others() -> None:
    agreed = {
        "rtt_ms": 0.4,
        "service_ms": {
            "read": 0.1,
            "aggregate": 0.3,
            "claim_sorted": 0.2,
            "claim_targeted": 0.1,
            "update": 0.1,
        },
        "conflict_window_ms": 0.2,
        "majority_commit_ms": 1.5,
        "write_tickets": 128,
    }
    params = Params.from_json(agreed)
    assert params.write_tickets == 128 and params.cores == MONGODB.cores
    assert Params.from_json(params.to_json()) == params
    with pytest.raises(ValueError, match="rtt_ms"):
        Params.from_json({**agreed, "rtt": 1})
    with pytest.raises(ValueError, match="missing aggregate, claim_sorted"):
        Params.from_json({**agreed, "service_ms": {"read": 0.1}})
    assert Params.load(scale.MEMORY_PARAMS).cores == 1


def test_write_conflicts_back_off_as_mongo_does() -> None:
    # log_and_backoff.cpp: none for 4 attempts, then 1, 5, 10 and 100 ms.
    assert [backoff_s(n) for n in (0, 3, 4, 9, 10, 99, 100, 199, 200, 10_000)] == [
        0.0, 0.0, 0.001, 0.001, 0.005, 0.005, 0.010, 0.010, 0.100, 0.100,
    ]  # fmt: skip


def test_the_model_reproduces_the_measured_three_replica_figures() -> None:
    memory = Params.load(scale.MEMORY_PARAMS)
    rows = scale.reproduce(memory, scale.SIZES["tiny"])
    assert {r["code"] for r in rows} == {"before", "now"}
    for code in ("before", "now"):  # figure 4 (seconds, commands) and figure 5 by both codes
        figures = [r["figure"][:2] for r in rows if r["code"] == code]
        assert figures.count("4.") == 2 and figures.count("5.") >= 4
    assert sum("wire-protocol" in r["figure"] for r in rows) == 3
    for row in rows:
        tolerance = scale.TOLERANCE[scale.row_kind(row)]
        assert abs(row["error"]) <= tolerance, row
        if row["figure"].startswith("5."):  # the real scheduler's probes: exactly
            assert row["model"] == pytest.approx(row["measured"])


def test_an_idle_tick_is_one_probe_where_the_code_before_sent_a_command_per_collection() -> None:
    ten_on_five = Workload(
        "idle", tuple(chain(f"idle{n % 5}", [f"P{n}"], 0.0)[0] for n in range(10)), seconds=4.0
    )
    before = simulate(MONGODB, ten_on_five, BEFORE, 1, housekeeping=False, run_once=True)
    now = simulate(MONGODB, ten_on_five, replace(NOW, jitter=False), 1, housekeeping=False)
    assert before.commands == {"probe": 20}  # a find per collection per tick
    assert now.commands == {"probe": 4}  # one aggregate per tick
    single = simulate(MONGODB, scale.idle(3, 4.0), BEFORE, 1, housekeeping=False)
    assert single.commands == {"claim": 12}  # single handlers: an empty claim each


def test_replicas_run_the_real_scheduler_and_the_same_seed_gives_the_same_run() -> None:
    work = Workload("drain", chain("batch", scale.THREE, 0.01), backlog=200, steps_per_doc=3)
    first = simulate(MONGODB, work, BEFORE, 10, seed=3)
    again = simulate(MONGODB, work, BEFORE, 10, seed=3)
    assert first.summary() == again.summary()
    assert first.steps == 600 and first.tally.docs_done == 200


def test_sorted_claims_meet_conflicts_that_peek_and_continue_avoid() -> None:
    work = Workload("drain", chain("batch", scale.THREE, 0.01), backlog=800, steps_per_doc=3)
    sorted_ = simulate(MONGODB, work, BEFORE, 50, seed=1)
    peek = simulate(MONGODB, work, Strategy("peek"), 50, seed=1)
    assert sorted_.retries > sorted_.steps  # the whole fleet aims at the head
    assert peek.wasted_per_step < 1 < sorted_.wasted_per_step
    assert peek.tally.carried > 0


def test_a_fleet_registers_real_handlers() -> None:
    fleet = Fleet(MONGODB, scale.idle(2, 1.0), BEFORE, 1)
    handlers = fleet.replicas[0].handlers
    assert all(isinstance(h, Handler) and h.key for h in handlers)
    assert [h.collection for h in handlers] == ["idle0", "idle1"]


def test_the_command_writes_its_report_table_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "scale.md"
    assert main(["scale", "--size", "tiny", "--out", str(out)]) == 0
    text = out.read_text()
    assert "## First: the model reproduces what was measured" in text
    assert "## What the model says to choose" in text
    results = json.loads(out.with_suffix(".json").read_text())
    assert {r["replicas"] for r in results["runs"]} == set(scale.SIZES["tiny"].replicas)
    assert out.with_suffix(".png").stat().st_size > 0
