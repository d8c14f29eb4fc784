"""The operator's page, mounted in an application as users mount it, and ``orchestrator web``.

Each test reads the page as HTML and acts through its forms, as a browser would (the
browser itself drives it in ``test_web_browser.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from math import isnan
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from bson import ObjectId, json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pymongo import AsyncMongoClient
from pymongo.database import Database
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from orchestrator import ConfigError
from orchestrator.cli import connecting, running
from orchestrator.cli import main as cli
from orchestrator.core.replicas import RunningStep
from orchestrator.core.resource import EPOCH
from orchestrator.mongo import Store
from orchestrator.monitoring.prometheus import StatusCollector
from orchestrator.operations import AsyncOperations, AsyncStatusCache, Operations
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.memory import MemoryDatabase
from orchestrator.web import operator_app
from orchestrator.web import serve as web_serve
from tests.conftest import MONGODB_URI, MakeEither
from tests.engines import hold, wait
from tests.operator_page import Page, mounted, read, replica_records, seed

XSS = '<script>alert("x")</script>\'"><img src=x onerror=alert(1)>'


@pytest.fixture
def page(db: Database[Any]) -> Iterator[TestClient]:
    with mounted(db) as client:
        yield client


def open_document(page: TestClient, doc_id: str) -> Page:
    return read(page.get("/ops/document", params={"c": "gateways", "id": doc_id}))


def confirm(page: TestClient, action: str, doc_id: str) -> tuple[str, dict[str, str]]:
    """The confirmation page's form: where it posts and what it sends."""
    shown = read(page.get("/ops/confirm", params={"action": action, "c": "gateways", "id": doc_id}))
    [(_, target, fields)] = [form for form in shown.forms if form[0] == "post"]
    return target, fields


def test_the_page_shows_the_status_commands_counts_per_collection_and_phase(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    shown = read(page.get("/ops/"))
    counted = ("count", "leased", "overdue", "waiting", "retrying", "failed")
    expected = [
        [r.collection, r.phase, *(str(getattr(r, name)) for name in counted)]
        for r in Operations(db).status().phases
    ]
    rows = [row for row in shown.rows("counts") if row[1] != "all phases"]
    assert rows == expected
    by_phase = {row[1]: row for row in rows}
    # documents, leased now, overdue, waiting, retrying, failed
    assert by_phase["Provisioning"][2:] == ["3", "1", "1", "1", "0", "0"]
    assert by_phase["Failed"][2:] == ["1", "0", "0", "0", "0", "1"]
    assert by_phase["Ready"][2] == "3"
    [total] = [row for row in shown.rows("counts") if row[1] == "all phases"]
    assert total[2:] == ["7", "1", "1", "1", "0", "1"]
    [error] = shown.rows("errors")
    assert error[:4] == ["gateways", "gw-broken", "-", "Failed"]  # its id; no business key
    assert "certificate authority unreachable" in error[6]


def test_a_document_is_opened_by_its_id_from_a_page_that_does_not_reload(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    overview = read(page.get("/ops/"))
    response = page.get(overview.links["Open a document by its id…"])
    finder = Page(response.text)
    assert response.status_code == 200
    assert 'http-equiv="refresh"' not in response.text  # typing is not interrupted
    [(method, target, fields)] = finder.forms
    assert (method, target, set(fields)) == ("get", "/ops/document", {"id"})
    assert read(page.get(target, params={"c": "gateways", "id": "gw-held"})).field("lockedBy") == (
        "pod-2"
    )
    assert 'http-equiv="refresh"' in page.get("/ops/").text


def test_the_page_lists_the_live_replicas_and_flags_their_disagreement(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    shown = read(page.get("/ops/"))
    replicas = {row[0]: row for row in shown.rows("replicas")}
    assert sorted(replicas) == ["pod-1", "pod-2", "pod-3", "pod-4"]  # pod-9's expired
    assert replicas["pod-3"][3] == "async"
    assert [replicas[name][7] for name in ("pod-1", "pod-3")] == ["30s", "300s"]
    assert replicas["pod-1"][10] == "none"
    assert replicas["pod-2"][10].startswith("gateways/gw-held (Provisioning, for")
    # Silent past two record intervals (2 x 10 s): marked, still listed. Ages are judged by
    # the server's time, which on a real server went on since the records were written at
    # the fake clock's now: they are read relative to pod-1's, written at that now.
    seen = {name: replicas[name][6] for name in ("pod-1", "pod-2", "pod-3", "pod-4")}
    assert all(text.split(" ", 1)[1] == "s ago" for name, text in seen.items() if name != "pod-4")
    assert seen["pod-4"].endswith(" s ago stale")
    ages = {name: int(text.split(" ", 1)[0]) for name, text in seen.items()}
    since = {name: ages[name] - ages["pod-1"] for name in ages}
    # pod-3: 300 s lock timeout, a heartbeat every 10 s, stale past 20 s.
    assert since == {"pod-1": 0, "pod-2": 1, "pod-3": 4, "pod-4": 25}
    assert (
        "replicas disagree on lock_timeout: 30s (pod-1, pod-2, pod-4); 300s (pod-3)" in shown.text
    )
    assert "disagree on tick" not in shown.text
    held = read(page.get(shown.links["gateways/gw-held"]))  # the step it runs, opened
    assert held.field("lockedBy") == "pod-2"
    # The replicas' own collection is no collection of documents to open.
    finder = read(page.get("/ops/document"))
    assert "orchestrator.replicas" not in finder.text
    assert "gateways" in finder.text


def test_links_and_forms_stay_under_the_mount_point(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    for response in (
        page.get("/ops/"),
        page.get("/ops/document", params={"c": "gateways", "id": "gw-broken"}),
        page.get("/ops/confirm", params={"action": "retry", "c": "gateways", "id": "gw-broken"}),
    ):
        shown = read(response)
        targets = list(shown.links.values()) + [action for _, action, _ in shown.forms]
        assert targets
        assert all(target.startswith("/ops/") for target in targets), targets
    overview = read(page.get("/ops/"))
    assert read(page.get(overview.links["gw-broken"])).field("phase") == "Failed"


def test_a_document_page_shows_its_lease_judged_as_the_counts_judge_it(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    states = {
        "gw-held": "leased",
        "gw-stuck": "overdue",
        "gw-waiting": "waiting",
        "gw-1": "free",  # done: in Ready, which no handler takes (the note says so)
        "gw-broken": "failed",  # its handler gave up on it
    }
    for doc_id, state in states.items():
        shown = open_document(page, doc_id)
        assert shown.text_of("lease-state") == state, (doc_id, shown.text)
    # One word for a document no lease or wait holds, as the command line and the JSON
    # API say it; one at rest (no handler takes its phase) does not reload itself.
    answer = page.get("/ops/api/document", params={"c": "gateways", "id": "gw-1"}).json()
    assert answer["row"]["state"] == "free"
    assert "it rests there" in open_document(page, "gw-1").text_of("lease-note")
    assert 'http-equiv="refresh"' not in page.get("/ops/document?c=gateways&id=gw-1").text
    assert 'http-equiv="refresh"' in page.get("/ops/document?c=gateways&id=gw-held").text
    held = open_document(page, "gw-held")
    assert held.field("lockedBy") == "pod-2"
    assert held.field("lockToken") == "live-token"
    assert "(in " in held.field("lockedUntil")  # ahead of the server's time
    broken = open_document(page, "gw-broken")
    assert broken.field("phase") == "Failed"
    assert broken.field("attempts") == "1"
    # The mark names the handler that gave up, by its module:function name: no lease
    # holds the document, so no "Unlock…" is offered as if that would let it run.
    provision = "tests.operator_page:seed.<locals>.provision"
    assert broken.field("failedBy") == f'{provision} (mark gateways {{"phase": "Provisioning"}})'
    assert broken.text_of("lease-note") == f"{provision} gave up; it stays here until retried"
    assert "Unlock…" not in broken.links
    assert {"Retry…", "Cancel…"} <= set(broken.links)
    assert "released" in broken.field("lockedUntil")
    error = dict(row[:2] for row in broken.tables["last-error"])
    assert error["type"] == "RuntimeError"
    assert error["message"].startswith("certificate authority unreachable")
    assert error["phase"] == "Provisioning"
    assert '"region": "eu-west-1"' in broken.text


def test_every_value_taken_from_a_document_is_escaped(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    now = seeded.orch.clock.now()
    db.gateways.insert_one(
        {
            "_id": XSS,
            "phase": XSS,
            "lockedBy": XSS,
            "lockToken": XSS,
            "failedBy": XSS,
            "lastError": {"type": XSS, "message": XSS, "at": now, "phase": XSS},
            "previousError": {"type": XSS, "message": XSS, "at": now, "phase": XSS},
            XSS: XSS,
            "nested": {"deep": [XSS]},
        }
    )
    [hostile] = replica_records(now)[:1]
    Store(db).record_replica(
        replace(
            hostile,
            replica_id=XSS,
            host=XSS,
            engine=XSS,
            version=XSS,
            steps=(RunningStep("gateways", XSS, XSS, now),),
        )
    )
    pages = {
        "overview": page.get("/ops/"),
        "document": page.get("/ops/document", params={"c": "gateways", "id": XSS}),
        "confirm unlock": page.get(
            "/ops/confirm", params={"action": "unlock", "c": "gateways", "id": XSS}
        ),
        "confirm retry": page.get(
            "/ops/confirm", params={"action": "retry", "c": "gateways", "id": XSS}
        ),
    }
    for name, response in pages.items():
        assert response.status_code == 200, name
        assert "<script" not in response.text, name
        assert "<img" not in response.text, name
        assert "&lt;script&gt;" in response.text, name
        assert "script-src" not in response.headers["content-security-policy"]  # default: none
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        shown = Page(response.text)
        assert XSS in shown.text, name  # shown to the operator as the text it is
    document = Page(pages["document"].text)
    assert document.field("lockedBy") == XSS
    replica = Page(pages["overview"].text).rows("replicas")[0]
    assert replica[:2] == [XSS, XSS]
    assert replica[10].startswith(f"gateways/{XSS} ({XSS}, for")
    # The hostile values round-trip through the confirmation form unchanged: the retry
    # applies to that document and no other.
    target, fields = confirm(page, "retry", XSS)
    fields["phase"] = "Provisioning"
    done = page.post(target, data=fields)
    assert read(done).field("phase") == "Provisioning"
    assert db.gateways.find_one({"_id": XSS})["phase"] == "Provisioning"


@pytest.mark.parametrize("doc_id", [ObjectId("65a1b2c3d4e5f60718293a4b"), 42, {"tenant": "a"}])
def test_documents_whose_ids_are_not_strings_are_opened_and_retried(
    doc_id: Any, db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    error = {"type": "RuntimeError", "message": "boom", "phase": "Provisioning"}
    error["at"] = seeded.orch.clock.now()
    db.gateways.insert_one({"_id": doc_id, "phase": "Failed", "attempts": 1, "lastError": error})
    shown = read(page.get("/ops/"))
    if not isinstance(doc_id, dict):  # an embedded document id has no typed form to show
        assert read(page.get(shown.links[str(doc_id)])).field("phase") == "Failed"
    assert any(row[1] == str(doc_id) for row in shown.rows("errors"))
    document = read(page.get("/ops/document", params=_ref(doc_id)))
    target, fields = next(
        (form[1], form[2])
        for form in read(page.get(document.links["Retry…"])).forms
        if form[0] == "post"
    )
    assert read(page.post(target, data=fields)).field("phase") == "Provisioning"
    assert db.gateways.find_one({"_id": doc_id})["phase"] == "Provisioning"


def _ref(doc_id: Any) -> dict[str, str]:
    return {"c": "gateways", "ref": json_util.dumps(doc_id, json_options=CANONICAL_JSON_OPTIONS)}


def test_retry_through_the_confirmation_sends_a_failed_document_on(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    target, fields = confirm(page, "retry", "gw-broken")
    assert target == "/ops/retry"
    assert fields["phase"] == "Provisioning"  # the phase of its last error, offered
    assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"  # nothing yet

    shown = read(page.post(target, data=fields))
    assert "Retried" in shown.text
    assert shown.field("phase") == "Provisioning"
    assert shown.field("attempts") == "0"
    assert "last attempt did not fail" in shown.text
    doc = db.gateways.find_one({"_id": "gw-broken"})
    assert "failedBy" not in doc
    assert doc["previousError"]["message"].startswith("certificate authority")

    seeded.outage["on"] = False
    seeded.orch.run_once()
    assert open_document(page, "gw-broken").field("phase") == "Ready"


def test_unlock_through_the_confirmation_frees_a_held_lease(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    target, fields = confirm(page, "unlock", "gw-held")
    assert target == "/ops/unlock"
    shown = read(page.post(target, data=fields))
    assert "Unlocked" in shown.text
    assert "free" in shown.text.split()
    assert shown.field("lockToken") == "-"
    doc = db.gateways.find_one({"_id": "gw-held"})
    assert "lockToken" not in doc
    assert doc["lockedUntil"] == EPOCH
    assert seeded.orch.run_once().get("advanced") == 2  # it, and the overdue gw-stuck


@pytest.mark.parametrize("action", ["unlock", "retry"])
def test_an_action_is_applied_only_to_the_state_that_was_confirmed(
    action: str, db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    doc_id = "gw-held" if action == "unlock" else "gw-broken"
    target, fields = confirm(page, action, doc_id)
    fields.setdefault("phase", "Provisioning")
    # Meanwhile the lease changed hands (unlock) or the application moved the document.
    change = {"lockToken": "next-holder"} if action == "unlock" else {"phase": "Cancelled"}
    db.gateways.update_one({"_id": doc_id}, {"$set": change})
    before = db.gateways.find_one({"_id": doc_id})

    refused = read(page.post(target, data=fields), 409)
    assert "changed since you confirmed" in refused.text
    assert db.gateways.find_one({"_id": doc_id}) == before


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ],
)
def test_a_cross_site_post_is_refused(
    headers: dict[str, str], db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    target, fields = confirm(page, "retry", "gw-broken")
    refused = read(page.post(target, data=fields, headers=headers), 403)
    assert "cross-site" in refused.text
    assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"

    same_origin = {"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"}
    assert read(page.post(target, data=fields, headers=same_origin)).field("phase") == (
        "Provisioning"
    )


def test_actions_are_posts_only(db: Database[Any], clock: FakeClock, page: TestClient) -> None:
    seed(db, clock)
    target, fields = confirm(page, "unlock", "gw-held")
    assert page.get(target, params=fields).status_code == 405
    assert db.gateways.find_one({"_id": "gw-held"})["lockToken"] == "live-token"


def test_bad_requests_get_a_page_that_says_why(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    _, fields = confirm(page, "retry", "gw-broken")
    cases: list[tuple[httpx.Response, int, str]] = [
        (page.get("/ops/document", params={"c": "nope", "id": "x"}), 404, "no collection 'nope'"),
        (page.get("/ops/document", params={"c": "gateways", "id": "x"}), 404, "no document"),
        (page.get("/ops/document", params={"c": "gateways", "ref": "{"}), 400, "malformed"),
        (page.get("/ops/confirm", params={"action": "drop", "c": "gateways"}), 400, "unknown"),
        (page.post("/ops/retry", data={**fields, "phase": "$set"}), 400, "not a phase name"),
        (page.post("/ops/retry", data={**fields, "phase": " "}), 400, "name the phase"),
        (page.post("/ops/retry", data={**fields, "seen": "[]"}), 400, "not a document"),
        (page.post("/ops/unlock", data={"c": "gateways"}), 400, "no document reference"),
        (page.post("/ops/unlock", json=fields), 415, "form post"),
        (page.post("/ops/unlock", data={"c": "x" * 20_000}), 413, "at most"),
    ]
    for response, status, needle in cases:
        shown = read(response, status)
        assert needle in shown.text, (status, needle, shown.text)
        assert "Traceback" not in response.text
    assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"


def test_the_page_sits_behind_the_applications_own_authentication(clock: FakeClock) -> None:
    """Mounted, the page is wrapped by the application's middleware: its auth decides."""

    class OperatorsOnly(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
            if request.headers.get("authorization") != "Bearer operator":
                return PlainTextResponse("operators only", status_code=401)
            return await call_next(request)

    db = memory_database(clock=clock)
    seed(db, clock)
    app = FastAPI()
    app.add_middleware(OperatorsOnly)
    app.mount("/ops", operator_app(async_view(db), read_only=False))
    with TestClient(app) as test_client:
        target, fields = confirm_as(test_client, {"authorization": "Bearer operator"})
        assert test_client.get("/ops/").status_code == 401
        assert test_client.post(target, data=fields).status_code == 401
        assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"
        shown = test_client.post(target, data=fields, headers={"authorization": "Bearer operator"})
        assert read(shown).field("phase") == "Provisioning"


def confirm_as(client: TestClient, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
    params = {"action": "retry", "c": "gateways", "id": "gw-broken"}
    shown = read(client.get("/ops/confirm", params=params, headers=headers))
    [(_, target, fields)] = [form for form in shown.forms if form[0] == "post"]
    return target, fields


def test_a_server_without_a_clock_is_said_on_the_page(clock: FakeClock) -> None:
    db = memory_database(clock=clock, server_time=False)
    db.gateways.insert_one({"_id": "gw-1", "phase": "Ready"})
    app = FastAPI()
    app.mount("/ops", operator_app(async_view(db)))
    with TestClient(app) as test_client:
        shown = read(test_client.get("/ops/"))
    assert "The server reports no time" in shown.text
    assert ["gateways", "Ready", "1", "0", "0", "0", "0", "0"] in shown.rows("counts")


def test_a_database_that_does_not_answer_is_a_503_page() -> None:
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        "mongodb://127.0.0.1:1/", serverSelectionTimeoutMS=100, connectTimeoutMS=100
    )
    app = FastAPI()
    app.mount("/ops", operator_app(client["platform"]))
    with TestClient(app) as test_client:
        shown = read(test_client.get("/ops/"), 503)
        test_client.portal.call(client.close)  # type: ignore[union-attr]
    assert "the database did not answer" in shown.text


@pytest.mark.parametrize(
    "options", [{"refresh": 0}, {"refresh": float("nan")}, {"errors": -1}, {"errors": True}]
)
def test_operator_app_refuses_bad_settings(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        operator_app(async_view(memory_database()), **options)


def test_operator_app_refuses_a_sync_database_at_once() -> None:
    # A sync database would serve nothing but errors, one per request: refused up front.
    with pytest.raises(ConfigError, match="needs an AsyncDatabase"):
        operator_app(memory_database())  # type: ignore[arg-type]


# -- orchestrator web ----------------------------------------------------------------------


def test_orchestrator_web_serves_the_page_until_interrupted(
    db: Database[Any],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The whole command: bind, connect, serve, Ctrl-C. The page is fetched over HTTP by
    a thread; the main thread runs the command, as a terminal does, and gets SIGINT."""
    seed(db, clock)
    uri = MONGODB_URI or "mongodb://ops:pw@db.internal/platform"
    if isinstance(db, MemoryDatabase):  # no URI reaches it: the command is given its view

        async def connect_memory(uri: str, database: str | None, *, timeout: float) -> Any:
            return async_view(db)

        monkeypatch.setattr(web_serve, "connect_async", connect_memory)
    fetched: dict[str, httpx.Response] = {}
    serving = running._serving

    def fetch_then_interrupt(url: str, database: str, loopback: bool, *, read_only: bool) -> None:
        serving(url, database, loopback, read_only=read_only)

        def visit() -> None:
            try:
                fetched["page"] = httpx.get(url, timeout=30)
            finally:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, once the server has answered

        threading.Thread(target=visit, daemon=True).start()

    monkeypatch.setattr(running, "_serving", fetch_then_interrupt)
    # Ctrl-C as a terminal delivers it: a process started in the background (a CI runner's
    # `cmd &`) inherits SIGINT ignored, and then no Ctrl-C could reach the command at all.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = cli.main(["web", "--uri", uri, "--db", db.name, "--port", "0"])
    finally:
        signal.signal(signal.SIGINT, inherited)
    out, err = capsys.readouterr()
    assert code == 130
    assert "interrupted" in err
    url = out.split(" at ", 1)[1].split()[0]
    assert urlsplit(url).hostname == "127.0.0.1"
    shown = read(fetched["page"])
    assert ["gateways", "Failed", "1", "0", "0", "0", "0", "1"] in shown.rows("counts")
    assert "Pause handler…" in shown.links  # served for the operator who runs it: they act


def test_orchestrator_web_refuses_bad_input_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    busy = socket.create_server(("127.0.0.1", 0))
    port = busy.getsockname()[1]
    cases = [
        (["web"], "MONGODB_URI"),
        (["web", "--uri", "mongodb://127.0.0.1:1/x", "--port", "70000"], "--port"),
        (["web", "--uri", "mongodb://127.0.0.1:1/x", "--refresh", "0"], "--refresh"),
        (["web", "--uri", "notauri"], "--uri"),
        (["web", "--uri", "mongodb://127.0.0.1:1/x", "--port", str(port)], "cannot listen"),
        (["web", "--uri", "mongodb://127.0.0.1:1/x", "--host", "no.such.host.invalid"], "listen"),
        (
            [
                "web",
                "--uri",
                "mongodb://ops:hunter2@127.0.0.1:1/x",
                "--port",
                "0",
                "--connect-timeout",
                "0.3",
            ],
            "cannot reach MongoDB",
        ),
    ]
    try:
        for argv, needle in cases:
            code = cli.main(argv)
            out, err = capsys.readouterr()
            assert code == 2, argv
            assert "Traceback" not in err
            [line] = err.strip().splitlines()
            assert needle in line, (argv, line)
            assert "hunter2" not in out + err
    finally:
        busy.close()


# -- actions on the lease the operator saw; ids and stored values exactly -------------------


@pytest.mark.anyio
async def test_a_retry_confirmed_on_a_free_document_is_refused_once_a_replica_claims_it(
    replicas: MakeEither, db: Database[Any], page: TestClient
) -> None:
    """The confirmation form carries the lease the operator saw (none): a replica that
    claims the document before the POST keeps its lease, and runs its step alone."""
    replica = await replicas("pod-2")
    box = hold(replica)
    await replica.submit("jobs", {"_id": "job-1", "phase": "Running"})
    params = {"action": "retry", "c": "jobs", "id": "job-1"}
    shown = read(await anyio.to_thread.run_sync(partial(page.get, "/ops/confirm", params=params)))
    [(_, target, fields)] = [form for form in shown.forms if form[0] == "post"]
    assert "lockToken" not in db.jobs.find_one({"_id": "job-1"})  # confirmed free
    fields["phase"] = "Running"
    fields["any_phase"] = "yes"  # this replica publishes no record of its handlers
    async with anyio.create_task_group() as group:
        group.start_soon(replica.run_once)
        assert await wait(box["claimed"])
        held = db.jobs.find_one({"_id": "job-1"})
        assert held["lockToken"] is not None
        response = await anyio.to_thread.run_sync(partial(page.post, target, data=fields))
        refused = read(response, 409)
        assert "changed since you confirmed" in refused.text
        assert db.jobs.find_one({"_id": "job-1"}) == held  # the live lease untouched
        box["go"].set()
    assert "lost" not in box  # its step went on under its own lease, to the end
    assert db.jobs.find_one({"_id": "job-1"})["phase"] == "Done"


def test_the_confirmation_of_a_retry_says_a_replica_holds_the_document(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    shown = read(
        page.get("/ops/confirm", params={"action": "retry", "c": "gateways", "id": "gw-held"})
    )
    assert "A replica holds it now" in shown.text
    assert "pod-2" in shown.text
    free = read(page.get("/ops/confirm", params={"action": "retry", "c": "gateways", "id": "gw-1"}))
    assert "A replica holds it now" not in free.text


IDS: list[Any] = [
    "gw-1 ",
    "gw-1",
    "42",
    42,
    42.5,
    {"tenant": "a"},
    datetime(2026, 1, 1, 12, 0),
    b"\x00\xff",
    ObjectId("65a1b2c3d4e5f60718293a4b"),
    "65a1b2c3d4e5f60718293a4b",
]


def test_the_pages_links_name_each_document_exactly_whatever_its_id(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    """Ids that read alike as text (``"42"`` and ``42``, ``"gw-1 "`` and ``"gw-1"``) and
    ids with no typed form (embedded document, float, date, binary): each error's link
    opens that document, and the retry confirmed there acts on it and no other."""
    base = datetime(2026, 1, 1)
    db.gateways.insert_many(
        {
            "_id": doc_id,
            "phase": "Failed",
            "attempts": 1,
            "lastError": {
                "type": "RuntimeError",
                "message": f"boom {n}",
                "phase": "Provisioning",
                "at": base + timedelta(seconds=n),
            },
        }
        for n, doc_id in enumerate(IDS)
    )
    for latest in reversed(range(len(IDS))):  # the latest error first
        overview = read(page.get("/ops/"))
        [link] = overview.row_links["errors"][1]
        document = read(page.get(link))
        assert f"boom {latest}" in document.text
        confirmation = read(page.get(document.links["Retry…"]))
        [(_, target, fields)] = [f for f in confirmation.forms if f[0] == "post"]
        fields["any_phase"] = "yes"  # no replica runs here: sent where none handles it
        assert read(page.post(target, data=fields)).field("phase") == "Provisioning"
        phases = [db.gateways.find_one({"_id": {"$eq": i}})["phase"] for i in IDS]
        assert phases == ["Failed"] * latest + ["Provisioning"] * (len(IDS) - latest)


def test_an_id_typed_as_text_that_names_two_documents_offers_both(
    db: Database[Any], page: TestClient
) -> None:
    db.gateways.insert_many([{"_id": "42", "phase": "Ready"}, {"_id": 42, "phase": "Failed"}])
    shown = read(page.get("/ops/document", params={"c": "gateways", "id": "42"}), 300)
    assert "names more than one document" in shown.text
    choices = {text: href for text, href in shown.links.items() if "(phase" in text}
    assert set(choices) == {'"42" (phase Ready)', '{"$numberInt": "42"} (phase Failed)'}
    assert read(page.get(choices['"42" (phase Ready)'])).field("phase") == "Ready"
    assert read(page.get(choices['{"$numberInt": "42"} (phase Failed)'])).field("phase") == (
        "Failed"
    )
    # Typed as it is: a trailing space is part of the id.
    db.gateways.insert_many(
        [{"_id": "gw-1 ", "phase": "Ready"}, {"_id": "gw-1", "phase": "Failed"}]
    )
    assert (
        read(page.get("/ops/document", params={"c": "gateways", "id": "gw-1 "})).field("phase")
        == "Ready"
    )


def test_a_last_error_that_is_no_document_is_shown_not_a_500(
    db: Database[Any], page: TestClient
) -> None:
    """A migrated application's own ``lastError``: the overview, the document and the
    confirmation show it as it is."""
    db.gateways.insert_one({"_id": "gw-old", "phase": "Failed", "lastError": "provider timeout"})
    [error] = read(page.get("/ops/")).rows("errors")
    assert error[:4] == ["gateways", "gw-old", "-", "Failed"]
    assert error[6] == "?: provider timeout"
    shown = open_document(page, "gw-old")
    assert dict(row[:2] for row in shown.tables["last-error"])["message"] == "provider timeout"
    read(page.get("/ops/confirm", params={"action": "retry", "c": "gateways", "id": "gw-old"}))


_KEYS = st.text(alphabet="abcxyz", min_size=1, max_size=4)
_DATES = st.datetimes().map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, fold=0))
"""As BSON stores dates: milliseconds, naive UTC."""
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
    st.text(max_size=12),
    _DATES,
    st.binary(max_size=6),
    st.builds(ObjectId),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=6,
)
_IDS = st.one_of(
    st.text(max_size=8),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    _DATES,
    st.binary(max_size=6),
    st.builds(ObjectId),
    st.dictionaries(_KEYS, _SCALARS.filter(lambda v: not (isinstance(v, float) and isnan(v)))),
)
_ERRORS = _VALUES | st.fixed_dictionaries(
    {}, optional=dict.fromkeys(("type", "message", "at", "phase"), _VALUES)
)
_FIELDS = dict.fromkeys(
    (
        "phase",
        "attempts",
        "relocks",
        "lockToken",
        "lockedAt",
        "lockedUntil",
        "lockedBy",
        "failedBy",
        "updatedAt",
        "createdAt",
        "orchestratorTrace",
    ),
    _VALUES,
)
_DOCUMENTS = st.fixed_dictionaries(
    {"_id": _IDS},
    optional={**_FIELDS, "lastError": _ERRORS, "previousError": _ERRORS, "region": _VALUES},
)


def test_every_view_shows_any_stored_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever the fields the views read hold (a string, a number, a list, a document, a
    date, null, or nothing): the overview, the document page, both confirmations, the
    status command (table and JSON) and the Prometheus collector show it, and every link
    to the document opens that document."""
    db = memory_database(clock=FakeClock())
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    monkeypatch.setenv("COLUMNS", "200")
    app = FastAPI()
    adb = async_view(db)
    # Each example changes the database between two reads: the report is never reused.
    app.mount(
        "/ops",
        operator_app(
            adb, status=AsyncStatusCache(AsyncOperations(adb), max_age=0), read_only=False
        ),
    )

    @settings(
        max_examples=60,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(doc=_DOCUMENTS)
    def views(doc: dict[str, Any]) -> None:
        db.gateways.delete_many({})  # not dropped: its indexes stay, as the page made them
        db.gateways.insert_one(doc)
        ref = json_util.dumps(doc["_id"], json_options=CANONICAL_JSON_OPTIONS)
        overview = read(client.get("/ops/"))
        pages = [client.get("/ops/document", params={"c": "gateways", "ref": ref})]
        pages += [link for row in overview.row_links.get("errors", [])[1:] for link in row]
        pages += [link for row in overview.row_links.get("counts", [])[1:] for link in row]
        for target in pages:
            shown = read(client.get(target) if isinstance(target, str) else target)
            for row in shown.row_links.get("documents", [])[1:]:  # a list: its documents
                pages.append(row[0])
            offered = [a for a in ("Unlock…", "Retry…", "Cancel…") if a in shown.links]
            assert offered or "/documents" in str(target)
            for action in offered:
                confirmation = read(client.get(shown.links[action]))
                [fields] = [f[2] for f in confirmation.forms if f[0] == "post"]
                assert fields["ref"] == ref, "the form names the document shown"
        api = client.get("/ops/api/document", params={"c": "gateways", "ref": ref})
        assert api.status_code == 200 and api.json()["ref"] == ref
        listed = client.get("/ops/api/documents", params={"c": "gateways"})
        named = isinstance(doc.get("phase"), str)  # browsing lists the phases by name
        assert [d["ref"] for d in listed.json()["documents"]] == ([ref] if named else [])

        code, out, err = run_cli(["status", "--uri", "mongodb://h/x"])
        assert code == 0 and "Traceback" not in err, err
        code, out, err = run_cli(["status", "--uri", "mongodb://h/x", "--json"])
        assert code == 0, err
        reported = json.loads(out)
        # Listed among the errors: an error (not null) in a phase that is a name.
        erring = doc.get("lastError") is not None and named
        assert [e["ref"] for e in reported["errors"]] == ([ref] if erring else [])

        registry = CollectorRegistry()
        registry.register(StatusCollector(db, timeout=30))
        assert registry.get_sample_value("orchestrator_status_up") == 1

    def run_cli(argv: list[str]) -> tuple[int, str, str]:
        code = cli.main(argv)
        out, err = capsys.readouterr()
        return code, out, err

    with TestClient(app) as client:
        views()
