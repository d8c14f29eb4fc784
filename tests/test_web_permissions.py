"""Who may act on the operator's page and its JSON API: the mounting application's
``permit`` (per request and ``WebAction``, sync or async) or the ``read_only`` shorthand,
read-only where it says nothing. What is not permitted is not offered, and refused when
posted anyway (403), logged and kept in the audit trail as refused; ``orchestrator web``
lets its operator act unless ``--read-only``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pymongo.database import Database
from starlette.requests import Request
from starlette.routing import Mount, Route

from orchestrator.cli import main as cli
from orchestrator.core.errors import ConfigError
from orchestrator.core.names import AUDIT_COLLECTION, PAUSES_COLLECTION, SCHEDULES_COLLECTION
from orchestrator.operations import Operations, Scope
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.web import WebAction, operator_app
from orchestrator.web import serve as web_serve
from tests.operator_page import Page, mounted, read, seed
from tests.test_web_schedules import scheduled

SEEN_FAILED = '{"phase": "Failed", "lockToken": null}'
ONE = {"c": "gateways", "ref": '"gw-broken"', "reason": "try it"}
FILTER = {"c": "gateways", "phase": "Provisioning", "reason": "try them"}
SCHEDULE = {"name": "every5", "reason": "try it"}

PAGE: dict[WebAction, tuple[str, dict[str, str]] | None] = {
    WebAction.RETRY: ("/retry", {**ONE, "seen": SEEN_FAILED, "phase": "Provisioning"}),
    WebAction.UNLOCK: ("/unlock", {**ONE, "seen": SEEN_FAILED}),
    WebAction.CANCEL: ("/cancel", {**ONE, "seen": SEEN_FAILED}),
    WebAction.SIGNAL: ("/signal", {**ONE, "name": "ping"}),
    WebAction.RETRY_ALL: ("/bulk", {**FILTER, "action": "retry"}),
    WebAction.UNLOCK_ALL: ("/bulk", {**FILTER, "action": "unlock"}),
    WebAction.CANCEL_ALL: ("/bulk", {**FILTER, "action": "cancel"}),
    WebAction.PAUSE: ("/pause", {"c": "gateways", "phase": "Provisioning", "reason": "x"}),
    WebAction.RESUME: ("/resume", {"c": "gateways", "reason": "x"}),
    WebAction.PAUSE_SCHEDULE: ("/schedule/act", {**SCHEDULE, "action": "pause"}),
    WebAction.RESUME_SCHEDULE: ("/schedule/act", {**SCHEDULE, "action": "resume"}),
    WebAction.TRIGGER_SCHEDULE: ("/schedule/act", {**SCHEDULE, "action": "trigger"}),
    WebAction.BACKFILL_SCHEDULE: None,  # the command line's and the API's only
}
"""Each action's POST on the page, as its confirmation's form sends it."""

API_ONE = {"c": "gateways", "ref": '"gw-broken"', "seen": {"phase": "Failed"}, "reason": "x"}
API_FILTER = {"c": "gateways", "filter": {"phase": "Provisioning"}, "reason": "x"}
DATES = {"from": {"$date": "2026-01-01T00:00:00Z"}, "to": {"$date": "2026-01-01T00:01:00Z"}}

API: dict[WebAction, tuple[str, dict[str, Any]]] = {
    WebAction.RETRY: ("/api/retry", API_ONE),
    WebAction.UNLOCK: ("/api/unlock", API_ONE),
    WebAction.CANCEL: ("/api/cancel", API_ONE),
    WebAction.SIGNAL: ("/api/signal", {"c": "gateways", "ref": '"gw-broken"', "name": "ping"}),
    WebAction.RETRY_ALL: ("/api/retry", API_FILTER),
    WebAction.UNLOCK_ALL: ("/api/unlock", API_FILTER),
    WebAction.CANCEL_ALL: ("/api/cancel", {**API_FILTER, "dry_run": True}),
    WebAction.PAUSE: ("/api/pause", {"c": "gateways", "phase": "Provisioning", "reason": "x"}),
    WebAction.RESUME: ("/api/resume", {"c": "gateways", "reason": "x"}),
    WebAction.PAUSE_SCHEDULE: ("/api/schedule/pause", SCHEDULE),
    WebAction.RESUME_SCHEDULE: ("/api/schedule/resume", SCHEDULE),
    WebAction.TRIGGER_SCHEDULE: ("/api/schedule/trigger", SCHEDULE),
    WebAction.BACKFILL_SCHEDULE: ("/api/schedule/backfill", {**SCHEDULE, **DATES}),
}
"""Each action's POST on the JSON API (a dry run is refused as its action is)."""

CONFIRMATIONS: dict[WebAction, str] = {
    WebAction.RETRY: "/confirm?action=retry&c=gateways&id=gw-broken",
    WebAction.UNLOCK: "/confirm?action=unlock&c=gateways&id=gw-held",
    WebAction.CANCEL: "/confirm?action=cancel&c=gateways&id=gw-broken",
    WebAction.SIGNAL: "/confirm?action=signal&c=gateways&id=gw-broken",
    WebAction.RETRY_ALL: "/bulk?action=retry&c=gateways",
    WebAction.UNLOCK_ALL: "/bulk?action=unlock&c=gateways",
    WebAction.CANCEL_ALL: "/bulk?action=cancel&c=gateways",
    WebAction.PAUSE: "/pause?c=gateways",
    WebAction.RESUME: "/resume?c=gateways",
    WebAction.PAUSE_SCHEDULE: "/schedule/act?action=pause&name=every5",
    WebAction.RESUME_SCHEDULE: "/schedule/act?action=resume&name=every5",
    WebAction.TRIGGER_SCHEDULE: "/schedule/act?action=trigger&name=every5",
}
"""Each action's confirmation page (a GET) on the page."""

ACTION_LINKS = {
    "Unlock…",
    "Retry…",
    "Cancel…",
    "Send signal…",
    "Retry all…",
    "Unlock all…",
    "Cancel all…",
    "Pause phase…",
    "Pause handler…",
    "Pause gateways…",
    "Resume…",
    "pause",
    "resume",
    "trigger",
}
"""The texts of the links to an action's confirmation, on every page that offers one."""


@pytest.fixture
def viewer(db: Database[Any]) -> Iterator[TestClient]:
    with mounted(db, read_only=True) as client:
        yield client


def everything(db: Database[Any]) -> dict[str, list[Any]]:
    """What an action could change: the documents, the pauses, the schedules."""
    names = ("gateways", PAUSES_COLLECTION, SCHEDULES_COLLECTION)
    return {name: list(db[name].find({}, sort=[("_id", 1)])) for name in names}


def offered(shown: Page) -> set[str]:
    return ACTION_LINKS & set(shown.links)


def pages(client: TestClient) -> list[Page]:
    """Every page that offers actions where actions are permitted."""
    urls = [
        "/ops/",
        "/ops/document?c=gateways&id=gw-broken",
        "/ops/document?c=gateways&id=gw-held",
        "/ops/documents?c=gateways",
        "/ops/schedule?name=every5",
    ]
    return [read(client.get(url)) for url in urls]


def test_every_action_route_of_the_page_and_the_api_is_checked_here() -> None:
    """A new action route (or ``WebAction``) without its row here fails this test, so the
    refusal test below covers it."""
    app = operator_app(async_view(memory_database()))
    posts = set()
    for route in app.routes:
        inner = route.routes if isinstance(route, Mount) else [route]
        prefix = route.path if isinstance(route, Mount) else ""
        posts |= {
            prefix + r.path for r in inner if isinstance(r, Route) and "POST" in (r.methods or ())
        }
    assert set(PAGE) == set(API) == set(WebAction)
    assert {sent[0] for sent in PAGE.values() if sent} | {path for path, _ in API.values()} == posts
    assert set(CONFIRMATIONS) == {action for action, sent in PAGE.items() if sent}


def test_a_read_only_viewer_sees_every_page_and_no_action(
    db: Database[Any], clock: FakeClock, viewer: TestClient
) -> None:
    seed(db, clock)
    scheduled(db, clock)
    Operations(db).pause(Scope("gateways", "Provisioning"), why="maintenance")
    shown = pages(viewer)
    assert all(not offered(page) for page in shown)
    assert "Read-only" in shown[1].text_of("read-only")
    assert "maintenance" in shown[0].text  # the pause is shown, its Resume… is not offered
    for action, url in CONFIRMATIONS.items():
        refused = read(viewer.get(f"/ops{url}"), 403)
        assert "lets you look, not take this action" in refused.text, action
        assert not [form for form in refused.forms if form[0] == "post"]
    assert db[AUDIT_COLLECTION].count_documents({"refused": {"$exists": True}}) == 0


@pytest.mark.parametrize("action", list(WebAction))
def test_a_read_only_viewer_is_refused_every_action_posted_and_the_refusal_is_audited(
    action: WebAction,
    db: Database[Any],
    clock: FakeClock,
    viewer: TestClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seed(db, clock)
    scheduled(db, clock)
    before = everything(db)
    sent = PAGE[action]
    if sent is not None:
        path, fields = sent
        refused = read(viewer.post(f"/ops{path}", data=fields), 403)
        assert "you may not" in refused.text
    path, body = API[action]
    with caplog.at_level(logging.WARNING, logger="orchestrator.web"):
        answer = viewer.post(f"/ops{path}", json=body)
    assert answer.status_code == 403
    assert answer.json()["kind"] == "Forbidden"
    assert everything(db) == before
    entries = Operations(db).audit()
    assert len(entries) == (2 if sent is not None else 1)
    for entry in entries:
        assert (entry.action, entry.by, entry.refused) == (
            action.value,
            "web testclient",
            "not permitted",
        )
        assert entry.count == 0
        if action in (WebAction.RETRY, WebAction.UNLOCK, WebAction.CANCEL, WebAction.SIGNAL):
            assert (entry.collection, entry.documents) == ("gateways", ('"gw-broken"',))
        elif action.value.endswith("_schedule"):
            assert (entry.collection, entry.documents) == (SCHEDULES_COLLECTION, ("every5",))
        else:
            assert entry.collection == "gateways"
            assert entry.scope.get("phase", "Provisioning") in ("Provisioning", "")
    assert f"refused {action.value} by web testclient" in caplog.text
    lines = [r for r in caplog.records if r.name == "orchestrator.web"]
    assert lines, "no refusal logged"
    for line in lines:  # structured too: what was refused, to whom
        assert (line.outcome, line.action, line.by) == ("refused", action.value, "web testclient")  # type: ignore[attr-defined]
    trail = read(viewer.get("/ops/audit"))
    assert "refused: not permitted" in trail.text_of("audit")
    assert viewer.get("/ops/api/audit").json()["entries"][0]["refused"] == "not permitted"


def only_retry(request: Request, action: WebAction) -> bool:
    return action is WebAction.RETRY


def test_a_permit_of_retry_alone_lets_one_retry_and_refuses_a_cancel(
    db: Database[Any], clock: FakeClock
) -> None:
    seed(db, clock)
    with mounted(db, permit=only_retry) as page:
        shown = read(page.get("/ops/document?c=gateways&id=gw-broken"))
        assert offered(shown) == {"Retry…"}
        assert not offered(read(page.get("/ops/documents?c=gateways")))
        read(page.get("/ops/confirm?action=cancel&c=gateways&id=gw-broken"), 403)
        confirm = read(page.get(shown.links["Retry…"]))
        [(_, target, fields)] = [form for form in confirm.forms if form[0] == "post"]
        cancel = page.post("/ops/cancel", data={**fields, "reason": "no"})
        assert cancel.status_code == 403
        done = read(page.post(target, data={**fields, "reason": "CA is back"}))
        assert done.field("phase") == "Provisioning"
        api_cancel = page.post("/ops/api/cancel", json={**API_ONE, "seen": {"phase": "Ready"}})
        assert api_cancel.status_code == 403
        retry_all = page.post("/ops/api/retry", json=API_FILTER)
        assert retry_all.status_code == 403
    actions = [(e.action, e.refused) for e in Operations(db).audit()]
    assert actions == [
        ("retry_all", "not permitted"),
        ("cancel", "not permitted"),
        ("retry", None),
        ("cancel", "not permitted"),
    ]


def test_an_async_permit_decides_per_request(db: Database[Any], clock: FakeClock) -> None:
    seed(db, clock)

    async def operators(request: Request, action: WebAction) -> bool:
        return request.headers.get("x-user") == "alice"

    alice, bob = {"x-user": "alice"}, {"x-user": "bob"}
    with mounted(db, permit=operators) as page:
        offers = read(page.get("/ops/document?c=gateways&id=gw-broken", headers=alice))
        assert offered(offers) == {"Retry…", "Cancel…", "Send signal…"}
        refused = page.post("/ops/api/retry", json=API_ONE, headers=bob)
        assert refused.status_code == 403
        retried = page.post("/ops/api/retry", json=API_ONE, headers=alice)
        assert retried.status_code == 200, retried.text
    assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Provisioning"


def test_a_page_mounted_without_a_word_on_who_may_act_is_read_only(
    db: Database[Any], clock: FakeClock
) -> None:
    seed(db, clock)
    scheduled(db, clock)
    with mounted(db, read_only=None) as page:
        assert all(not offered(shown) for shown in pages(page))
        read(page.post("/ops/retry", data=PAGE[WebAction.RETRY][1]), 403)  # type: ignore[index]
        assert page.post("/ops/api/retry", json=API_ONE).status_code == 403
    assert db.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"
    assert len(Operations(db).audit()) == 2


def test_read_only_false_lets_everyone_act(db: Database[Any], clock: FakeClock) -> None:
    seed(db, clock)
    with mounted(db, read_only=False) as page:
        shown = read(page.get("/ops/document?c=gateways&id=gw-broken"))
        assert offered(shown) == {"Retry…", "Cancel…", "Send signal…"}
        assert page.post("/ops/api/retry", json=API_ONE).status_code == 200


@pytest.mark.parametrize(
    "options",
    [
        {"permit": only_retry, "read_only": True},
        {"permit": only_retry, "read_only": False},
        {"permit": "operators"},
        {"read_only": "no"},
    ],
)
def test_operator_app_refuses_an_unclear_permission(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        operator_app(async_view(memory_database()), **options)


@pytest.mark.parametrize(("flag", "read_only"), [([], False), (["--read-only"], True)])
def test_orchestrator_web_lets_its_operator_act_unless_read_only(
    flag: list[str], read_only: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    given: list[web_serve.WebOptions] = []
    monkeypatch.setattr(web_serve, "serve", lambda options, ready: given.append(options))
    assert cli.main(["web", "--uri", "mongodb://db.internal/platform", *flag]) == 0
    assert [options.read_only for options in given] == [read_only]
