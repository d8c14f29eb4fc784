"""The page's and the JSON API's schedules: the list, one schedule with its runs linked to
their documents, and pause, resume and trigger behind a confirmation that asks why,
refused cross-site like every other action."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pymongo.database import Database

from orchestrator import Orchestrator
from orchestrator.core.clock import as_utc
from orchestrator.core.names import SCHEDULES_COLLECTION
from orchestrator.core.schedules import run_id
from orchestrator.operations import Operations
from orchestrator.testing import FakeClock
from tests.operator_page import mounted, read


@pytest.fixture
def page(db: Database[Any]) -> Iterator[TestClient]:
    with mounted(db) as client:
        yield client


def scheduled(db: Database[Any], clock: FakeClock) -> Orchestrator:
    """A replica whose schedule ``every5`` started two reports."""
    orch = Orchestrator(db, replica_id="pod-1", clock=clock, clock_refresh=1e6)

    @orch.phase("reports", "Make")
    def make(lease: Any) -> Any:
        return lease.advance("Done")

    orch.schedule("every5", "reports", every=5)(lambda fire: {"phase": "Make"})
    orch.measure_clock()
    for _ in range(11):
        orch.run_once(heartbeat=False)
        clock.advance(1)
    return orch


def test_the_schedules_page_lists_them_and_links_each_run_to_its_document(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    scheduled(db, clock)
    db[SCHEDULES_COLLECTION].insert_one({"_id": "junk<b>", "spec": "<script>", "next": "soon"})
    response = page.get("/ops/schedules")
    listed = read(response)
    assert "every 5s" in listed.text and "unreadable spec" in listed.text
    assert "<script>" not in response.text and "junk<b>" in listed.text  # escaped
    shown = read(page.get("/ops/schedule?name=every5"))
    runs = sorted(d["_id"] for d in db.reports.find())
    for run in runs:
        assert any("document?" in href and "every5%40" in href for href in shown.links.values())
        assert run in shown.text
    read(page.get("/ops/schedule?name=nope"), 400)


def test_pause_resume_and_trigger_on_the_page_ask_why_and_are_audited(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    orch = scheduled(db, clock)
    for action, said in (("pause", "Paused"), ("resume", "Resumed"), ("trigger", "Triggered")):
        confirm = read(page.get(f"/ops/schedule/act?action={action}&name=every5"))
        [(_, target, fields)] = [f for f in confirm.forms if f[0] == "post"]
        read(page.post(target, data={**fields, "reason": ""}), 400)
        cross = page.post(
            target, data={**fields, "reason": "x"}, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert cross.status_code == 403
        done = read(page.post(target, data={**fields, "reason": f"{action} it"}))
        assert said in done.text
    entries = [(e.action, e.why) for e in Operations(db).audit()]
    assert entries == [("trigger", "trigger it"), ("resume", "resume it"), ("pause", "pause it")]
    [request] = db[SCHEDULES_COLLECTION].find_one({"_id": "every5"})["requests"]
    asked = run_id("every5", as_utc(request["start"]))
    before = db.reports.count_documents({})
    orch.run_once(heartbeat=False)
    assert db.reports.count_documents({"_id": asked}) == 1
    # and maybe the schedule's own next fire, come due meanwhile (where it falls on its
    # 5 s grid depends on the clocks)
    assert before + 1 <= db.reports.count_documents({}) <= before + 2


def test_the_api_lists_shows_and_acts_on_schedules(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    scheduled(db, clock)
    [row] = page.get("/ops/api/schedules").json()["schedules"]
    assert row["name"] == "every5" and row["spec"] == "every 5s"
    one = page.get("/ops/api/schedule?name=every5&runs=1").json()
    assert len(one["runs"]) == 1
    assert page.get("/ops/api/schedule?name=nope").status_code == 404
    posted = page.post("/ops/api/schedule/pause", json={"name": "every5", "reason": "r"})
    assert posted.json()["done"] is True
    backwards = page.post(
        "/ops/api/schedule/backfill",
        json={
            "name": "every5",
            "reason": "r",
            "from": {"$date": "2026-01-02T00:00:00Z"},
            "to": {"$date": "2026-01-01T00:00:00Z"},
        },
    )
    assert backwards.status_code == 400 and "before its start" in backwards.json()["error"]
    filled = page.post(
        "/ops/api/schedule/backfill",
        json={
            "name": "every5",
            "reason": "r",
            "from": {"$date": "2026-01-01T00:00:00Z"},
            "to": {"$date": "2026-01-01T00:00:10Z"},
        },
    )
    assert filled.json()["fires"] == 3
    form = page.post("/ops/api/schedule/trigger", data={"name": "every5", "reason": "r"})
    assert form.status_code == 415
