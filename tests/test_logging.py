"""Log records carry the replica, collection, document, phase and outcome as fields."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from orchestrator import Lease
from tests.conftest import MakeReplica


def test_step_records_carry_structured_fields(
    make: MakeReplica, caplog: pytest.LogCaptureFixture
) -> None:
    orch = make("pod-7", max_attempts=1)

    @orch.phase("jobs", "Running")
    def broken(lease: Lease[Any]) -> Any:
        raise ValueError("bad input from upstream")

    doc = orch.submit("jobs", {"phase": "Running"})
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        orch.run_once()
    failed = [r for r in caplog.records if getattr(r, "outcome", None) == "failed"]
    assert len(failed) == 1
    record: Any = failed[0]
    assert record.levelno == logging.ERROR
    assert record.replica == "pod-7"
    assert record.collection == "jobs"
    assert record.doc_id == str(doc["_id"])
    assert record.phase == "Running"
    assert record.handler.endswith("broken")
    assert "bad input from upstream" in record.getMessage()
    # Plain strings, as a JSON formatter serialises them: no enum member leaks into a field.
    assert all(type(getattr(r, "outcome", "")) is str for r in caplog.records)
