"""The chaos suite at a size CI affords: seeded, so every run injects the same faults."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from orchestrator.core.queries import lease_writes
from orchestrator.demo.chaos import Chaos, ChaosConfig, Figures, main
from orchestrator.demo.chaos.step_faults import HANDLER_EXCEPTIONS

CI = ChaosConfig(replicas=3, resources=40, duration=400, rate=0.05, seed=1)


@pytest.fixture(scope="module")
def figures() -> Figures:
    return Chaos(CI).run()


def test_every_invariant_holds_under_every_kind_of_fault(figures: Figures) -> None:
    assert figures.violations == []
    assert figures.resources_lost == 0
    assert figures.ready + figures.failed_expected + figures.failed_by_faults == 40 + 10
    assert figures.stale_writes_attempted > 0
    assert figures.stale_writes_landed == 0
    assert figures.steps_run_twice > 0
    assert figures.steps_run_twice == figures.steps_run_twice_interrupted
    assert figures.loops_alive == figures.loops_expected == 3
    assert figures.unhandled_exceptions == 0
    assert figures.credentials_leaked == 0
    assert figures.restarts > 0  # crashed replicas were replaced
    kinds = set(figures.faults)
    for kind in (
        "crash-mid-step",
        "stale worker (stall past the lease)",
        "step that never returns",
        "exception, then recording it failed",
        "handler returned a non-outcome",
        "outage (all replicas)",
        "partition (one replica)",
        "network: lost_reply",
        "network: slow",
        "network: AutoReconnect",
        "network: NotPrimaryError",
        "network: NetworkTimeout",
        "clock skew (replicas)",
        *(f"handler raised {name}" for name in list(HANDLER_EXCEPTIONS)[:4]),
    ):
        assert kind in kinds, kind
    assert any(k.startswith("crash-mid-advance") for k in kinds)
    assert any(k.startswith("crash-mid-unlock") for k in kinds)
    assert figures.bad_inputs == 13


def test_the_same_seed_injects_the_same_faults(figures: Figures) -> None:
    again = Chaos(CI).run()
    first, second = asdict(figures), asdict(again)
    for timing in ("wall_seconds",):
        first.pop(timing), second.pop(timing)
    assert first == second


def test_the_suite_fails_when_fencing_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariants can fail: writes that ignore the lease token land from stale holders."""
    monkeypatch.setattr(lease_writes, "fenced", lambda doc_id, token, *_, **__: {"_id": doc_id})
    broken = Chaos(CI).run()
    assert not broken.ok
    assert broken.stale_writes_landed > 0


def test_the_command_prints_figures_and_exits_by_the_invariants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--replicas", "2", "--resources", "8", "--duration", "60", "--seed", "3", "--json"]
    assert main(args) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["resources"] == 8 and out["resources_lost"] == 0
    assert main(["--replicas", "2", "--resources", "8", "--duration", "60"]) == 0
    table = capsys.readouterr().out
    for row in ("resources lost", "stale writes attempted / landed", "loops alive"):
        assert row in table
    with pytest.raises(SystemExit):
        main(["--replicas", "1"])
