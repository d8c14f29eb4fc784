"""The contention benchmark (``python -m bench contention``) runs end to end and its counts
add up; its calibration gives the fleet model exactly the parameters it loads.

On the in-memory store through the runner's seam (it takes any async database), each client
bounded by a number of claims, not by time; against MONGODB_URI through the command line.
No figure is asserted: they are the server's and the machine's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from bench import contention, figures, report
from bench.__main__ import main
from orchestrator.testing import FakeClock, async_memory_database
from tests.conftest import MONGODB_URI, NO_SERVER

PARAMS = {
    "rtt_ms",
    "service_ms",
    "conflict_window_ms",
    "majority_commit_ms",
    "write_tickets",
}
SERVICE = {"read", "aggregate", "claim_sorted", "claim_targeted", "update"}


def check_counts(results: Mapping[str, Any], clients: list[int]) -> None:
    """Every claim that took a document was released by its own lease: a lease held twice
    would have made one of the two fenced releases miss (a lost release)."""
    assert [row["clients"] for row in results["rows"]] == clients
    for row in results["rows"]:
        assert row["claims"] + row["empty_claims"] == row["claim_commands"]
        assert row["releases"] == row["claims"] > 0
        assert row["lost_releases"] == 0
        assert row["left_held"] == 0
        latency = row["latency_ms"]
        assert latency["claim"]["count"] == row["claim_commands"]
        assert latency["release"]["count"] == row["claims"]
        for stats in latency.values():
            assert 0 <= stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]
        assert set(row["conflicts"]) == set(contention.CONFLICT_METRICS)
    assert set(results["probes"]) == set(contention.PROBES)
    for kind, stats in results["probes"].items():
        assert stats["count"] == results["meta"]["samples"] * (2 if "update" in kind else 1)


def check_params(params: Mapping[str, Any]) -> None:
    assert set(params) == PARAMS
    assert set(params["service_ms"]) == SERVICE
    values = [params[k] for k in PARAMS - {"service_ms"}] + list(params["service_ms"].values())
    assert all(isinstance(v, int | float) and v >= 0 for v in values)
    assert isinstance(params["write_tickets"], int)


def test_the_runner_on_the_memory_store_claims_and_releases_every_lease_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock()
    db = async_memory_database(clock=clock)
    clients = [1, 3]
    results = asyncio.run(
        contention.run(
            db, clients=clients, seconds=3600, documents=2, samples=2, cycles=4, clock=clock
        )
    )
    check_counts(results, clients)
    for row in results["rows"]:
        assert row["claim_commands"] == row["clients"] * 4
        # The in-memory store answers no serverStatus: its counters are not reported.
        assert set(row["conflicts"].values()) == {None}
    assert results["meta"]["server"]["mongodb"] is False  # it refuses buildInfo
    # The benchmark's collection is dropped at the end.
    assert asyncio.run(db.list_collection_names()) == []

    table = contention.markdown(results)
    assert "| clients | claims/s | claim latency | release latency |" in table
    rows = [line for line in table.splitlines() if line.startswith(("| 1 |", "| 3 |"))]
    assert len(rows) == 2 and all("not reported" in line for line in rows)
    assert "**Not MongoDB**" in table

    # --calibrate turns the results into the model's parameters, each source on stderr.
    path = tmp_path / "run.json"
    report.write_json(results, path)
    capsys.readouterr()
    assert main(["contention", "--calibrate", str(path)]) == 0
    out, err = capsys.readouterr()
    params = json.loads(out)
    check_params(params)
    assert params["write_tickets"] == contention.DEFAULT_WRITE_TICKETS
    assert "write_tickets: MongoDB's default (128): not reported" in err
    assert "conflict_window_ms: not measured (the server reports no conflicts)" in err
    assert params["conflict_window_ms"] == params["service_ms"]["claim_sorted"]


def test_calibration_takes_the_conflict_window_and_tickets_from_what_the_server_reports() -> None:
    """Conflicts per claim / claims per second, over the rows where that estimate is linear
    (at most 0.5 conflicts per claim); the tickets the server reports."""

    def stats(p50: float) -> dict[str, Any]:
        return {"count": 10, "p50": p50, "p90": p50, "p99": p50, "max": p50}

    def row(clients: int, conflicts: int | None, per_s: float) -> dict[str, Any]:
        counts = {"writeConflicts": conflicts, "wiredTiger update conflicts": None}
        return {
            "clients": clients,
            "claim_commands": 1000,
            "claims_per_s": per_s,
            "conflicts": counts,
        }

    probes = {kind: stats(2.0) for kind in contention.PROBES}
    probes.update(ping=stats(0.5), claim_sorted=stats(3.0), claim_sorted_w1=stats(2.5))
    results = {
        "meta": {"write_tickets": 64, "server": {"mongodb": True}},
        "probes": probes,
        "rows": [
            row(1, 0, 400.0),
            row(2, 100, 1000.0),  # 0.1 per claim at 1000/s: 0.1 ms
            row(4, 300, 1000.0),  # 0.3 per claim: 0.3 ms
            row(8, 900, 1000.0),  # 0.9 per claim: past the linear regime, left out
        ],
    }
    params, source = contention.calibrate(results)
    check_params(params)
    assert params["rtt_ms"] == 0.5
    assert params["service_ms"]["claim_sorted"] == 2.0  # the w: 1 claim, less the rtt
    assert params["service_ms"]["read"] == 1.5
    # Majority less w: 1: 0.5 for sorted claims, 0 for the others; the median is 0.
    assert params["majority_commit_ms"] == 0.0
    assert params["conflict_window_ms"] == pytest.approx(0.2)
    assert "K = 2, 4" in source["conflict_window_ms"]
    assert params["write_tickets"] == 64
    assert "reported by the server" in source["write_tickets"]


def test_the_command_refuses_without_a_server_or_with_a_file_that_is_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    assert main(["contention", "--clients", "1,2", "--seconds", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("MONGODB_URI is not set")

    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"figures": {}}))
    assert main(["contention", "--calibrate", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "not a contention benchmark's --out results" in err


@pytest.mark.mongodb
@pytest.mark.skipif(not MONGODB_URI, reason=NO_SERVER)
def test_the_command_on_the_server_names_it_and_its_counts_add_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    argv = ["--clients", "1,2", "--seconds", "0.5", "--documents", "20", "--samples", "5"]
    assert main(["contention", *argv, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    results = json.loads(out.read_text())
    check_counts(results, [1, 2])

    client: MongoClient[Any] = MongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
    try:
        name = figures.server_identity(client.get_default_database("orchestrator"))["name"]
    finally:
        client.close()
    server = results["meta"]["server"]
    assert server["name"] == name
    assert f"Server: {name}" in table
    if not server["mongodb"]:
        assert "**Not MongoDB**" in table and "one request at a time" in table

    assert main(["contention", "--calibrate", str(out)]) == 0
    check_params(json.loads(capsys.readouterr().out))
