"""The page's document browser (``/documents``): the documents a filter selects, a page
at a time, each with its id and business key, phase, lease badge, holder, attempts and
last error; the filter as a form; the next page by keyset cursor (``next``); the index
that served the list; and the bulk actions on every document of the filter.

Every count of the overview links here with its filter; the list page does not reload
itself (its form is being typed into), it says when it was read.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orchestrator.operations import LeaseState, OperatorError, UnindexedField
from orchestrator.operations.filters import DEFAULT_LIMIT, MAX_LIMIT
from orchestrator.web.inputs import Refused, Selection
from orchestrator.web.site import Links, Site
from orchestrator.web.views import Fleet, phases_of

__all__ = ["FILTER_FIELDS", "routes", "selection_of"]

FILTER_FIELDS = ("c", "phase", "state", "error", "key")
COUNTED = 10_000
"""A list counts the documents its filter selects up to this (a bulk action's bound)."""


def routes(site: Site) -> list[Route]:
    return [Route("/documents", site.page(partial(documents, site)))]


def selection_of(request: Request) -> Selection:
    """The filter the request's query parameters give."""
    params = request.query_params
    return Selection.read({name: params.getlist(name) for name in FILTER_FIELDS})


async def documents(site: Site, request: Request, links: Links) -> Response:
    """A page of the documents a filter selects, or the form to choose a collection."""
    params = request.query_params
    status = await site.status()
    collections = await site.collections()
    if not params.get("c"):
        return await site.render(
            request,
            links,
            "documents.html",
            status=status,
            collections=collections,
            selection=None,
            states=list(LeaseState),
            refused=None,
        )
    selection = selection_of(request)
    await site.collection(selection.collection)
    context: dict[str, Any] = {
        "status": status,
        "collections": collections,
        "selection": selection,
        "states": list(LeaseState),
        "phases": phases_of(status, selection.collection),
    }
    limit = _limit(params.get("limit"))
    kept = {"limit": str(limit)} if limit != DEFAULT_LIMIT else {}
    try:
        query = await selection.resolve(site.operations)
        page = await site.operations.browse(query, after=params.get("after") or None, limit=limit)
        total = await site.operations.count(query, limit=COUNTED + 1)
    except OperatorError as exc:  # the form stays, with what to change
        code = 422 if isinstance(exc, UnindexedField) else 400
        return await site.render(
            request, links, "documents.html", code, refused=str(exc), **context
        )
    fleet = replace(Fleet.of(status), at=page.at)
    return await site.render(
        request,
        links,
        "documents.html",
        at=page.at,
        page=page,
        rows=[(row, fleet.badge(selection.collection, row)) for row in page.rows],
        total=total,
        counted=COUNTED,
        next_page=links.documents(selection, after=page.next, **kept) if page.next else None,
        paged=bool(params.get("after")),
        refused=None,
        **context,
    )


def _limit(text: str | None) -> int:
    if not text:
        return DEFAULT_LIMIT
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise Refused(400, f"limit: a page holds 1 to {MAX_LIMIT} documents, not {text!r}")
    return limit
