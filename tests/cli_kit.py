"""What the command line's tests share: running a command as a person types it, the
one-line error every refusal is, and a replica's record made live without starting it."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import AsyncOrchestrator, Orchestrator
from orchestrator.cli import main as cli
from orchestrator.core.names import REPLICAS_COLLECTION
from orchestrator.core.queries.replica_records import replica_document
from orchestrator.core.replicas import HandlerInfo, ReplicaIdentity, ReplicaSettings, new_record

URI = "mongodb://ops:hunter2@db.internal:27017/platform"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0]


def publish(
    db: Database[Any], orch: Orchestrator | AsyncOrchestrator, paused: tuple[str, ...] = ()
) -> None:
    """``orch``'s record as ``start()`` writes it (its handlers, which operators' actions
    check their phases against), live from its clock's now, without starting it: the
    tests drive it with ``run_once``. ``paused``: the pauses it says it honours."""
    now = orch.clock.now()
    settings = orch.settings
    engine = "threaded" if isinstance(orch, Orchestrator) else "async"
    record = new_record(
        ReplicaIdentity(orch.replica_id, "test", "test-host", 1, "test", engine, now),
        ReplicaSettings(
            lock_timeout=settings.lock_timeout,
            tick=settings.tick,
            max_concurrency=settings.max_concurrency,
            cancelled_phase=settings.cancelled_phase,
            history=settings.history,
            legacy_lock_timeout=settings.legacy_lock_timeout,
            retention=ReplicaSettings.retained(orch.retention),
        ),
        now=now,
        handlers=[
            HandlerInfo(h.collection, h.phase, h.name, h.key, h.failed_phase) for h in orch.handlers
        ],
        paused=paused,
    )
    db[REPLICAS_COLLECTION].replace_one(
        {"_id": orch.replica_id}, replica_document(record), upsert=True
    )
