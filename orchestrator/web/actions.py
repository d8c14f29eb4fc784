"""The page's actions, each a POST behind a confirmation page (GET): unlock, retry and
cancel of one document (``/confirm``, then ``/unlock``, ``/retry``, ``/cancel``; a cancel
reaches the documents it owns unless the operator ticks to leave them), a signal sent to
one (``/confirm?action=signal``, then ``/signal``: a name, a JSON payload), of every
document a filter selects (``/bulk``: the confirmation is a dry run, with the count and
the first documents, and asks for a reason), and pause and resume of a collection, a
phase or a handler (``/pause``, ``/resume``, with a reason).

Who acts is the ``actor`` the mounting application gives (``operator_app``), recorded
with the reason in the audit trail and the documents' histories. A retry or cancel to a
phase no live replica handles is refused with the phases they do handle, and the refusal
offers to send it anyway (``any_phase``), explicitly; so is a pause of what no live
replica has (``force``). A finished action says what it did
once: a one-document action on the document's page (``done=``, which the page's reload
drops), a bulk action on its own result page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from orchestrator.core.errors import ConfigError
from orchestrator.operations import (
    Action,
    Children,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    Row,
    Scope,
    UnhandledPhase,
    UnhandledScope,
    error_phase,
    holding,
)
from orchestrator.web.browse import selection_of
from orchestrator.web.inputs import Refused, Resend, Selection, form, named, parse_ref
from orchestrator.web.permits import WebAction
from orchestrator.web.site import Links, Site
from orchestrator.web.views import MISSING, Fleet, error_view, text

__all__ = ["routes"]

SHOWN = 20
"""Documents a bulk confirmation or result lists (of those it acts on, and of those it
leaves alone)."""


def routes(site: Site) -> list[Route]:
    return [
        Route("/confirm", site.page(partial(confirm, site))),
        Route("/signal", site.page(partial(signal, site)), methods=["POST"]),
        *(
            Route(f"/{action.value}", site.page(partial(act, site, action)), methods=["POST"])
            for action in Action
        ),
        Route("/bulk", site.page(partial(bulk_confirm, site))),
        Route("/bulk", site.page(partial(bulk, site)), methods=["POST"]),
        Route("/pause", site.page(partial(pause_confirm, site, "pause"))),
        Route("/pause", site.page(partial(pause, site, "pause")), methods=["POST"]),
        Route("/resume", site.page(partial(pause_confirm, site, "resume"))),
        Route("/resume", site.page(partial(pause, site, "resume")), methods=["POST"]),
    ]


SIGNAL = "signal"
"""The one-document action that is no ``Action`` (no bulk form of it, no phase moved)."""


def _action(name: str | None, *, signal: bool = False) -> Action | str:
    if signal and name == SIGNAL:
        return SIGNAL
    try:
        return Action(name or "")
    except ValueError:
        raise Refused(
            400, "unknown action: the page offers unlock, retry, cancel and signal"
        ) from None


def _web(action: Action | str) -> WebAction:
    """A one-document action as the application's permit is asked about it."""
    return WebAction.one(action) if isinstance(action, Action) else WebAction.SIGNAL


def _bulk_action(name: str | None) -> Action:
    action = _action(name)
    assert isinstance(action, Action)  # a signal is asked for by name only
    return action


# -- one document ---------------------------------------------------------------------------


async def confirm(site: Site, request: Request, links: Links) -> Response:
    """The confirmation of an action on one document, carrying the state it is in now."""
    action = _action(request.query_params.get("action"), signal=True)
    await site.may(request, _web(action))
    collection, doc = await site.find(request.query_params, links)
    status = await site.status()
    now = await site.operations.now()
    fleet = replace(Fleet.of(status), at=now)
    in_house = fleet.in_house()
    row = Row.read(doc, now, fleet.keys(collection), fleet.names(), in_house)
    held = holding(doc, now, in_house)
    seen = {"phase": doc.get("phase"), "lockToken": doc.get("lockToken")}
    return await site.render(
        request,
        links,
        "confirm.html",
        status=status,
        at=now,
        action=str(action),
        collection=collection,
        doc_id=doc["_id"],
        row=row,
        badge=fleet.badge(collection, row),
        phase=doc.get("phase", MISSING),
        holder=held.holder,
        until=held.until,
        attempts=doc.get("attempts", 0),
        ref=json_util.dumps(doc["_id"], json_options=CANONICAL_JSON_OPTIONS),
        seen=json_util.dumps(seen, json_options=CANONICAL_JSON_OPTIONS),
        target=(error_phase(doc) or "") if action is Action.RETRY else "",
        cancelled=fleet.cancelled_phase(),
        last_error=error_view(doc.get("lastError")),
    )


async def act(site: Site, action: Action, request: Request, links: Links) -> Response:
    """An action on one document, as confirmed: applied only while the document is still
    in the state the confirmation carried."""
    fields = await form(request)
    given = _last(fields)
    await _allow(site, request, WebAction.one(action), given)
    collection = await site.collection(given.get("c"))
    doc_id = parse_ref(given.get("ref"))
    seen = parse_ref(given.get("seen"), "confirmed state")
    if not isinstance(seen, dict):
        raise Refused(400, "the confirmed state is not a document")
    seen = {**seen, "_id": doc_id}
    by, why = site.actor(request), given.get("reason", "").strip()
    target = given.get("phase", "").strip()
    any_phase = given.get("any_phase") == "yes"
    children = Children.ABANDON if given.get("children") == "abandon" else Children.CANCEL
    async with _applying(site, collection, doc_id, links=links, action=action, fields=fields):
        if action is Action.UNLOCK:
            await site.operations.unlock(collection, seen, by=by, why=why)
            done = "unlocked"
        elif action is Action.RETRY:
            if not target:
                raise Refused(400, "name the phase to send the document back to")
            # Forced: the confirmation showed the lease, and warned when a replica held it.
            retried = await site.operations.retry(
                collection, seen, target, force=True, any_phase=any_phase, by=by, why=why
            )
            done = "retried" if retried.server_time else "retried-local-clock"
        else:
            await site.operations.cancel(
                collection,
                seen,
                to=target or None,
                any_phase=any_phase,
                children=children,
                by=by,
                why=why,
            )
            done = "cancelled" if children is Children.CANCEL else "cancelled-alone"
    site.changed()
    return RedirectResponse(links.document(collection, doc_id, done=done), 303)


async def signal(site: Site, request: Request, links: Links) -> Response:
    """A signal sent to one document, as confirmed: its name, its payload (JSON, empty:
    none) and a reason; the document's page then says whether it woke it."""
    given = _last(await form(request))
    await _allow(site, request, WebAction.SIGNAL, given)
    collection = await site.collection(given.get("c"))
    doc_id = parse_ref(given.get("ref"))
    name = given.get("name", "").strip()
    if not name:
        raise Refused(400, "name the signal to send")
    payload = _payload(given.get("payload", "").strip())
    try:
        delivered = await site.operations.signal(
            collection,
            doc_id,
            name,
            payload,
            by=site.actor(request),
            why=given.get("reason", "").strip(),
        )
    except DocumentNotFound:
        raise Refused(
            404, f"no document {text(doc_id)} in collection {collection!r}", kind="NotFound"
        ) from None
    except ConfigError as exc:
        raise Refused(400, str(exc)) from None
    site.changed()
    done = "signalled-woke" if delivered.woke else "signalled"
    return RedirectResponse(links.document(collection, doc_id, done=done), 303)


async def _allow(site: Site, request: Request, action: WebAction, given: Mapping[str, str]) -> None:
    """``site.allow`` of an action on the document a form names."""
    await site.allow(
        request,
        action,
        given.get("c", ""),
        documents=named(given.get("ref")),
        why=given.get("reason", "").strip(),
    )


def _payload(typed: str) -> Any:
    """A signal's payload as typed: JSON (Extended JSON read), or none when empty."""
    if not typed:
        return None
    try:
        return json_util.loads(typed)
    except (ValueError, TypeError, BSONError) as exc:
        raise Refused(400, f"the payload is not JSON: {' '.join(str(exc).split())}") from None


@asynccontextmanager
async def _applying(
    site: Site,
    collection: str,
    doc_id: Any,
    *,
    links: Links,
    action: Action,
    fields: Mapping[str, Sequence[str]],
) -> AsyncIterator[None]:
    """An action's refusals as the page words them."""
    try:
        yield
    except DocumentNotFound:
        raise Refused(
            404, f"no document {text(doc_id)} in collection {collection!r}", kind="NotFound"
        ) from None
    except (DocumentChanged, LeaseHeld):
        raise Refused(
            409,
            f"{collection}/{text(doc_id)} changed since you confirmed (another operator, a "
            "replica or the application moved it): nothing was done; look again",
            kind="DocumentChanged",
        ) from None
    except UnhandledPhase as exc:
        raise _unhandled(exc, links.action(action.value), fields) from None


def _unhandled(exc: UnhandledPhase, target: str, fields: Mapping[str, Sequence[str]]) -> Refused:
    """A refusal of a phase no live replica handles, offering the same form again with
    the box that sends it there anyway."""
    resend = Resend.of(target, fields, "any_phase")
    return Refused(422, str(exc), kind="UnhandledPhase", resend=resend)


# -- every document of a filter --------------------------------------------------------------


async def bulk_confirm(site: Site, request: Request, links: Links) -> Response:
    """A bulk action's confirmation: what it would do now (a dry run), and the form that
    does it, with a reason."""
    params = request.query_params
    action = _bulk_action(params.get("action"))
    await site.may(request, WebAction.every(action))
    selection = selection_of(request)
    await site.collection(selection.collection)
    query = await selection.resolve(site.operations)
    to = params.get("to", "").strip() or None
    any_phase = params.get("any_phase") == "yes"
    refusal: UnhandledPhase | None = None
    preview = None
    try:
        preview = await site.operations.bulk(
            action, query, dry_run=True, to=to, any_phase=any_phase
        )
    except UnhandledPhase as exc:
        refusal = exc
    status = await site.status()
    return await site.render(
        request,
        links,
        "bulk.html",
        422 if refusal else 200,
        status=status,
        action=action.value,
        selection=selection,
        preview=preview,
        shown=SHOWN,
        refusal=refusal,
        to=to or "",
        any_phase=any_phase,
        cancelled=Fleet.of(status).cancelled_phase(),
    )


async def bulk(site: Site, request: Request, links: Links) -> Response:
    """A bulk action, applied to the documents that match its filter now (each only while
    it is as it was read), with the reason given; its result page says what it did."""
    fields = await form(request)
    given = _last(fields)
    action = _bulk_action(given.get("action"))
    selection = Selection.read(fields)
    why = given.get("reason", "").strip()
    await site.allow(
        request,
        WebAction.every(action),
        selection.collection,
        scope=selection.describe(),
        why=why,
    )
    await site.collection(selection.collection)
    if not why:
        raise Refused(400, "give a reason: it is kept with the action in the audit trail")
    query = await selection.resolve(site.operations)
    try:
        result = await site.operations.bulk(
            action,
            query,
            to=given.get("to", "").strip() or None,
            force=given.get("force") == "yes",
            any_phase=given.get("any_phase") == "yes",
            by=site.actor(request),
            why=why,
        )
    except UnhandledPhase as exc:
        raise _unhandled(exc, links.action("bulk"), fields) from None
    site.changed()
    return await site.render(
        request,
        links,
        "bulk_done.html",
        action=action.value,
        selection=selection,
        result=result,
        shown=SHOWN,
        by=site.actor(request),
    )


# -- pauses ---------------------------------------------------------------------------------


def _scope(values: Mapping[str, str]) -> Scope:
    collection = values.get("c", "").strip()
    if not collection:
        raise Refused(400, "which collection? give its name (c=...)")
    return Scope(
        collection,
        values.get("phase", "").strip() or None,
        values.get("handler", "").strip() or None,
    )


async def pause_confirm(site: Site, verb: str, request: Request, links: Links) -> Response:
    """The confirmation of a pause or resume: what it covers, who runs it, a reason."""
    scope = _scope(request.query_params)
    await site.may(request, WebAction(verb))
    status = await site.status()
    fleet = Fleet.of(status)
    covered = [
        h
        for h in fleet.handlers()
        if h.collection == scope.collection
        and scope.phase in (None, h.phase)
        and scope.handler in (None, h.name)
    ]
    current = next((p for p in status.pauses if p.scope == scope), None)
    return await site.render(
        request,
        links,
        "pause.html",
        status=status,
        verb=verb,
        scope=scope,
        covered=covered,
        current=current,
    )


async def pause(site: Site, verb: str, request: Request, links: Links) -> Response:
    """Pause or resume, then the overview, whose banner says what is paused now. A pause
    of what no live replica has is refused unless the operator ticked its box
    (``force``), and the refusal offers the form again with that box."""
    fields = await form(request)
    given = _last(fields)
    scope = _scope(given)
    why = given.get("reason", "").strip()
    await site.allow(
        request,
        WebAction(verb),
        scope.collection,
        scope={"phase": scope.phase or "", "handler": scope.handler or ""},
        why=why,
    )
    if not why:
        raise Refused(400, "give a reason: it is shown with the pause, and kept in the audit")
    by = site.actor(request)
    if verb == "pause":
        force = given.get("force") == "yes"
        try:
            paused = await site.operations.pause(scope, force=force, by=by, why=why)
        except UnhandledScope as exc:
            resend = Resend.of(links.action(verb), fields, "force")
            raise Refused(422, str(exc), kind="UnhandledScope", resend=resend) from None
        done = "paused" if paused else "already-paused"
    else:
        done = "resumed" if await site.operations.resume(scope, by=by, why=why) else "not-paused"
    site.changed()
    return RedirectResponse(f"{links.home}?done={done}", 303)


def _last(fields: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each field's last value (a form sends each once; a repeated one, its last)."""
    return {name: values[-1] for name, values in fields.items() if values}
