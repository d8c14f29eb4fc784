"""Start later (``submit(..., not_before=...)``) and priorities (``priority=N``).

A later start is a wait like a relock's (the new document's ``lockedUntil``), so every
reader already honours it: the claim, the probe (whose due time wakes a replica then),
the status counts, ``find``, the page. Among a handler's due documents the highest
priority is claimed first, then the longest free, whatever the claim strategy, and a
document without the field (written before priorities, or by other code) ranks as 0.
Both engines; time comes from the fake clock.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import ConfigError, Lease, Orchestrator
from orchestrator.cli import connecting
from orchestrator.core import starts
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.queries import submissions
from orchestrator.core.settings import HORIZON
from orchestrator.mongo import Store
from orchestrator.operations import Operations
from orchestrator.operations.filters import Filter, LeaseState
from orchestrator.testing import FakeClock
from tests.cli_kit import URI, publish, run
from tests.conftest import MakeEither
from tests.operator_page import mounted, read

pytestmark = pytest.mark.anyio


def register_order(orch: Any) -> list[str]:
    """A step for phase Queued that notes each document's name as it runs, then ends it."""
    ran: list[str] = []

    @orch.phase("jobs", "Queued")
    async def work(lease: Any) -> Any:
        ran.append(lease.doc["name"])
        return await lease.advance("Done")

    return ran


async def test_a_later_start_is_claimed_only_once_its_time_comes(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    orch = await replicas(max_concurrency=1)
    ran = register_order(orch)
    later = await orch.submit("jobs", {"name": "later", "phase": "Queued"}, not_before=30)
    # The server's time, as the replicas estimate it: a datetime is a moment on that clock.
    dated = orch.clock.now() + timedelta(minutes=2)
    await orch.submit("jobs", {"name": "dated", "phase": "Queued"}, not_before=dated)
    await orch.submit("jobs", {"name": "now", "phase": "Queued"}, not_before=0)
    assert as_utc(later["lockedUntil"]) == as_utc(later["createdAt"]) + timedelta(seconds=30)
    await orch.run_once()
    assert ran == ["now"]
    clock.advance(29.9)
    await orch.run_once()
    assert ran == ["now"]
    clock.advance(0.1)
    await orch.run_once()
    assert ran == ["now", "later"]
    clock.advance(89.9)
    await orch.run_once()
    assert ran == ["now", "later"]
    clock.advance(0.1)
    await orch.run_once()
    assert ran == ["now", "later", "dated"]
    stored = db.jobs.find_one({"name": "dated"})
    assert stored is not None and stored["phase"] == "Done"


async def test_the_probe_announces_a_later_start_as_its_due_time_whatever_its_priority(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """The probe's due branch names every stored priority (so the index serves it): a
    later start with a priority comes due as one without."""
    orch = await replicas()
    register_order(orch)
    await orch.submit("jobs", {"name": "a", "phase": "Queued"}, not_before=20)
    first = await orch.submit("jobs", {"name": "b", "phase": "Queued"}, not_before=10, priority=9)
    found = Store(db).probe([("jobs", [({"phase": "Queued"}, None)])], orch.clock.now(), HORIZON)
    assert found.ready == frozenset()
    assert found.next_due is not None
    assert as_utc(found.next_due) == as_utc(first["lockedUntil"])


async def test_bad_starts_and_priorities_are_refused_in_one_line_and_store_nothing(
    replicas: MakeEither, db: Database[Any]
) -> None:
    orch = await replicas(max_wait=600)
    doc = {"phase": "Queued"}
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"not_before": 601}, r"601s ahead, past max_wait \(600s\)"),
        ({"not_before": orch.clock.now() + timedelta(hours=1)}, "past max_wait"),
        ({"not_before": datetime(2030, 1, 1)}, "naive datetime"),
        ({"not_before": math.nan}, "finite number of seconds >= 0"),
        ({"not_before": math.inf}, "finite number of seconds >= 0"),
        ({"not_before": -1}, "finite number of seconds >= 0"),
        ({"not_before": True}, "aware datetime or seconds from now"),
        ({"not_before": "tomorrow"}, "aware datetime or seconds from now"),
        ({"priority": -1}, "priority is an int from 0"),
        ({"priority": 10}, "priority is an int from 0"),
        ({"priority": True}, "priority is an int from 0"),
        ({"priority": 2.0}, "priority is an int from 0"),
    ]
    for options, reason in refusals:
        with pytest.raises(ConfigError, match=reason) as refused:
            await orch.submit("jobs", doc, **options)
        assert "\n" not in str(refused.value), options
    with pytest.raises(ConfigError, match=r"'lockedUntil' is managed.*not_before="):
        await orch.submit("jobs", {"phase": "Queued", "lockedUntil": orch.clock.now()})
    with pytest.raises(ConfigError, match=r"'claimPriority' is managed.*priority="):
        await orch.submit("jobs", {"phase": "Queued", "claimPriority": 5})
    assert db.jobs.count_documents({}) == 0


@pytest.mark.parametrize("strategy", ["sorted", "peek"])
async def test_higher_priority_is_claimed_first_then_the_longest_free(
    replicas: MakeEither, db: Database[Any], clock: FakeClock, strategy: str
) -> None:
    """One worker, so steps run in claim order. A document written without a priority
    (here as the in-house pattern writes one: no lease field but ``lockedAt``) ranks as
    0, never after lower-priority work. Peeking, a replica goes round each priority's
    documents from its own place, so only the priorities' order is fixed there."""
    orch = await replicas(max_concurrency=1, claim_strategy=strategy)
    ran = register_order(orch)
    for name, priority in (("low-1", 0), ("high-1", 5), ("mid", 2), ("high-2", 5), ("top", 9)):
        await orch.submit("jobs", {"name": name, "phase": "Queued"}, priority=priority)
        clock.advance(1)  # each free a second longer than the next
    db.jobs.insert_one({"name": "legacy", "phase": "Queued", "lockedAt": datetime(1970, 1, 1)})
    await orch.submit("jobs", {"name": "low-2", "phase": "Queued", "n": 1}, unique="name")
    # A second submit of one key changes nothing, its priority neither.
    await orch.submit("jobs", {"name": "low-2", "phase": "Queued"}, unique="name", priority=9)
    await orch.run_once()
    rank = {"top": 9, "high-1": 5, "high-2": 5, "mid": 2, "low-1": 0, "legacy": 0, "low-2": 0}
    assert sorted(ran) == sorted(rank)
    assert [rank[name] for name in ran] == sorted(rank.values(), reverse=True)
    if strategy == "sorted":
        # Within priority 0: no lockedUntil (null) sorts before the epoch, then updatedAt.
        assert ran == ["top", "high-1", "high-2", "mid", "legacy", "low-1", "low-2"]
    stored = {doc["name"]: doc for doc in db.jobs.find()}
    assert stored["top"]["claimPriority"] == 9
    assert "claimPriority" not in stored["low-1"]  # 0 is never stored
    assert "claimPriority" not in stored["low-2"]


@pytest.fixture
def connected(db: Database[Any], monkeypatch: pytest.MonkeyPatch) -> Database[Any]:
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    return db


def test_status_find_and_the_page_show_a_later_start_as_waiting_until_then(
    connected: Database[Any], clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """No lease holds it (no holder, no token): it waits, as a relocked document does."""
    db = connected
    orch = Orchestrator(db, replica_id="pod-1", clock=clock, clock_refresh=1e6)

    @orch.phase("jobs", "Queued")
    def work(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.measure_clock()
    doc = orch.submit("jobs", {"_id": "later", "phase": "Queued"}, not_before=600, priority=3)
    until = as_utc(doc["lockedUntil"])
    assert until == as_utc(doc["createdAt"]) + timedelta(seconds=600)
    assert "lockToken" not in doc and "lockedBy" not in doc
    publish(db, orch)
    orch.run_once()  # nothing to claim yet

    code, out, _ = run(["status", "--uri", URI, "--json"], capsys)
    assert code == 0
    [row] = [r for r in json.loads(out)["phases"] if r["collection"] == "jobs"]
    assert (row["count"], row["waiting"], row["leased"], row["overdue"]) == (1, 1, 0, 0)

    code, out, _ = run(["find", "-c", "jobs", "--state", "waiting", "--json", "--uri", URI], capsys)
    assert code == 0
    [listed] = json.loads(out)["documents"]
    assert listed["state"] == "waiting" and listed["holder"] is None
    assert datetime.fromisoformat(listed["until"]) == until
    [row_of] = Operations(db).browse(Filter("jobs", state=LeaseState.WAITING)).rows
    assert (row_of.id, row_of.until) == ("later", until)

    with mounted(db) as page:
        shown = read(page.get("/ops/document", params={"c": "jobs", "id": "later"}))
    assert shown.text_of("lease-state") == "waiting"
    assert f"{until:%Y-%m-%d %H:%M:%S} UTC" in shown.text_of("lease-note")
    assert "or a later start set at submit" in shown.text_of("lease-note")
    lease = {cells[0].split()[-1]: cells[1] for cells in shown.rows("lease")}
    assert (lease["lockToken"], lease["lockedBy"], lease["claimPriority"]) == ("-", "-", "3")

    clock.advance(600)
    orch.run_once()
    assert db.jobs.find_one({"_id": "later"})["phase"] == "Done"  # type: ignore[index]


def test_a_later_start_is_stored_on_the_server_clock_in_milliseconds() -> None:
    """``lockedUntil`` is computed from the same time as ``createdAt`` (the submitting
    replica's estimate of the server's clock), as BSON keeps it."""
    now = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    doc = submissions.new_document(
        {"phase": "Queued"}, now, until=starts.start_time(1.5, now, 3600), priority=1
    )
    assert doc["lockedUntil"] == bson_time(now + timedelta(seconds=1.5))
    assert doc["createdAt"] == bson_time(now)
    assert doc["claimPriority"] == 1
