"""The schedules example runs and does what it says."""

from __future__ import annotations

import pytest

from examples import schedules


def test_the_schedules_example_makes_one_report_and_a_cleanup_per_fire_across_replicas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert schedules.main() == 0
    out = capsys.readouterr().out
    assert "nightly-report@2026-01-15T01:00:00Z: 24 orders" in out
    assert "session-cleanup: 10 runs" in out
    assert "sessions deleted: 30, left: 0" in out
