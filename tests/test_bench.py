"""The benchmark still runs end to end (at its tiny size) and writes what it promises.

Speed is never asserted here: only that every figure is produced, with sane structure.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.__main__ import main


def test_the_benchmark_writes_its_table_results_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    assert main(["--size", "tiny", "--out", str(out)]) == 0

    results = json.loads(out.with_suffix(".json").read_text())
    figures = results["figures"]
    assert set(figures) == {
        "throughput",
        "overhead",
        "latency",
        "batch",
        "idle",
        "pickup",
        "real_server",
    }
    assert results["meta"]["size"] == "tiny"
    assert {"date", "machine", "store", "command"} <= set(results["meta"])
    for run in figures["throughput"]:
        # Both sides ran every step of the workload, each with one claim and one release.
        assert run["orchestrator_steps"] == run["bare_steps"] == run["steps"]
        assert run["ratio"] > 0
    assert [r["handlers"] for r in figures["idle"]["rows"]] == [1, 10, 50, 10]
    for row in figures["idle"]["rows"]:
        # The classic pattern sends one claim per handler per tick, by construction.
        assert row["baseline"] == row["handlers"]
        assert row["orchestrator"] <= row["collections"]
    batch = figures["batch"]
    assert batch["orchestrator"]["ticks"] >= 1
    # 30 documents x 3 steps at 9 claims a tick (3 replicas x 3 jobs) take 10+ ticks.
    assert batch["baseline"]["ticks"] >= 10
    assert figures["latency"]["baseline_s"] >= 5 * figures["latency"]["tick_s"]
    assert "skipped" in figures["real_server"] or figures["real_server"]["rows"]

    table = out.read_text()
    assert "| figure | measured | ratio | goal | met |" in table
    assert results["meta"]["machine"]["python"] in table
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
