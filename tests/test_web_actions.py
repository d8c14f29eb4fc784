"""The page's actions, through their forms as a browser posts them: cancel, a retry or
cancel to a phase no live replica handles (refused, then sent anyway when the operator
says so), bulk actions behind a dry run and a reason, pause and resume with the banner
that says who honours each pause, who acted (the mounting application's actor), and
banners shown once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from pymongo.database import Database

from orchestrator.core.names import AUDIT_COLLECTION
from orchestrator.operations import Operations, Scope
from orchestrator.testing import FakeClock
from tests.operator_page import (
    Page,
    mounted,
    read,
    seed,
    seed_certificates,
    seed_invoices,
    seed_refunds,
    seed_tree,
)

XSS = '<script>alert("x")</script>'


@pytest.fixture
def page(db: Database[Any]) -> Iterator[TestClient]:
    with mounted(db) as client:
        yield client


def post_form(page: TestClient, url: str, **changes: str) -> tuple[str, dict[str, str], Page]:
    """The confirmation at ``url``: where its form posts, its fields with ``changes``."""
    shown = read(page.get(url))
    [(_, target, fields)] = [form for form in shown.forms if form[0] == "post"]
    return target, {**fields, **changes}, shown


def test_a_cancel_sends_the_document_to_the_cancelled_phase_and_takes_a_running_lease(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    url = "/ops/confirm?action=cancel&c=gateways&id=gw-held"
    target, fields, shown = post_form(page, url, reason="customer withdrew")
    assert target == "/ops/cancel"
    assert "its next write fails with LeaseLost" in " ".join(shown.text.split())
    done = read(page.post(target, data=fields))
    assert done.field("phase") == "Cancelled"
    assert done.field("lockToken") == "-"  # pod-2's lease is gone: its next write fails
    assert "Cancelled: sent to the cancelled phase" in done.text
    assert "cancel by web testclient: Provisioning → Cancelled" in done.text_of("history")
    assert "Cancel…" not in done.links  # cancelled already
    [entry] = Operations(db).audit()
    assert (entry.action, entry.by, entry.why) == ("cancel", "web testclient", "customer withdrew")


def test_a_signal_sent_from_the_page_wakes_the_waiting_document_for_the_replicas_tick(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    cert = seed_certificates(seeded)
    shown = read(page.get("/ops/document?c=certificates&id=a.example"))
    [link] = [url for text, url in shown.links.items() if text == "Send signal…"]
    target, fields, confirm = post_form(
        page, link, name="dns-verified", payload='{"txt": "abc"}', reason="TXT checked"
    )
    assert target == "/ops/signal"
    assert "If the document waits for that signal" in " ".join(confirm.text.split())
    response = page.post(target, data=fields, follow_redirects=False)
    assert "done=signalled-woke" in response.headers["location"]
    done = read(page.get(response.headers["location"]))
    assert "Signal sent: it was waiting for it, and is due now" in done.text
    seeded.orch.run_once()
    issued = db.certificates.find_one({"_id": cert["_id"]})
    assert issued["phase"] == "Issued" and issued["verified"] == {"txt": "abc"}
    [entry] = db[AUDIT_COLLECTION].find({"action": "signal"})
    assert (entry["by"], entry["why"]) == ("web testclient", "TXT checked")
    again = page.post(target, data={**fields, "payload": ""}, follow_redirects=False)
    assert "done=signalled&" in again.headers["location"] + "&"  # waits for nothing now


@pytest.mark.parametrize(
    ("changes", "status", "needle"),
    [
        ({"name": ""}, 400, "name the signal to send"),
        ({"payload": "{oops"}, 400, "the payload is not JSON"),
        ({"payload": '{"$set": 1}'}, 400, "payload.$set is not allowed"),
        ({"name": "x" * 201}, 400, "a signal's name is a non-empty string"),
        ({"ref": '"nope"'}, 404, "no document"),
    ],
)
def test_a_bad_signal_from_the_page_is_refused_and_sends_nothing(
    changes: dict[str, str],
    status: int,
    needle: str,
    db: Database[Any],
    clock: FakeClock,
    page: TestClient,
) -> None:
    seed_certificates(seed(db, clock))
    url = "/ops/confirm?action=signal&c=certificates&id=a.example"
    target, fields, _ = post_form(page, url, **{"name": "ping", "reason": "x", **changes})
    refused = read(page.post(target, data=fields), status)
    assert needle in refused.text
    assert db[AUDIT_COLLECTION].count_documents({"action": "signal"}) == 0


def test_a_cancel_from_the_page_reaches_what_it_owns_unless_left(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    seed_tree(db)
    url = "/ops/confirm?action=cancel&c=gateways&id=gw-parent"
    target, fields, shown = post_form(page, url, reason="gone")
    assert "The documents it owns (its children, and theirs)" in " ".join(shown.text.split())
    ticked = fields.pop("children")  # a browser sends the box only when it is ticked
    assert ticked == "abandon"
    done = read(page.post(target, data=fields))
    assert "What it owns, if anything, was cancelled with it" in done.text
    assert db.gateways.find_one({"_id": "gw-child-1"})["phase"] == "Cancelled"
    assert db.gateways.find_one({"_id": "gw-child-2"})["phase"] == "Ready"
    db.gateways.update_many({}, {"$set": {"phase": "Provisioning"}})
    target, fields, _ = post_form(page, url, reason="gone again")
    done = read(page.post(target, data=fields))
    assert "What it owns was left as it is." in done.text
    assert db.gateways.find_one({"_id": "gw-child-1"})["phase"] == "Provisioning"


def test_a_retry_to_a_phase_no_replica_handles_is_refused_then_sent_anyway_if_asked(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    url = "/ops/confirm?action=retry&c=gateways&id=gw-broken"
    target, fields, _ = post_form(page, url, phase="Provisionning")
    refused = read(page.post(target, data=fields), 422)
    assert "no live replica handles phase 'Provisionning' of 'gateways'" in refused.text
    assert "the phases they handle: Provisioning" in refused.text
    assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"
    # The refusal offers the same form again, with the box that says "send it anyway".
    [(_, again, resent)] = [form for form in refused.forms if form[0] == "post"]
    assert again == "/ops/retry" and resent["phase"] == "Provisionning"
    assert resent["any_phase"] == "yes"  # the checkbox's value, when ticked
    assert 'name="any_phase" value="yes" required' in page.post(target, data=fields).text
    done = read(page.post(again, data=resent))
    assert done.field("phase") == "Provisionning"
    # A cancel to an application's own phase is checked the same way.
    url = "/ops/confirm?action=cancel&c=gateways&id=gw-1"
    target, fields, _ = post_form(page, url, phase="Withdrawn")
    assert (
        "no live replica handles phase 'Withdrawn'"
        in read(page.post(target, data=fields), 422).text
    )


def test_a_bulk_retry_shows_what_it_would_do_asks_why_then_does_it(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    ids = seed_invoices(seeded)
    listed = read(page.get("/ops/documents?c=invoices&phase=Failed"))
    url = listed.links["Retry all…"]
    assert url == "/ops/bulk?action=retry&c=invoices&phase=Failed"
    target, fields, shown = post_form(page, url)
    assert shown.text_of("count") == (
        "3 documents would be retried now, each to the phase of its last error."
    )
    assert sorted(row[1] for row in shown.rows("would-change")) == [
        "invoice=INV-1003",
        "invoice=INV-1004",
        "invoice=INV-1005",
    ]
    assert db.invoices.count_documents({"phase": "Failed"}) == 3  # a dry run
    refused = read(page.post(target, data=fields), 400)
    assert "give a reason" in refused.text
    # Meanwhile the application moves one on: it no longer matches, and is left alone.
    db.invoices.update_one({"invoice": "INV-1005"}, {"$set": {"phase": "Refunded"}})
    done = read(page.post(target, data={**fields, "reason": "the bank is back"}))
    assert done.text_of("done").startswith("Retried 2 documents of invoices")
    assert "as web testclient" in done.text_of("done")
    phases = {doc["invoice"]: doc["phase"] for doc in db.invoices.find()}
    assert [phases[f"INV-{n}"] for n in (1003, 1004, 1005)] == ["Charging", "Charging", "Refunded"]
    [entry] = [e for e in Operations(db).audit() if e.kind == "operator"]
    assert (entry.action, entry.count, entry.why) == ("retry", 2, "the bank is back")
    assert entry.scope == {"collection": "invoices", "phase": "Failed"}
    assert sorted(entry.documents) == sorted(f'{{"$oid": "{i}"}}' for i in ids[2:4])


def test_retry_all_of_the_failed_list_leaves_the_still_retrying_alone(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    """The failed list's Retry all changes what a handler gave up on, never a document
    the library is still retrying (before: it reset their attempts too)."""
    seeded = seed(db, clock)
    seed_invoices(seeded)
    seed_refunds(seeded)
    listed = read(page.get("/ops/documents?c=invoices&state=failed"))
    url = listed.links["Retry all…"]
    assert url == "/ops/bulk?action=retry&c=invoices&state=failed"
    target, fields, shown = post_form(page, url, reason="the bank is back")
    assert sorted(row[1] for row in shown.rows("would-change")) == [
        "invoice=INV-1003",
        "invoice=INV-1004",
        "invoice=INV-1005",
    ]
    done = read(page.post(target, data=fields))
    assert done.text_of("done").startswith("Retried 3 documents of invoices")
    refunds = list(db.invoices.find({"phase": "Refunding"}))
    assert [(d["attempts"], d["lastError"]["type"]) for d in refunds] == [(1, "TimeoutError")] * 2


def test_a_bulk_action_to_an_unhandled_phase_offers_to_send_them_anyway(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed_invoices(seed(db, clock))
    url = "/ops/bulk?action=retry&c=invoices&phase=Failed&to=Chargng"
    shown = read(page.get(url), 422)
    assert "no live replica handles phase 'Chargng'" in shown.text
    assert "the phases they handle: Charging" in shown.text
    [(_, target, fields)] = [form for form in shown.forms if form[0] == "post"]
    assert "any_phase" in fields  # the box, unticked until the operator ticks it
    del fields["any_phase"]
    refused = read(page.post(target, data={**fields, "reason": "typo?"}), 422)
    [(_, again, resent)] = [form for form in refused.forms if form[0] == "post"]
    done = read(page.post(again, data=resent))
    assert done.text_of("done").startswith("Retried 3 documents of invoices, to phase Chargng")
    assert db.invoices.count_documents({"phase": "Chargng"}) == 3


@pytest.mark.parametrize("action", ["unlock", "cancel"])
def test_bulk_unlock_and_cancel_act_on_the_filter(
    action: str, db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    url = f"/ops/bulk?action={action}&c=gateways&phase=Provisioning&state=leased"
    target, fields, shown = post_form(page, url, reason="pod-2 is wedged")
    assert [row[0] for row in shown.rows("would-change")] == ["gw-held"]
    read(page.post(target, data=fields))
    held = db.gateways.find_one({"_id": "gw-held"})
    assert "lockToken" not in held
    assert held["phase"] == ("Cancelled" if action == "cancel" else "Provisioning")


def test_a_bulk_unlock_shows_the_free_documents_it_leaves_alone_and_why(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    response = page.get("/ops/bulk?action=unlock&c=gateways")
    shown = read(response)
    assert sorted(row[0] for row in shown.rows("would-change")) == [
        "gw-held",
        "gw-stuck",
        "gw-waiting",
    ]
    skipped = shown.rows("would-skip")
    assert sorted(row[0] for row in skipped) == ["gw-1", "gw-2", "gw-3", "gw-broken"]
    assert {row[-1] for row in skipped} == {"free already: no lease and no wait to end"}
    # Each says its refusal as a value too, the one the JSON API gives.
    assert response.text.count('data-refusal="already_free"') == len(skipped)


def test_who_acts_is_the_mounting_applications_actor(db: Database[Any], clock: FakeClock) -> None:
    seed(db, clock)
    with mounted(db, actor=lambda request: request.headers["x-user"]) as page:
        url = "/ops/confirm?action=retry&c=gateways&id=gw-broken"
        target, fields, _ = post_form(page, url, reason="on call")
        shown = read(page.post(target, data=fields, headers={"x-user": "ada@example.com"}))
    assert "retry by ada@example.com" in shown.text_of("history")
    [entry] = Operations(db).audit()
    assert entry.by == "ada@example.com"


def test_pause_and_resume_from_the_page_with_who_honours_each_pause(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    overview = read(page.get("/ops/"))
    [pause_phase] = [
        links[0]
        for cells, links in zip(
            overview.tables["handlers"][1:], overview.row_links["handlers"][1:], strict=True
        )
        if cells[:2] == ["gateways", "Provisioning"]
    ]
    assert pause_phase == "/ops/pause?c=gateways&phase=Provisioning"
    target, fields, shown = post_form(page, pause_phase)
    assert [row[1] for row in shown.rows("covered")] == [
        "tests.operator_page:seed.<locals>.provision"
    ]
    assert "give a reason" in read(page.post(target, data=fields), 400).text
    response = page.post(
        target, data={**fields, "reason": "CA maintenance"}, follow_redirects=False
    )
    assert response.headers["location"] == "/ops/?done=paused"
    paused = read(page.get(response.headers["location"]))
    assert "Paused: every replica stops claiming it" in paused.text
    banner = paused.text_of("pauses")
    assert "gateways, phase Provisioning by web testclient" in banner
    assert "“CA maintenance”" in banner
    assert "Honoured by no live replica yet; not yet by pod-1, pod-2, pod-3, pod-4" in banner
    # The banner is on every page, and shown once: the reload drops done=.
    assert 'content="5; url=/ops/"' in page.get("/ops/?done=paused").text
    for url in ("/ops/documents?c=gateways", "/ops/document?c=gateways&id=gw-1", "/ops/audit"):
        assert "gateways, phase Provisioning" in read(page.get(url)).text_of("pauses")
    seeded.orch.heartbeat()  # pod-1 reads the pauses, and publishes that it honours it
    banner = read(page.get("/ops/")).text_of("pauses")
    assert "Honoured by pod-1; not yet by pod-2, pod-3, pod-4" in banner
    again = page.post(target, data={**fields, "reason": "twice"}, follow_redirects=False)
    assert again.headers["location"] == "/ops/?done=already-paused"
    assert [p.why for p in Operations(db).pauses()] == ["CA maintenance"]
    # Resumed from the banner's link.
    resume = read(page.get("/ops/")).links["Resume…"]
    target, fields, _ = post_form(page, resume, reason="done")
    resumed = read(page.post(target, data=fields))
    assert "Resumed" in resumed.text and "pauses" not in resumed.texts
    assert [e.action for e in Operations(db).audit()] == ["resume", "pause"]


def test_a_pause_of_a_phase_no_replica_handles_is_refused_until_the_operator_forces_it(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    url = "/ops/pause?c=gateways&phase=Provisionnig"
    target, fields, shown = post_form(page, url, reason="typo in an incident")
    assert "No live replica runs a handler it covers (now)." in shown.text
    assert fields.pop("force") == "yes"  # the box offered, not ticked
    refused = read(page.post(target, data=fields), 422)
    assert "no handler takes phase 'Provisionnig' of 'gateways'" in refused.text
    assert "they have: Provisioning" in refused.text
    assert Operations(db).pauses() == []
    [(_, again, resent)] = [form for form in refused.forms if form[0] == "post"]
    assert (again, resent["force"], resent["phase"]) == ("/ops/pause", "yes", "Provisionnig")
    forced = page.post(again, data=resent, follow_redirects=False)
    assert forced.headers["location"] == "/ops/?done=paused"
    assert [p.scope.phase for p in Operations(db).pauses()] == ["Provisionnig"]


def test_the_pause_confirmation_reads_as_a_sentence(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    shown = read(page.get("/ops/pause?c=gateways&phase=Provisioning"))
    said = " ".join(shown.text_of("pausing").split())
    assert said.startswith(
        "Every replica stops claiming documents for phase Provisioning of gateways at its "
        "next heartbeat;"
    )
    shown = read(page.get("/ops/pause?c=gateways"))
    assert "every handler of gateways at its next heartbeat" in shown.text_of("pausing")


def test_the_audit_page_names_documents_by_business_key_and_filters_by_one(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    seed_invoices(seeded)
    operations = Operations(db)
    for number in ("INV-1003", "INV-1004"):
        operations.retry("invoices", operations.find("invoices", number), why=f"bank {number}")
    operations.pause(Scope("invoices"), why="bank maintenance")
    trail = read(page.get("/ops/audit"))
    rows = trail.rows("audit")
    assert [row[2] for row in rows] == ["pause", "retry", "retry", "takeover from pod-9"]
    assert "invoice=INV-1004" in rows[1][5] and "invoice=INV-1003" in rows[2][5]
    for typed in ("INV-1003", "invoice=INV-1003"):
        found = read(page.get("/ops/audit?" + urlencode({"key": typed})))
        [row] = found.rows("audit")
        assert "invoice=INV-1003" in row[5] and row[6] == "bank INV-1003"
        assert "All entries" in found.links
    none = read(page.get("/ops/audit?key=INV-9999"))
    assert "No entry names a document by INV-9999." in none.text
    [entry] = page.get("/ops/api/audit?key=INV-1004").json()["entries"]
    assert (entry["action"], entry["keys"]) == ("retry", ["invoice=INV-1004"])


def test_the_banner_of_a_finished_action_is_shown_once(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    url = "/ops/confirm?action=unlock&c=gateways&id=gw-held"
    target, fields, _ = post_form(page, url)
    response = page.post(target, data=fields, follow_redirects=False)
    location = response.headers["location"]
    assert "done=unlocked" in location
    shown = page.get(location)
    assert "Unlocked: the document is claimable at once." in shown.text
    refresh = shown.text.split('http-equiv="refresh" content="', 1)[1].split('"', 1)[0]
    after = refresh.split("url=", 1)[1].replace("&amp;", "&")
    assert "done=" not in after and "ref=" in after
    assert "Unlocked" not in page.get(after).text


@pytest.mark.parametrize(
    "path", ["/ops/bulk", "/ops/cancel", "/ops/signal", "/ops/pause", "/ops/resume"]
)
def test_every_new_action_is_a_same_site_post(
    path: str, db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    fields = {"c": "gateways", "action": "retry", "reason": "x", "phase": "Provisioning"}
    refused = read(page.post(path, data=fields, headers={"Sec-Fetch-Site": "cross-site"}), 403)
    assert "cross-site" in refused.text
    assert page.post(path, json=fields).status_code == 415
    assert db["orchestrator.audit"].count_documents({}) == 0


def test_values_from_documents_and_operators_are_escaped_on_the_new_pages(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    db.gateways.insert_one(
        {"_id": XSS, "phase": XSS, "lastError": {"type": XSS, "message": XSS, "phase": XSS}}
    )
    Operations(db).pause(Scope("gateways", XSS), force=True, by=XSS, why=XSS)
    url = "/ops/confirm?" + urlencode({"action": "retry", "c": "gateways", "ref": json.dumps(XSS)})
    target, fields, _ = post_form(page, url, reason=XSS)
    read(page.post(target, data={**fields, "any_phase": "yes"}))
    for url in (
        "/ops/",
        "/ops/documents?c=gateways",
        "/ops/documents?c=gateways&state=failed",
        "/ops/bulk?action=cancel&c=gateways",
        "/ops/document?" + urlencode({"c": "gateways", "id": XSS}),
        "/ops/pause?" + urlencode({"c": "gateways", "phase": XSS}),
        "/ops/audit",
    ):
        response = page.get(url)
        assert response.status_code == 200, (url, response.text)
        assert "<script" not in response.text, url
        assert "&lt;script&gt;" in response.text, url
