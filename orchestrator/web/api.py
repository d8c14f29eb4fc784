"""The page's JSON API, mounted under ``/api`` of the same app (behind the same
authentication, acting as the same ``actor``), for scripts and other tools. It reads and
acts through ``orchestrator.operations`` as the page and the command line do.

Reads (GET):

- ``/api/status``: the status report (``Status.to_dict()``, with ``handler_names``), from
  the page's cache: at most one aggregation per ``refresh`` seconds.
- ``/api/documents?c=&phase=&state=&error=&key=&after=&limit=``: a page of the
  documents a filter selects (the browser's filters, ``inputs``), as ``Page.to_dict()``:
  ``documents``, ``next`` (pass it as ``after`` for the next page), ``index``.
- ``/api/document?c=&ref=`` (or ``id=``, an id or business key as typed): the document's
  fields as relaxed Extended JSON, its lease state (``row``, ``badge``), ``seen`` (what
  an action on it posts back), its ``history``, and its ``tree`` (``Tree.to_dict()``:
  its parent, its children with their phase and whether they ended, what it waits for
  in words and fields, its inbox of signals with their payloads shortened and redacted).
- ``/api/audit?limit=&key=``: the audit trail, latest first (each entry's ``documents``
  with their business ``keys``; ``key``: only those naming that business key);
  ``/api/pauses``: the pauses in force, each with the live replicas that honour it and
  those that do not yet.
- ``/api/schedules``: every schedule (``ScheduleRow.to_dict()``); ``/api/schedule?name=
  &runs=``: one, with its latest ``runs`` (``ScheduleRun.to_dict()``).

Actions (POST, ``Content-Type: application/json``, a JSON object):

- ``/api/retry``, ``/api/unlock``, ``/api/cancel``: one document, ``{"c", "ref",
  "seen", "reason"}`` (``ref`` and ``seen`` as ``/api/document`` gives them: applied only
  while the document is still so), or every document of a filter, ``{"c", "filter":
  {"phase", "state", "error", "key"}, "dry_run", "reason"}``; ``to`` (retry, cancel: the
  phase), ``force`` (retry: take a live lease), ``any_phase`` (retry, cancel: a phase no
  live replica handles), ``children`` (cancel: ``"cancel"``, the default, or ``"abandon"``
  the documents each owns; the answer's ``cascade`` says what was done to them).
- ``/api/signal``: ``{"c", "ref", "name", "payload", "reason"}``: the signal ``name``
  (``payload``: any JSON, Extended JSON read) sent to the document, as a replica sends it;
  the answer's ``woke`` says whether it waited for it (then due at once, for the
  replicas' next tick).
- ``/api/pause``, ``/api/resume``: ``{"c", "phase", "handler", "reason"}``; a pause of
  what no live replica has (a collection, phase or handler) is refused (422,
  ``UnhandledScope``, with ``known``) unless ``"force": true``.
- ``/api/schedule/pause``, ``/resume``, ``/trigger``: ``{"name", "reason"}``;
  ``/api/schedule/backfill``: ``{"name", "reason", "from", "to"}`` (dates as
  ``{"$date": "2026-01-01T00:00:00Z"}``).

Each action is first put to the mounting application's ``permit`` (``operator_app``): one
not permitted is answered 403 (``kind``: ``Forbidden``), logged and kept in the audit trail
as refused, a dry run too (it is the action's confirmation).

Errors are ``{"error": message, "kind": name}``: 400 malformed, 403 cross-site or not
permitted, 404 no such collection, document or schedule, 409 the document changed (or a
live lease holds it, or an id names two: ``documents`` lists them), 415 not JSON, 422
refused as asked (a phase no live replica handles, with ``handled``; a pause of what none
has, with ``known``; no error phase to retry to; a filter no index serves), 503 the
database did not answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import RELAXED_JSON_OPTIONS
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.core.history import HISTORY_FIELD, latest_first
from orchestrator.operations import (
    Action,
    AmbiguousId,
    Children,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    Moved,
    NoErrorPhase,
    OperatorError,
    Refusal,
    Row,
    Scope,
    UnhandledPhase,
    UnhandledScope,
    UnindexedField,
    error_phase,
    id_json,
)
from orchestrator.operations.filters import DEFAULT_LIMIT, MAX_LIMIT
from orchestrator.operations.schedule_report import MAX_RUNS
from orchestrator.web.browse import selection_of
from orchestrator.web.inputs import Refused, Selection, json_body, named, parse_ref
from orchestrator.web.permits import WebAction
from orchestrator.web.site import SECURITY_HEADERS, Site
from orchestrator.web.views import Fleet

__all__ = ["routes"]

ONE = frozenset({"c", "ref", "seen", "to", "force", "any_phase", "children", "reason"})
MANY = frozenset({"c", "filter", "dry_run", "to", "force", "any_phase", "children", "reason"})
SIGNAL = frozenset({"c", "ref", "name", "payload", "reason"})
PAUSE = frozenset({"c", "phase", "handler", "force", "reason"})
SCHEDULE = frozenset({"name", "reason"})
SCHEDULE_ACTIONS = ("pause", "resume", "trigger", "backfill")
BACKFILL = frozenset({"name", "reason", "from", "to"})

Endpoint = Callable[[Site, Request], Awaitable[Any]]


def routes(site: Site) -> list[Route]:
    def get(path: str, handler: Endpoint) -> Route:
        return Route(path, _json(site, handler))

    def post(path: str, handler: Endpoint) -> Route:
        return Route(path, _json(site, handler), methods=["POST"])

    return [
        get("/status", status),
        get("/documents", documents),
        get("/document", document),
        get("/audit", audit),
        get("/pauses", pauses),
        *(post(f"/{a.value}", partial(act, a)) for a in Action),
        post("/signal", signal),
        post("/pause", partial(pause, True)),
        post("/resume", partial(pause, False)),
        get("/schedules", schedules),
        get("/schedule", schedule),
        *(post(f"/schedule/{verb}", partial(schedule_act, verb)) for verb in SCHEDULE_ACTIONS),
    ]


def _json(site: Site, handler: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """``handler``'s result as JSON, its failures as ``{"error", "kind"}`` with a status."""

    async def respond(request: Request) -> Response:
        try:
            response: Response = JSONResponse(await handler(site, request))
        except Exception as exc:
            failed = _failure(exc)
            if failed is None:
                raise
            code, body = failed
            response = JSONResponse(body, status_code=code)
        response.headers.update(SECURITY_HEADERS)
        return response

    return respond


def _failure(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """The status and body of a failure, or None for a bug (raised: a 500)."""
    body: dict[str, Any] = {"error": str(exc), "kind": type(exc).__name__}
    if isinstance(exc, Refused):
        body["kind"] = exc.kind
        return exc.status, body
    if isinstance(exc, AmbiguousId):
        body["documents"] = [id_json(d["_id"]) for d in exc.documents]
        return 409, body
    if isinstance(exc, UnhandledPhase):
        body["handled"] = exc.handled
    if isinstance(exc, UnhandledScope):
        body["error"] = f"{exc}; send force: true to pause it all the same"
        body["known"] = exc.known
    if isinstance(exc, OperatorError) and exc.refusal is Refusal.NOT_FOUND:
        return 404, body  # an unknown schedule too
    for kinds, code in (
        (DocumentNotFound, 404),
        ((DocumentChanged, LeaseHeld), 409),
        ((NoErrorPhase, UnindexedField, UnhandledPhase, UnhandledScope), 422),
        ((OperatorError, ConfigError), 400),
        (StoreError, 503),
    ):
        if isinstance(exc, kinds):
            return code, body
    return None


# -- reads ----------------------------------------------------------------------------------


async def status(site: Site, request: Request) -> dict[str, Any]:
    report = await site.status()
    return {**report.to_dict(), "handler_names": report.handler_names}


async def documents(site: Site, request: Request) -> dict[str, Any]:
    selection = selection_of(request)
    await site.collection(selection.collection)
    limit = _integer(request.query_params.get("limit"), DEFAULT_LIMIT, MAX_LIMIT, "limit")
    query = await selection.resolve(site.operations)
    after = request.query_params.get("after") or None
    page = await site.operations.browse(query, after=after, limit=limit)
    return {"filter": query.describe(), **page.to_dict()}


async def document(site: Site, request: Request) -> dict[str, Any]:
    collection, doc = await site.locate(request.query_params)
    fleet_at = await site.operations.now()
    fleet = replace(Fleet.of(await site.status()), at=fleet_at)
    row = Row.read(doc, fleet_at, fleet.keys(collection), fleet.names(), fleet.in_house())
    badge = fleet.badge(collection, row)
    fields = {name: value for name, value in doc.items() if name != HISTORY_FIELD}
    seen = {"phase": doc.get("phase"), "lockToken": doc.get("lockToken")}
    tree = await site.operations.tree(collection, doc, replicas=fleet.replicas)
    return {
        "collection": collection,
        "ref": id_json(doc["_id"]),
        "row": row.to_dict(),
        "badge": {"state": badge.name, "note": badge.note},
        "seen": _relaxed(seen),
        "document": _relaxed(fields),
        "history": [entry.to_dict() for entry in latest_first(doc)],
        "tree": tree.to_dict(),
    }


async def audit(site: Site, request: Request) -> dict[str, Any]:
    limit = _integer(request.query_params.get("limit"), 50, 1000, "limit")
    key = request.query_params.get("key", "").strip() or None
    trail = await site.operations.audit(limit, key=key)
    return {"entries": [entry.to_dict() for entry in trail]}


async def pauses(site: Site, request: Request) -> dict[str, Any]:
    fleet = Fleet.of(await site.status())
    shown = []
    for found in await site.operations.pauses():
        yes, not_yet = fleet.honour(found)
        shown.append({**found.to_dict(), "honoured_by": yes, "not_yet": not_yet})
    return {"pauses": shown}


# -- actions --------------------------------------------------------------------------------


async def act(action: Action, site: Site, request: Request) -> dict[str, Any]:
    """One document (``ref`` and ``seen``), or every document of ``filter``."""
    body = await json_body(request)
    bulk = "filter" in body
    if bulk:
        scope = body["filter"] if isinstance(body["filter"], Mapping) else {}
        await _allow(site, request, WebAction.every(action), body, scope=scope)
    else:
        await _allow(site, request, WebAction.one(action), body, documents=named(body.get("ref")))
    _only(body, MANY if bulk else ONE)
    collection = await site.collection(_text(body, "c"))
    to = _text(body, "to") or None
    force, any_phase = _flag(body, "force"), _flag(body, "any_phase")
    why = _text(body, "reason")
    by = site.actor(request)
    children = _text(body, "children") or Children.CANCEL  # refused by Operations if neither
    if action is Action.UNLOCK and (to is not None or any_phase):
        raise Refused(400, "an unlock leaves the document in its phase: no to, no any_phase")
    if action is not Action.CANCEL and "children" in body:
        raise Refused(400, "children is a cancel's: what becomes of the documents it owns")
    if bulk:
        selection = Selection.from_json(collection, body["filter"])
        result = await site.operations.bulk(
            action,
            await selection.resolve(site.operations),
            dry_run=_flag(body, "dry_run"),
            to=to,
            force=force,
            any_phase=any_phase,
            children=children,
            by=by,
            why=why,
        )
        if not result.dry_run:
            site.changed()
        return result.to_dict()
    doc_id = parse_ref(_text(body, "ref"))
    seen = body.get("seen")
    if not isinstance(seen, Mapping):
        raise Refused(400, "seen: the document's state as read (/api/document gives it)")
    # As it is now: where its last error happened (a retry's default target), and until
    # when its lease runs (a retry takes a live one only with force; an in-house pod's
    # runs by its lockedAt). Applied only while it is still in the phase, under the
    # lease, ``seen`` says.
    current = await site.operations.document(collection, doc_id)
    seen = {
        **seen,
        "_id": doc_id,
        "lockedUntil": current.get("lockedUntil"),
        "lockedAt": current.get("lockedAt"),
    }
    if action is Action.RETRY and to is None:
        to = error_phase(current)
    shown: dict[str, Any] = {"action": action.value, "collection": collection}
    if action is Action.UNLOCK:
        after = await site.operations.unlock(collection, seen, by=by, why=why)
    else:
        moved: Moved
        if action is Action.RETRY:
            moved = await site.operations.retry(
                collection, seen, to, force=force, any_phase=any_phase, by=by, why=why
            )
        else:
            moved = await site.operations.cancel(
                collection, seen, to=to, any_phase=any_phase, children=children, by=by, why=why
            )
            shown["cascade"] = moved.cascade.to_dict()
        after = moved.document
        shown.update(
            source=_relaxed(moved.source),
            target=moved.target,
            at=moved.at.isoformat(),
            server_time=moved.server_time,
            lease_taken=moved.lease_taken,
        )
    site.changed()
    now = await site.operations.now()
    fleet = Fleet.of(await site.status())
    row = Row.read(after, now, fleet.keys(collection), fleet.names(), fleet.in_house())
    return {**shown, "document": row.to_dict()}


async def signal(site: Site, request: Request) -> dict[str, Any]:
    """The signal ``name`` (with ``payload``) sent to the document ``ref``, with a
    ``reason``."""
    body = await json_body(request)
    await _allow(site, request, WebAction.SIGNAL, body, documents=named(body.get("ref")))
    _only(body, SIGNAL)
    collection = await site.collection(_text(body, "c"))
    doc_id = parse_ref(_text(body, "ref"))
    name = body.get("name")
    if not isinstance(name, str):
        raise Refused(400, "name: the signal's name, a string")
    delivered = await site.operations.signal(
        collection,
        doc_id,
        name,
        body.get("payload"),
        by=site.actor(request),
        why=_text(body, "reason"),
    )
    site.changed()
    return {
        "action": "signal",
        "collection": collection,
        "ref": id_json(doc_id),
        "name": name,
        "id": delivered.id,
        "woke": delivered.woke,
    }


async def pause(pausing: bool, site: Site, request: Request) -> dict[str, Any]:
    body = await json_body(request)
    asked = {"phase": body.get("phase") or "", "handler": body.get("handler") or ""}
    await _allow(site, request, WebAction.PAUSE if pausing else WebAction.RESUME, body, scope=asked)
    _only(body, PAUSE)
    if not pausing and "force" in body:
        raise Refused(400, "force is a pause's: a resume ends any pause named as it was paused")
    scope = Scope(_text(body, "c"), _text(body, "phase") or None, _text(body, "handler") or None)
    by, why = site.actor(request), _text(body, "reason")
    if pausing:
        done = await site.operations.pause(scope, force=_flag(body, "force"), by=by, why=why)
    else:
        done = await site.operations.resume(scope, by=by, why=why)
    site.changed()
    return {
        "action": "pause" if pausing else "resume",
        "done": done,
        "collection": scope.collection,
        "phase": scope.phase,
        "handler": scope.handler,
    }


async def schedules(site: Site, request: Request) -> dict[str, Any]:
    return {"schedules": [row.to_dict() for row in await site.operations.schedules()]}


async def schedule(site: Site, request: Request) -> dict[str, Any]:
    name = request.query_params.get("name") or ""
    if not name:
        raise Refused(400, "which schedule? give its name (name=...)")
    limit = _integer(request.query_params.get("runs"), 20, MAX_RUNS, "runs")
    row, runs = await site.operations.schedule(name, runs=limit)
    return {**row.to_dict(), "runs": [run.to_dict() for run in runs]}


async def schedule_act(verb: str, site: Site, request: Request) -> dict[str, Any]:
    """Pause, resume, trigger or backfill (``from``, ``to``: dates, ``{"$date": ...}``)
    the schedule ``name``, with a ``reason``."""
    body = await json_body(request)
    name = body.get("name")
    await site.allow(
        request,
        WebAction.schedule(verb),
        site.schedules,
        scope={"schedule": _given(name)},
        documents=[_given(name)] if name else [],
        why=_given(body.get("reason")),
    )
    _only(body, BACKFILL if verb == "backfill" else SCHEDULE)
    name, why = _text(body, "name"), _text(body, "reason")
    if not name:
        raise Refused(400, "which schedule? give its name")
    by, operations = site.actor(request), site.operations
    result: dict[str, Any] = {"action": verb, "name": name}
    if verb in ("pause", "resume"):
        change = operations.pause_schedule if verb == "pause" else operations.resume_schedule
        result["done"] = await change(name, by=by, why=why)
    elif verb == "trigger":
        result.update((await operations.trigger(name, by=by, why=why)).to_dict())
    else:
        start, end = _date(body, "from"), _date(body, "to")
        result.update((await operations.backfill(name, start, end, by=by, why=why)).to_dict())
    site.changed()
    return result


def _date(body: Mapping[str, Any], name: str) -> datetime:
    value = body.get(name)
    if not isinstance(value, datetime):
        raise Refused(400, f'{name} is a date ({{"$date": "2026-01-01T00:00:00Z"}})')
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def _allow(
    site: Site,
    request: Request,
    action: WebAction,
    body: Mapping[str, Any],
    *,
    scope: Mapping[str, Any] | None = None,
    documents: list[str] | None = None,
) -> None:
    """``site.allow`` of an action on what ``body`` names, read before it is checked (a
    refusal names what was asked, however malformed)."""
    await site.allow(
        request,
        action,
        _given(body.get("c")),
        scope={
            name: [_given(v) for v in value] if isinstance(value, list) else _given(value)
            for name, value in (scope or {}).items()
        },
        documents=documents or [],
        why=_given(body.get("reason")),
    )


# -- values -----------------------------------------------------------------------------------


def _given(value: Any) -> str:
    """A value of a body as the audit trail keeps it: text, shortened."""
    if value is None:
        return ""
    shown = value if isinstance(value, str) else json.dumps(value, default=str)
    return shown[:200]


def _only(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise Refused(
            400, f"unknown field(s) {', '.join(unknown)}; this takes {', '.join(sorted(allowed))}"
        )


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise Refused(400, f"{name} is a string")
    return value.strip() if name != "ref" else value


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise Refused(400, f"{name} is true or false")
    return value


def _integer(text: str | None, default: int, most: int, name: str) -> int:
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise Refused(400, f"{name} is an integer from 1 to {most}, not {text!r}")
    return value


def _relaxed(value: Any) -> Any:
    """A stored value as relaxed Extended JSON, as plain JSON types (a date as
    ``{"$date": "..."}``, an ObjectId as ``{"$oid": "..."}``)."""
    try:
        return json.loads(json_util.dumps(value, json_options=RELAXED_JSON_OPTIONS))
    except (TypeError, ValueError, BSONError):
        return str(value)
