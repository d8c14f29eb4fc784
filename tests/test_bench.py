"""The benchmark still runs end to end (at its tiny size) and writes what it promises.

Speed is never asserted here: only that every figure is produced, with sane structure.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from bench import figures, instructions, relocks, report, schedules, server_time
from bench.__main__ import main
from orchestrator import Orchestrator, Settings
from orchestrator.core.queries import schedules as schedule_queries
from orchestrator.core.schedules import run_id
from orchestrator.testing import FakeClock, memory_database
from tests.conftest import MONGODB_URI


def test_the_benchmark_writes_its_table_results_and_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "benchmarks.md"
    assert main(["--size", "tiny", "--out", str(out)]) == 0

    results = json.loads(out.with_suffix(".json").read_text())
    figures = results["figures"]
    assert set(figures) == {
        "throughput",
        "overhead",
        "latency",
        "batch",
        "commands",
        "idle",
        "pickup",
        "intake",
        "io_bound",
        "real_server",
    }
    assert results["meta"]["size"] == "tiny"
    assert {"date", "machine", "store", "command"} <= set(results["meta"])
    # Figures 1 and 2 for both engines, each against its own bare loop.
    engines = ("threaded", "async")
    assert [(r["engine"], r["concurrency"]) for r in figures["throughput"]] == [
        (engine, c) for engine in engines for c in (1, 4)
    ]
    for run in figures["throughput"]:
        # Both sides ran every step of the workload: a claim for a document's first step,
        # then one write per step carrying the lease on, the last one releasing.
        assert run["orchestrator_steps"] == run["bare_steps"] == run["steps"]
        if run["concurrency"] == 1:  # and the same last claim; the tick's probe besides
            sent = run["orchestrator_ops_per_step"] * run["steps"]
            assert round(sent) == round(run["bare_ops_per_step"] * run["steps"]) + 1
        assert run["ratio"] > 0 and run["cpu_ratio"] > 0
        assert len(run["ratios"]) == run["repeats"] >= 1
    assert set(figures["overhead"]) == set(engines)
    for engine, overhead in figures["overhead"].items():
        assert overhead["engine"] == engine
        # The async database's calls are timed too: its steps spend time in the database.
        assert overhead["orchestrator_db_us"] > 0
    _check_idle_and_commands(results["figures"])
    batch = figures["batch"]
    assert batch["orchestrator"]["ticks"] >= 1
    # 30 documents x 3 steps at 9 claims a tick (3 replicas x 3 jobs) take 10+ ticks.
    assert batch["baseline"]["ticks"] >= 10
    assert figures["latency"]["baseline_s"] >= 5 * figures["latency"]["tick_s"]
    assert set(figures["intake"]) == set(engines)
    for engine, intake in figures["intake"].items():
        assert intake["engine"] == engine
        assert intake["max_ms"] >= intake["median_ms"] > 0
    io = figures["io_bound"]
    assert io["async_concurrency"] == 100
    assert io["threaded_concurrency"] == Settings.build().max_concurrency  # the engine's default
    # Every document waited 50 ms in its step: no side can beat its slots / 50 ms.
    for side in ("threaded", "async"):
        assert 0 < io[f"{side}_steps_per_s"] <= io[f"{side}_ceiling_steps_per_s"]
    assert "skipped" in figures["real_server"] or figures["real_server"]["rows"]

    table = out.read_text()
    assert "| figure | measured | ratio | goal | met |" in table
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    for figure in ("1. step throughput", "2. overhead", "8. intake"):
        for engine in engines:
            assert any(r.startswith(f"| {figure}") and f"{engine} engine" in r for r in lines)
    assert any(r.startswith("| 9. I/O-bound") for r in lines)
    assert results["meta"]["machine"]["python"] in table
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")

    # Without --out it prints the same table and writes nothing: the committed docs/ stay.
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "docs").mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr("bench.__main__.run", lambda size: results)
    assert main(["--size", "tiny"]) == 0
    assert table in capsys.readouterr().out
    assert list(elsewhere.rglob("*")) == [elsewhere / "docs"]


@pytest.fixture
def server() -> Iterator[MongoClient[Any]]:
    client: MongoClient[Any] = MongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
    try:
        yield client
    finally:
        client.close()


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set")
def test_figure_7_names_its_server_and_judges_the_plan_only_where_there_is_one(
    server: MongoClient[Any],
) -> None:
    """The claim index must serve the claim and its sort (IXSCAN, no SORT) on MongoDB; a
    server whose explain has no queryPlanner cannot show that, and is marked so."""
    info = server[f"orchestrator_probe_{uuid.uuid4().hex[:8]}"].command("buildInfo")
    real = figures.real_server(replace(figures.SIZES["tiny"], claim_sizes=(300,)))
    assert real["server"]["version"] == info["version"]
    assert real["server"]["gitVersion"] == info["gitVersion"]
    [row] = real["rows"]
    [rendered] = report.real_server_rows(real)
    assert real["server"]["name"] in rendered["figure"]
    if not row["query_planner"]:
        assert rendered["met"] == "n/a"
        assert "no queryPlanner" in rendered["measured"]
        pytest.skip(
            f"the server {real['server']['name']} answers explain without a queryPlanner "
            "(no MongoDB query planner): the claim's index use cannot be shown on it"
        )
    assert row["index_scan"] and not row["in_memory_sort"], row["stages"]
    assert rendered["met"] == "yes"


def _check_idle_and_commands(results: dict[str, Any]) -> None:
    shapes = [(r["handlers"], r["collections"], r["schedules"]) for r in results["idle"]["rows"]]
    assert shapes == list(figures.IDLE_SHAPES)
    for row in results["idle"]["rows"]:
        # The classic pattern sends one claim per handler per tick, by construction; a
        # started replica one read per tick, and its record every 10 s, whatever the
        # schedules it declares.
        assert row["baseline"] == row["handlers"]
        assert row["orchestrator_reads"] == 1
        assert row["orchestrator_writes_per_10s"] <= 1
    for row in results["commands"]["rows"]:
        docs, steps = row["documents"], row["documents"] * row["steps"]
        kinds = row["orchestrator_by_kind"]
        # A claim per document, then one write per step: the last one releases.
        assert kinds["update_one"] == docs
        sent = kinds["find_one_and_update"] + kinds["update_one"]
        assert docs + steps <= sent <= docs + steps + 10
        assert row["baseline"] >= 2
    for row in results["commands"]["submitted_here"]:
        docs, steps = row["documents"], row["documents"] * row["steps"]
        kinds = row["orchestrator_by_kind"]
        # Submitted with a worker free: no claim, one write per step (the last releases).
        assert (kinds["find_one_and_update"], kinds["update_one"]) == (steps - docs, docs)


def test_the_instruction_count_reads_callgrinds_total_and_its_target_runs() -> None:
    assert instructions.total("events: Ir\nsummary: 123456\n") == 123456
    assert instructions.total("events: Ir\ntotals: 42\n") == 42
    with pytest.raises(ValueError, match="no summary"):
        instructions.total("events: Ir\n")
    for side in instructions.SIDES:  # what runs under valgrind, run here without it
        assert instructions.target(side, 2, True) == 2 * instructions.STEPS_PER_DOC
        assert instructions.target(side, 2, False) == 0


@pytest.mark.parametrize("figure", ["relocks", "server-time", "schedules"])
def test_a_server_figure_needs_a_server_and_says_so_in_one_line(
    figure: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    assert main([figure]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set")
def test_the_relock_figure_counts_each_replica_s_commands_by_kind() -> None:
    result = asyncio.run(relocks.run(str(MONGODB_URI), documents=5, seconds=1.0, replicas=2))
    assert result["documents"] == 5 and len(result["replicas"]) == 2
    for row in result["replicas"]:
        assert row["all_per_second"] == pytest.approx(sum(row["per_second"].values()))
        assert row["probes_per_tick"] == row["per_second"].get("aggregate", 0.0) * relocks.TICK


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set")
def test_the_server_time_figure_times_every_command_of_a_workflow_by_kind() -> None:
    """Workflows submitted one at a time to a replica with a free worker: a submit, no
    claim, two carrying writes and a release each; every command is classified."""
    row = asyncio.run(server_time.measure(str(MONGODB_URI), workflows=3, finished=5))
    counts = {name: stats["count"] for name, stats in row["kinds"].items()}
    assert (counts["submit"], counts["claim"], counts["carry"], counts["release"]) == (3, 0, 6, 3)
    assert row["ms_per_step"] == pytest.approx(
        sum(stats["ms_per_step"] for stats in row["kinds"].values())
    )
    sizes = server_time.document_sizes()
    assert sizes["with_history"] > 20 * server_time.TRACEBACK > sizes["without_history"]


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set")
def test_the_server_time_figure_times_a_carry_beside_the_release_and_claim_it_replaced() -> None:
    # Each command raises if it matched nothing: a figure timing misses would mislead.
    rows = server_time.replaced(str(MONGODB_URI), finished=5, histories=(0, 3), rounds=2)
    assert [row["entries"] for row in rows] == [0, 3]
    for row in rows:
        assert min(row["carry_ms"], row["release_ms"], row["claim_ms"]) > 0
    assert server_time.replaced_markdown(rows).count("\n") == 4


def test_the_schedules_bench_accounts_for_every_fire_time_and_finds_a_lost_or_doubled_one() -> None:
    """Replicas in one process on a fake clock, as the bench's processes run: every fire
    time of the window is started, skipped or paused; then a run document lost and one
    doubled by hand are found."""
    clock = FakeClock()
    db = memory_database(clock=clock)
    fleet = []
    for n in range(3):
        orch = Orchestrator(
            db,
            clock=clock,
            replica_id=f"replica-{n}",
            listeners=[schedules.Recorder(db[schedules.FIRES])],
        )
        schedules.declare(orch, work=0)
        fleet.append(orch)
    fleet[0].ensure_indexes()
    collection = fleet[0].settings.schedules_collection
    db[collection].update_one({"_id": schedules.PAUSED}, schedule_queries.pause_update(True))
    start = clock.now()
    for second in range(40):
        clock.advance(1)
        for orch in fleet[second % 3 :] + fleet[: second % 3]:
            orch.run_once(heartbeat=False)

    rows = {row["schedule"]: row for row in schedules.account(db, start, clock.now(), collection)}
    assert set(rows) == {d.name for d in schedules.SCHEDULES} | {"all"}
    every = rows["all"]
    assert every["due"] == 40 + 20 + 8 + 2 + 13
    assert every["due"] == sum(
        every[k] for k in ("started", "skipped", "missed", "other", "paused")
    )
    assert (every["absent"], every["duplicates"], every["wrong_ids"]) == (0, 0, 0)
    assert rows[schedules.PAUSED]["paused"] == rows[schedules.PAUSED]["due"] == 13
    assert every["lag_p99_ms"] is not None

    one = db[schedules.RUNS].find_one({"scheduled.name": "every-5s"})
    assert one is not None
    db[schedules.RUNS].delete_one({"_id": one["_id"]})
    other = db[schedules.RUNS].find_one({"scheduled.name": "every-2s"})
    assert other is not None and other["_id"] == run_id("every-2s", other["scheduled"]["fire"])
    db[schedules.RUNS].insert_one({**other, "_id": "a-second-document"})
    rows = {row["schedule"]: row for row in schedules.account(db, start, clock.now(), collection)}
    assert rows["every-5s"]["absent"] == 1
    assert (rows["every-2s"]["duplicates"], rows["every-2s"]["wrong_ids"]) == (1, 1)
    table = schedules.markdown(
        {
            "options": schedules.Options().__dict__,
            "window": {"start": start.isoformat()},
            "killed": {"replica": "replica-2"},
            "rows": list(rows.values()),
            "stop_problems": [],
        }
    )
    assert table.count("\n| ") == len(rows) + 1


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set")
def test_the_schedules_bench_runs_a_fleet_of_processes_killing_and_restarting_one() -> None:
    options = schedules.Options(
        seconds=4, replicas=2, kill_at=1, down=1, tick=0.5, lock_timeout=3, work=0.1
    )
    result = schedules.run(str(MONGODB_URI), options)
    assert result["stop_problems"] == []
    every = result["rows"][-1]
    assert every["due"] > 0
    assert (every["absent"], every["duplicates"], every["wrong_ids"]) == (0, 0, 0)
    [paused] = [row for row in result["rows"] if row["schedule"] == schedules.PAUSED]
    assert paused["paused"] == paused["due"]
