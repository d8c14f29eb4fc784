"""The page's JSON API (``/api``), used as a script would: reads, actions on one document
(as read) or on a filter (with a dry run), pauses, and every refusal as ``{error, kind}``
with its status code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pymongo.database import Database

from orchestrator.core.names import AUDIT_COLLECTION
from orchestrator.operations import Operations
from orchestrator.testing import FakeClock
from tests.operator_page import (
    mounted,
    seed,
    seed_certificates,
    seed_invoices,
    seed_refunds,
    seed_tree,
)


@pytest.fixture
def api(db: Database[Any]) -> Iterator[TestClient]:
    with mounted(db) as client:
        yield client


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def test_the_reads(db: Database[Any], clock: FakeClock, api: TestClient) -> None:
    seeded = seed(db, clock)
    ids = seed_invoices(seeded)
    status = ok(api.get("/ops/api/status"))
    assert {row["phase"] for row in status["phases"] if row["collection"] == "invoices"} == {
        "Failed",
        "Paid",
    }
    keys = {e["key"] for e in status["errors"] if e["collection"] == "invoices"}
    assert keys == {"invoice=INV-1003", "invoice=INV-1004", "invoice=INV-1005"}
    assert "tests.operator_page:seed_invoices.<locals>.charge" in status["handler_names"].values()

    page = ok(api.get("/ops/api/documents", params={"c": "invoices", "state": "failed"}))
    assert page["filter"] == {"collection": "invoices", "state": "failed"}
    assert page["index"].startswith("orchestrator_errors")
    assert [d["key"] for d in page["documents"]] == [f"invoice=INV-100{n}" for n in (5, 4, 3)]
    assert page["next"] is None
    first = ok(api.get("/ops/api/documents", params={"c": "invoices", "limit": "4"}))
    rest = ok(api.get("/ops/api/documents", params={"c": "invoices", "after": first["next"]}))
    assert len(first["documents"]) == 4 and len(rest["documents"]) == 2 and rest["next"] is None

    found = ok(api.get("/ops/api/document", params={"c": "invoices", "id": "INV-1004"}))
    assert found["ref"] == f'{{"$oid": "{ids[3]}"}}'
    assert found["document"]["invoice"] == "INV-1004"
    assert found["document"]["_id"] == {"$oid": ids[3]}  # relaxed Extended JSON
    assert "orchestratorHistory" not in found["document"]
    assert found["badge"]["state"] == "failed"
    assert found["seen"] == {"phase": "Failed", "lockToken": None}
    [step] = found["history"]
    assert (step["kind"], step["what"], step["phase"], step["to"]) == (
        "step",
        "failed",
        "Charging",
        "Failed",
    )
    assert step["error_type"] == "TimeoutError" and "Traceback" in step["traceback"]
    same = ok(api.get("/ops/api/document", params={"c": "invoices", "ref": found["ref"]}))
    assert same["ref"] == found["ref"]

    trail = ok(api.get("/ops/api/audit"))["entries"]
    assert [(e["kind"], e["taken_from"]) for e in trail] == [("takeover", "pod-9")]
    assert ok(api.get("/ops/api/pauses")) == {"pauses": []}


def test_one_document_is_acted_on_as_it_was_read(
    db: Database[Any], clock: FakeClock, api: TestClient
) -> None:
    seed_invoices(seed(db, clock))
    found = ok(api.get("/ops/api/document", params={"c": "invoices", "id": "INV-1003"}))
    body = {"c": "invoices", "ref": found["ref"], "seen": found["seen"], "reason": "bank up"}
    done = ok(api.post("/ops/api/retry", json=body))
    assert (done["source"], done["target"], done["lease_taken"]) == ("Failed", "Charging", False)
    assert done["document"]["phase"] == "Charging" and done["document"]["attempts"] == 0
    # Posted again with the state it was read in: it moved since, nothing is done.
    again = ok(api.post("/ops/api/retry", json=body), 409)
    assert again["kind"] == "DocumentChanged"
    history = ok(api.get("/ops/api/document", params={"c": "invoices", "id": "INV-1003"}))
    assert history["history"][0]["what"] == "retry"  # the latest first, as on the page
    assert history["history"][0]["by"] == "web testclient"
    assert history["history"][0]["why"] == "bank up"

    other = ok(api.get("/ops/api/document", params={"c": "invoices", "id": "INV-1004"}))
    body = {"c": "invoices", "ref": other["ref"], "seen": other["seen"], "to": "Chargng"}
    refused = ok(api.post("/ops/api/retry", json=body), 422)
    assert refused["kind"] == "UnhandledPhase" and refused["handled"] == ["Charging"]
    assert ok(api.post("/ops/api/retry", json={**body, "any_phase": True}))["target"] == "Chargng"

    # A document a replica holds now: retried only when forced, taking the lease.
    held = ok(api.get("/ops/api/document", params={"c": "gateways", "id": "gw-held"}))
    body = {"c": "gateways", "ref": held["ref"], "seen": held["seen"], "to": "Provisioning"}
    assert ok(api.post("/ops/api/retry", json=body), 409)["kind"] == "LeaseHeld"
    assert ok(api.post("/ops/api/retry", json={**body, "force": True}))["lease_taken"] is True

    paid = ok(api.get("/ops/api/document", params={"c": "invoices", "id": "INV-1001"}))
    cancelled = ok(
        api.post(
            "/ops/api/cancel", json={"c": "invoices", "ref": paid["ref"], "seen": paid["seen"]}
        )
    )
    assert cancelled["target"] == "Cancelled"
    unlock = {"c": "invoices", "ref": paid["ref"], "seen": {"phase": "Cancelled"}}
    assert ok(api.post("/ops/api/unlock", json=unlock))["document"]["phase"] == "Cancelled"


def test_a_filter_is_acted_on_with_a_dry_run_first(
    db: Database[Any], clock: FakeClock, api: TestClient
) -> None:
    seed_invoices(seed(db, clock))
    body: dict[str, Any] = {
        "c": "invoices",
        "filter": {"phase": "Failed", "key": ["INV-1003", "invoice=INV-1003"]},
        "dry_run": True,
    }
    dry = ok(api.post("/ops/api/retry", json=body))
    assert dry["dry_run"] is True and [d["key"] for d in dry["changed"]] == ["invoice=INV-1003"]
    assert db.invoices.count_documents({"phase": "Failed"}) == 3
    body["filter"] = {"phase": ["Failed"], "state": "failed"}
    done = ok(api.post("/ops/api/retry", json={**body, "dry_run": False, "reason": "bank up"}))
    assert len(done["changed"]) == 3 and done["skipped"] == []
    assert db.invoices.count_documents({"phase": "Charging"}) == 3
    [entry] = [e for e in Operations(db).audit() if e.kind == "operator"]
    assert (entry.by, entry.count, entry.why) == ("web testclient", 3, "bank up")
    cancel = {"c": "invoices", "filter": {"phase": "Charging"}, "to": "Refund", "dry_run": True}
    assert ok(api.post("/ops/api/cancel", json=cancel), 422)["handled"] == ["Charging"]


def test_the_api_counts_finds_and_retries_the_given_up_apart_from_the_retrying(
    db: Database[Any], clock: FakeClock, api: TestClient
) -> None:
    """``retrying`` (tried again) and ``failed`` (given up on) in the counts, the filter
    and each row's ``failure``; a retry of the failed filter leaves the retrying alone
    (before: one failed count, and its retry reset their attempts too)."""
    seeded = seed(db, clock)
    seed_invoices(seeded)
    seed_refunds(seeded)
    status = ok(api.get("/ops/api/status"))
    counts = {
        row["phase"]: (row["retrying"], row["failed"])
        for row in status["phases"]
        if row["collection"] == "invoices"
    }
    assert counts == {"Failed": (0, 3), "Paid": (0, 0), "Refunding": (2, 0)}
    for state, keys in (
        ("retrying", ["invoice=INV-2001", "invoice=INV-2002"]),
        ("failed", ["invoice=INV-1003", "invoice=INV-1004", "invoice=INV-1005"]),
    ):
        page = ok(api.get("/ops/api/documents", params={"c": "invoices", "state": state}))
        assert sorted(d["key"] for d in page["documents"]) == keys
        assert {d["failure"] for d in page["documents"]} == {state}
    body = {"c": "invoices", "filter": {"state": "failed"}, "reason": "bank up"}
    done = ok(api.post("/ops/api/retry", json=body))
    assert len(done["changed"]) == 3 and done["skipped"] == []
    refunds = list(db.invoices.find({"phase": "Refunding"}))
    assert [(d["attempts"], d["lastError"]["type"]) for d in refunds] == [(1, "TimeoutError")] * 2


def test_a_signal_wakes_the_document_waiting_for_it_for_the_replicas_next_tick(
    db: Database[Any], clock: FakeClock, api: TestClient
) -> None:
    seeded = seed(db, clock)
    cert = seed_certificates(seeded)
    found = ok(api.get("/ops/api/document", params={"c": "certificates", "id": "a.example"}))
    body = {
        "c": "certificates",
        "ref": found["ref"],
        "name": "dns-verified",
        "payload": {"txt": "abc", "at": {"$date": "2026-01-01T00:00:00Z"}},
        "reason": "TXT checked",
    }
    sent = ok(api.post("/ops/api/signal", json=body))
    assert (sent["action"], sent["name"], sent["woke"]) == ("signal", "dns-verified", True)
    assert sent["ref"] == found["ref"] and len(sent["id"]) == 16
    seeded.orch.run_once()
    issued = db.certificates.find_one({"_id": cert["_id"]})
    assert issued["phase"] == "Issued" and issued["verified"]["txt"] == "abc"
    [entry] = db[AUDIT_COLLECTION].find({"action": "signal"})
    assert (entry["by"], entry["why"], entry["scope"]["key"]) == (
        "web testclient",
        "TXT checked",
        "domain=a.example",
    )
    again = ok(api.post("/ops/api/signal", json={**body, "name": "renew"}))
    assert again["woke"] is False  # Issued: it waits for nothing; kept in its inbox


def test_a_cancel_reaches_what_the_document_owns_unless_abandoned(
    db: Database[Any], clock: FakeClock, api: TestClient
) -> None:
    seed(db, clock)
    seed_tree(db)
    parent = ok(api.get("/ops/api/document", params={"c": "gateways", "id": "gw-parent"}))
    body = {"c": "gateways", "ref": parent["ref"], "seen": parent["seen"], "reason": "gone"}
    done = ok(api.post("/ops/api/cancel", json=body))
    assert done["cascade"]["policy"] == "cancel" and done["cascade"]["cut"] is False
    assert [(d["id"], d["owner"]) for d in done["cascade"]["cancelled"]] == [
        ("gw-child-1", "gateways/gw-parent")
    ]
    assert [(d["id"], d["phase"]) for d in done["cascade"]["left"]] == [("gw-child-2", "Ready")]
    assert db.gateways.find_one({"_id": "gw-child-1"})["phase"] == "Cancelled"
    db.gateways.update_many({}, {"$set": {"phase": "Provisioning"}})
    parent = ok(api.get("/ops/api/document", params={"c": "gateways", "id": "gw-parent"}))
    body = {**body, "seen": parent["seen"], "children": "abandon"}
    done = ok(api.post("/ops/api/cancel", json=body))
    assert done["cascade"] == {"policy": "abandon", "cancelled": [], "left": [], "cut": False}
    assert db.gateways.find_one({"_id": "gw-child-1"})["phase"] == "Provisioning"
    bulk = {"c": "gateways", "filter": {"phase": "Provisioning"}, "dry_run": True}
    assert ok(api.post("/ops/api/cancel", json=bulk))["cascade"]["cancelled"] == []


def test_pause_and_resume(db: Database[Any], clock: FakeClock, api: TestClient) -> None:
    seeded = seed(db, clock)
    body = {"c": "gateways", "phase": "Provisioning", "reason": "CA maintenance"}
    assert ok(api.post("/ops/api/pause", json=body))["done"] is True
    assert ok(api.post("/ops/api/pause", json=body))["done"] is False
    [pause] = ok(api.get("/ops/api/pauses"))["pauses"]
    assert (pause["by"], pause["why"], pause["honoured_by"]) == (
        "web testclient",
        "CA maintenance",
        [],
    )
    seeded.orch.heartbeat()
    [pause] = ok(api.get("/ops/api/pauses"))["pauses"]
    assert pause["honoured_by"] == ["pod-1"]
    assert pause["not_yet"] == ["pod-2", "pod-3", "pod-4"]
    assert ok(api.get("/ops/api/status"))["pauses"][0]["phase"] == "Provisioning"
    assert ok(api.post("/ops/api/resume", json=body))["done"] is True
    assert ok(api.get("/ops/api/pauses")) == {"pauses": []}


def test_a_pause_of_a_phase_no_live_replica_handles_is_refused_unless_forced(
    db: Database[Any], clock: FakeClock, api: TestClient
) -> None:
    seed(db, clock)
    body = {"c": "gateways", "phase": "Provisionnig", "reason": "typo"}
    refused = api.post("/ops/api/pause", json=body)
    assert refused.status_code == 422
    answer = refused.json()
    assert answer["kind"] == "UnhandledScope"
    assert answer["known"] == ["Provisioning"]
    assert answer["error"] == (
        "no handler takes phase 'Provisionnig' of 'gateways' (on any live replica); "
        "they have: Provisioning; send force: true to pause it all the same"
    )
    assert ok(api.get("/ops/api/pauses")) == {"pauses": []}
    assert ok(api.post("/ops/api/pause", json={**body, "force": True}))["done"] is True
    assert [p["phase"] for p in ok(api.get("/ops/api/pauses"))["pauses"]] == ["Provisionnig"]
    forced_resume = api.post("/ops/api/resume", json={**body, "force": True})
    assert forced_resume.status_code == 400
    assert ok(api.post("/ops/api/resume", json=body))["done"] is True


def test_every_refusal_is_json_with_its_status(
    db: Database[Any], clock: FakeClock, api: TestClient
) -> None:
    seed(db, clock)
    db.gateways.insert_many([{"_id": "42", "phase": "Ready"}, {"_id": 42, "phase": "Ready"}])
    gw = ok(api.get("/ops/api/document", params={"c": "gateways", "id": "gw-broken"}))
    one = {"c": "gateways", "ref": gw["ref"], "seen": gw["seen"]}
    sig = {"c": "gateways", "ref": gw["ref"], "name": "ping"}
    cases: list[tuple[Any, int, str, str]] = [
        (api.get("/ops/api/documents", params={"c": "nope"}), 404, "NotFound", "no collection"),
        (
            api.get("/ops/api/document", params={"c": "gateways", "id": "x"}),
            404,
            "DocumentNotFound",
            "no document 'x'",
        ),
        (
            api.get("/ops/api/document", params={"c": "gateways", "id": "42"}),
            409,
            "AmbiguousId",
            "",
        ),
        (
            api.get("/ops/api/documents", params={"c": "gateways", "key": "region=eu"}),
            422,
            "UnindexedField",
            "no index",
        ),
        (
            api.get("/ops/api/documents", params={"c": "gateways", "state": "x"}),
            400,
            "BadRequest",
            "lease state",
        ),
        (
            api.get("/ops/api/documents", params={"c": "gateways", "limit": "501"}),
            400,
            "BadRequest",
            "limit",
        ),
        (api.post("/ops/api/retry", content=b"{}"), 415, "UnsupportedMediaType", "JSON"),
        (api.post("/ops/api/retry", data={"c": "gateways"}), 415, "UnsupportedMediaType", ""),
        (
            api.post("/ops/api/retry", json=one, headers={"Sec-Fetch-Site": "cross-site"}),
            403,
            "CrossSite",
            "cross-site",
        ),
        (
            api.post("/ops/api/retry", json=one, headers={"Origin": "https://evil.example"}),
            403,
            "CrossSite",
            "not this site",
        ),
        (
            api.post("/ops/api/retry", content=b"[", headers={"content-type": "application/json"}),
            400,
            "BadRequest",
            "malformed JSON",
        ),
        (api.post("/ops/api/retry", json=[1]), 400, "BadRequest", "JSON object"),
        (
            api.post("/ops/api/retry", json={**one, "anyPhase": True}),
            400,
            "BadRequest",
            "unknown field(s) anyPhase",
        ),
        (api.post("/ops/api/retry", json={**one, "force": "yes"}), 400, "BadRequest", "true or"),
        (api.post("/ops/api/retry", json={**one, "seen": None}), 400, "BadRequest", "seen"),
        (api.post("/ops/api/unlock", json={**one, "to": "X"}), 400, "BadRequest", "no to"),
        (api.post("/ops/api/retry", json={**one, "ref": '"nope"'}), 404, "DocumentNotFound", ""),
        (api.post("/ops/api/retry", json={**one, "to": "$set"}), 400, "OperatorError", "phase"),
        (
            api.post("/ops/api/retry", json={"c": "gateways", "filter": {"colour": "red"}}),
            400,
            "BadRequest",
            "unknown filter field",
        ),
        (
            api.post("/ops/api/pause", json={"c": "gateways", "phase": 3}),
            400,
            "BadRequest",
            "phase is a string",
        ),
        (
            api.post("/ops/api/cancel", json={**one, "children": "orphan"}),
            400,
            "OperatorError",
            "children is 'cancel' or 'abandon', not 'orphan'",
        ),
        (
            api.post("/ops/api/retry", json={**one, "children": "abandon"}),
            400,
            "BadRequest",
            "children is a cancel's",
        ),
        (
            api.post("/ops/api/signal", json={"c": "gateways", "ref": gw["ref"]}),
            400,
            "BadRequest",
            "the signal's name",
        ),
        (
            api.post("/ops/api/signal", json={**sig, "name": ""}),
            400,
            "ConfigError",
            "a signal's name is a non-empty string",
        ),
        (
            api.post("/ops/api/signal", json={**sig, "payload": {"$set": 1}}),
            400,
            "ConfigError",
            "payload.$set is not allowed",
        ),
        (
            api.post("/ops/api/signal", json={**sig, "seen": gw["seen"]}),
            400,
            "BadRequest",
            "unknown field(s) seen",
        ),
        (
            api.post("/ops/api/signal", json={**sig, "ref": '"nope"'}),
            404,
            "DocumentNotFound",
            "nope",
        ),
        (api.post("/ops/api/signal", json={**sig, "c": "nope"}), 404, "NotFound", "nope"),
        (
            api.post(
                "/ops/api/retry",
                content=b"x" * 20_000,
                headers={"content-type": "application/json"},
            ),
            413,
            "TooLarge",
            "at most",
        ),
    ]
    for response, status, kind, needle in cases:
        body = ok(response, status)
        assert body["kind"] == kind, body
        assert needle in body["error"], body
        assert set(body) >= {"error", "kind"}
    assert api.get("/ops/api/retry").status_code == 405
    assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"
    assert db["orchestrator.audit"].count_documents({"kind": "operator"}) == 0
