"""The demo judges only what it made: its database may hold the application's own
collections (the default database is shared with the API server and ``orchestrator run``),
and their documents, however odd, neither fail its audit nor are touched by it."""

from __future__ import annotations

import copy
import io
from datetime import UTC, datetime
from typing import Any

import pytest
from bson import ObjectId
from rich.console import Console

import orchestrator.testing
from orchestrator.demo import run as demo
from orchestrator.demo.run import WATCHED, DemoOptions
from orchestrator.demo.workflows import build
from orchestrator.testing import async_memory_database, async_view, memory_database

FOREIGN: list[dict[str, Any]] = [
    # What the demo's audit would count against itself if it read this collection: a
    # failed document, a lease held far into the future, one long overdue.
    {
        "_id": "invoice-1",
        "phase": "Failed",
        "lastError": {"type": "Boom", "message": "no", "phase": "Charging"},
    },
    {
        "_id": "invoice-2",
        "phase": "Charging",
        "lockToken": "someone-else",
        "lockedBy": "billing-7",
        "lockedUntil": datetime(2999, 1, 1, tzinfo=UTC),
    },
    {
        "_id": "invoice-3",
        "phase": "Charging",
        "lockToken": "x",
        "lockedUntil": datetime(2001, 1, 1, tzinfo=UTC),
    },
    # And what no workflow writes: a phase of another type, an error that is no
    # document, an expiry that is no date, no phase at all, nesting.
    {"_id": ObjectId(), "phase": 42, "lastError": "not a document"},
    {"_id": 7, "phase": None, "lockedUntil": "tomorrow", "lockToken": 3},
    {"_id": "bare"},
    {"_id": "deep", "phase": ["Failed"], "nested": {"phase": "Failed", "a": [{"b": None}]}},
]


def test_what_the_demo_watches_is_what_its_workflow_handles() -> None:
    """``WATCHED``, the collections the display and the final audit read, are the
    workflow's own: every collection one of its handlers claims from, and no other."""
    workflow = build(async_memory_database())
    assert set(WATCHED) == {handler.collection for handler in workflow.orch.handlers}


def test_a_foreign_collection_neither_fails_the_demo_nor_is_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = memory_database()
    shared["invoices"].insert_many(copy.deepcopy(FOREIGN))
    before = list(shared["invoices"].find({}))
    monkeypatch.setattr(orchestrator.testing, "async_memory_database", lambda _: async_view(shared))
    console = Console(file=io.StringIO(), width=200)
    options = DemoOptions(gateways=6, replicas=2, cert_delay=0.2, seed=3, timeout=120)
    code = demo.run(options, console)
    out = console.file.getvalue()
    assert code == 0, out
    assert "all invariants hold" in out
    assert "invoices" not in out
    assert list(shared["invoices"].find({})) == before
