"""The page's schedules: ``/schedules`` (every schedule, as ``orchestrator schedules``
lists them), ``/schedule`` (one, with its latest runs, each linked to its document's
page), and pause, resume and trigger, each a POST behind a confirmation page (GET
``/schedule/act``) that asks for a reason, with the protections of the other actions
(``actions.py``: a form post only, refused cross-site; who acts is the app's ``actor``,
recorded with the reason in the audit trail)."""

from __future__ import annotations

from functools import partial
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from orchestrator.web.inputs import Refused, form
from orchestrator.web.permits import WebAction
from orchestrator.web.site import Links, Site

__all__ = ["ACTIONS", "NOTICES", "routes"]

ACTIONS = ("pause", "resume", "trigger")
"""What the page does to a schedule (a backfill is the command line's and the API's)."""

RUNS_SHOWN = 50

NOTICES = {
    "paused": "Paused: no replica starts its fires until it is resumed.",
    "already-paused": "It was paused already: nothing changed.",
    "resumed": "Resumed: its fires start again (missed ones within its catch-up window).",
    "not-paused": "It was not paused: nothing changed.",
    "triggered": "Triggered: its next step, at once, starts one run.",
    "triggered-held": (
        "Triggered: a step holds the schedule now, so the run starts at its next step."
    ),
}


def routes(site: Site) -> list[Route]:
    return [
        Route("/schedules", site.page(partial(listing, site))),
        Route("/schedule", site.page(partial(one, site))),
        Route("/schedule/act", site.page(partial(confirm, site))),
        Route("/schedule/act", site.page(partial(act, site)), methods=["POST"]),
    ]


def schedule_link(links: Links, name: str, **extra: str) -> str:
    return f"{links.root}/schedule?{urlencode({'name': name, **extra})}"


async def listing(site: Site, request: Request, links: Links) -> Response:
    """Every schedule: spec, next fire, last run and its outcome, counts, notes."""
    rows = await site.operations.schedules()
    return await site.render(
        request, links, "schedules.html", refreshing=True, rows=rows, schedule_link=schedule_link
    )


async def one(site: Site, request: Request, links: Links) -> Response:
    """One schedule, all its document says, and its latest runs."""
    name = _name(request.query_params.get("name"))
    row, runs = await site.operations.schedule(name, runs=RUNS_SHOWN)
    return await site.render(
        request,
        links,
        "schedule.html",
        refreshing=True,
        notice=NOTICES.get(request.query_params.get("done", "")),
        row=row,
        runs=runs,
        actions=ACTIONS,
        schedule_link=schedule_link,
    )


async def confirm(site: Site, request: Request, links: Links) -> Response:
    """The confirmation of an action on a schedule, as it is now, with a reason."""
    action = _action(request.query_params.get("action"))
    await site.may(request, WebAction.schedule(action))
    row = await site.operations.schedule(_name(request.query_params.get("name")), runs=1)
    return await site.render(
        request,
        links,
        "schedule_confirm.html",
        action=action,
        row=row[0],
        schedule_link=schedule_link,
    )


async def act(site: Site, request: Request, links: Links) -> Response:
    """The action confirmed, then the schedule's page saying what it did."""
    given = {k: v[-1] for k, v in (await form(request)).items() if v}
    action = _action(given.get("action"))
    name = _name(given.get("name"))
    why = given.get("reason", "").strip()
    await site.allow(
        request,
        WebAction.schedule(action),
        site.schedules,
        scope={"schedule": name},
        documents=[name],
        why=why,
    )
    if not why:
        raise Refused(400, "give a reason: it is kept with the action in the audit trail")
    by = site.actor(request)
    operations = site.operations
    if action == "pause":
        done = (
            "paused" if await operations.pause_schedule(name, by=by, why=why) else "already-paused"
        )
    elif action == "resume":
        done = "resumed" if await operations.resume_schedule(name, by=by, why=why) else "not-paused"
    else:
        triggered = await operations.trigger(name, by=by, why=why)
        done = "triggered" if triggered.woken else "triggered-held"
    site.changed()
    return RedirectResponse(schedule_link(links, name, done=done), 303)


def _action(value: str | None) -> str:
    if value not in ACTIONS:
        raise Refused(400, f"unknown action: the page offers {', '.join(ACTIONS)}")
    return value


def _name(value: str | None) -> str:
    if not value:
        raise Refused(400, "which schedule? give its name (name=...)")
    return value
