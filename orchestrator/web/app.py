"""The operator's page as an ASGI app (Starlette), on the async driver only, with its JSON
API under ``/api`` (``web/api.py``).

Mount it in your own FastAPI or Starlette application, so that it sits behind that
application's authentication, and name who acts (the signed-in user) for the audit
trail and the documents' histories::

    app.mount(
        "/ops",
        operator_app(
            client["orchestrator"],
            actor=lambda r: r.user.name,
            permit=lambda r, action: "operators" in r.auth.scopes,
        ),
    )

or run it alone with ``orchestrator web --uri ...`` (loopback by default). It reads and
acts with ``orchestrator.operations.AsyncOperations``, as the command line does.

Who may act is the application's to say, per request and action (``permit``, asked of
each ``WebAction``; ``permits.py``): the page offers only the actions permitted, and
refuses any other one posted (403, logged, and kept in the audit trail as refused), on
the page and the JSON API alike. Where the application says nothing, the page is
read-only: looking is all it allows until the application grants more.

The pages:

- ``/``: documents per collection and phase (every count a link to its list), the
  handlers the live replicas run (each phase, handler and collection can be paused), the
  replicas (a stale marker on one silent past two record intervals), the latest leases taken
  over from dead replicas, the latest errors;
- ``/documents``: the documents a filter selects, a page at a time (``browse.py``), and
  the bulk actions on them;
- ``/document``: one document (by ``ref``, ``id`` or business key), its lease as a badge
  that knows the failed phase and the ``failedBy`` mark, what it waits for, its parent
  and children (``AsyncOperations.tree``), its inbox of signals, its history as a
  timeline;
- ``/confirm``, ``/bulk``, ``/pause``, ``/resume``: confirmations, and their POSTs
  (``actions.py``); ``/audit``: the audit trail;
- ``/schedules``, ``/schedule``: the schedules, one with its runs linked to their
  documents, and its pause, resume and trigger (``schedules.py``).

What it guards against:

- **Escaping.** Every page is a Jinja2 template with autoescape on: no value taken from a
  document reaches the HTML unescaped. A Content-Security-Policy allows no script at all
  and no framing (``frame-ancestors 'none'``: the confirm button cannot be clickjacked).
- **Cross-site requests.** Actions are POSTs only, each reached through a confirmation
  page. A POST is refused when the browser says it came from another site: by its
  ``Sec-Fetch-Site`` header (sent by every current browser), else by an ``Origin`` that
  differs from the ``Host``; a request with neither header is no browser's cross-site
  form (curl, scripts) and is let through, as Go's ``http.CrossOriginProtection`` does.
  This needs no token, so it works unchanged behind a load balancer across replicas of
  the application, and whatever authentication the application mounts it behind. The
  JSON API's POSTs also require ``Content-Type: application/json``, which no other
  site's page can send without a preflight.
- **Acting on what was confirmed.** The confirmation form carries the state the operator
  saw (its phase and lease token); the action applies only while the document is still
  so, else it says the document changed meanwhile (409): a retry confirmed on a free
  document never takes the lease of a replica that claimed it since. A bulk action
  applies to the documents that still match its filter when it runs.
- **Acting on the document shown.** Links and forms name a document by its id as
  canonical Extended JSON (``ref``), exact whatever its type: the string ``"42"`` and the
  integer ``42``, ``"gw-1 "`` and ``"gw-1"`` are different documents. An id typed as text
  (``id``) that names two documents gets a page listing both, not one of them.
- **Load.** The status report (the aggregation) is computed at most once every
  ``refresh`` seconds whatever the number of open tabs (``AsyncStatusCache``), shared
  with the metrics collector when the application gives both the same cache.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

from pymongo.asynchronous.database import AsyncDatabase
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError
from orchestrator.core.history import latest_first
from orchestrator.core.names import (
    AUDIT_COLLECTION,
    PAUSES_COLLECTION,
    REPLICAS_COLLECTION,
    SCHEDULES_COLLECTION,
)
from orchestrator.core.retention import describe
from orchestrator.operations import AsyncOperations, AsyncStatusCache, LeaseState, Row, id_json
from orchestrator.operations.tree_report import CHILDREN_SHOWN
from orchestrator.web import actions, api, browse, schedules
from orchestrator.web.permits import Permit, permission
from orchestrator.web.site import Actor, Links, Site, default_actor
from orchestrator.web.views import (
    LEASE_ROWS,
    MISSING,
    Fleet,
    error_view,
    other_fields,
    totals,
)

__all__ = ["operator_app"]


NOTICES = {
    "unlocked": "Unlocked: the document is claimable at once.",
    "retried": "Retried: attempts reset, the document is claimable at once.",
    "retried-local-clock": (
        "Retried: attempts reset, claimable at once. The server reports no time, so "
        "updatedAt was stamped with this machine's clock."
    ),
    "cancelled": (
        "Cancelled: sent to the cancelled phase and released; a step running on it loses "
        "its lease at its next write. What it owns, if anything, was cancelled with it, but "
        "for what no live replica would take up again."
    ),
    "cancelled-alone": (
        "Cancelled: sent to the cancelled phase and released; a step running on it loses "
        "its lease at its next write. What it owns was left as it is."
    ),
    "signalled-woke": (
        "Signal sent: it was waiting for it, and is due now: a replica's next tick moves it on."
    ),
    "signalled": (
        "Signal sent: it was not waiting for it; kept in its inbox for a later wait to find."
    ),
    "paused": (
        "Paused: every replica stops claiming it at its next heartbeat; steps running finish."
    ),
    "already-paused": "It was paused already: nothing changed.",
    "resumed": "Resumed: the replicas claim it again at their next heartbeat.",
    "not-paused": "It was not paused: nothing changed.",
}
"""What a finished action says (a fixed text per code: nothing from the request is
echoed); the page's history and banners say the rest."""


def operator_app(  # noqa: PLR0913  its public settings, each keyword-only with a default
    database: AsyncDatabase[Document],
    *,
    refresh: float = 5.0,
    errors: int = 10,
    replicas_collection: str = REPLICAS_COLLECTION,
    pauses_collection: str = PAUSES_COLLECTION,
    audit_collection: str = AUDIT_COLLECTION,
    schedules_collection: str = SCHEDULES_COLLECTION,
    actor: Actor | None = None,
    status: AsyncStatusCache | None = None,
    permit: Permit | None = None,
    read_only: bool | None = None,
) -> Starlette:
    """The operator's page for ``database`` (an ``AsyncMongoClient``'s database), as an
    ASGI app to mount (``app.mount("/ops", operator_app(db))``) or serve alone.

    ``refresh``: seconds between the pages' reloads of themselves, and the least age of
    the status report before it is computed again; ``errors``: latest errors shown per
    collection; ``replicas_collection``, ``pauses_collection``, ``audit_collection``,
    ``schedules_collection``: the replicas' settings of those names. ``actor``: who acts,
    from the request (the application's signed-in user; by default ``web`` and the
    client's address), written
    in the audit trail and the documents' histories. ``status``: a status cache to share
    with a ``PrometheusListener`` (then its ``max_age`` and ``errors`` apply).

    ``permit``: who may act, ``permit(request, action) -> bool`` (or an awaitable of
    one) for each ``WebAction``: the page shows the actions it grants and refuses the
    others (403, audited as refused). ``read_only``: the shorthand, ``False`` to let
    everyone who reaches the page act, ``True`` to let no one. Give one or neither:
    with neither the page is read-only, so that acting is granted on purpose, never by
    mounting the page.

    The page has no authentication of its own: mount it behind your application's, or
    serve it on loopback (``orchestrator web``).
    """
    if not inspect.iscoroutinefunction(getattr(database, "list_collection_names", None)):
        raise ConfigError(
            "operator_app needs an AsyncDatabase (from pymongo's AsyncMongoClient), not"
            f" {type(database).__name__}: the page serves on the application's event loop"
        )
    if (
        not isinstance(refresh, int | float)
        or isinstance(refresh, bool)
        or not math.isfinite(refresh)
        or not 1 <= refresh <= 3600
    ):
        raise ConfigError(f"refresh must be between 1 and 3600 seconds, not {refresh!r}")
    if not isinstance(errors, int) or isinstance(errors, bool) or not 0 <= errors <= 1000:
        raise ConfigError(f"errors must be an integer between 0 and 1000, not {errors!r}")
    if actor is not None and not callable(actor):
        raise ConfigError("actor is a function of the request returning who acts")
    if status is not None and not isinstance(status, AsyncStatusCache):
        raise ConfigError(f"status is an AsyncStatusCache, not {type(status).__name__}")
    permitted = permission(permit, read_only)
    operations = AsyncOperations(
        database,
        replicas_collection=replicas_collection,
        pauses_collection=pauses_collection,
        audit_collection=audit_collection,
        schedules_collection=schedules_collection,
    )
    site = Site(
        database,
        operations,
        status or AsyncStatusCache(operations, max_age=refresh, errors=errors),
        refresh=refresh,
        own={replicas_collection, pauses_collection, audit_collection},
        actor=actor or default_actor,
        permission=permitted,
        schedules=schedules_collection,
    )
    return Starlette(
        routes=[
            Route("/", site.page(partial(overview, site))),
            Route("/document", site.page(partial(document, site))),
            Route("/audit", site.page(partial(audit, site))),
            *browse.routes(site),
            *actions.routes(site),
            *schedules.routes(site),
            Mount("/api", routes=api.routes(site)),
        ]
    )


async def overview(site: Site, request: Request, links: Links) -> Response:
    """Documents per collection and phase, handlers, replicas, take-overs, errors."""
    status = await site.status()
    fleet = Fleet.of(status)
    latest = sorted(
        status.errors,
        key=lambda e: e.at or datetime.min.replace(tzinfo=UTC),
        reverse=True,
    )
    return await site.render(
        request,
        links,
        "overview.html",
        status=status,
        refreshing=True,
        notice=NOTICES.get(request.query_params.get("done", "")),
        totals=totals(status),
        latest=latest,
        disagree={d.setting for d in status.disagreements},
        handlers=fleet.handlers(),
        retention=[(name, describe(kept)) for name, kept in status.retention().items()],
        takeovers=[fleet.takeover(entry) for entry in status.takeovers],
    )


async def document(site: Site, request: Request, links: Links) -> Response:
    """One document: its lease, its errors, its history; or the form that finds one."""
    params = request.query_params
    if not params.get("id") and not params.get("ref"):
        # Which one? A form, on a page that does not reload under the typing operator.
        return await site.render(
            request,
            links,
            "find.html",
            collections=await site.collections(),
            chosen=params.get("c", ""),
        )
    collection, doc = await site.find(params, links)
    status = await site.status()
    now = await site.operations.now()
    fleet = replace(Fleet.of(status), at=now)
    row = Row.read(doc, now, fleet.keys(collection), fleet.names(), fleet.in_house())
    badge = fleet.badge(collection, row)
    tree = await site.operations.tree(collection, doc, replicas=status.replicas)
    return await site.render(
        request,
        links,
        "document.html",
        status=status,
        # Reloaded while it moves on its own; at rest (failed, paused, done) it stays, and
        # so does a traceback the operator opened.
        refreshing=badge.moving,
        at=now,
        notice=NOTICES.get(params.get("done", "")),
        collection=collection,
        doc_id=doc["_id"],
        ref=id_json(doc["_id"]),
        row=row,
        badge=badge,
        failed_by=row.failed_by,
        offers=_offers(row, fleet.cancelled_phase()),
        lease=[(label, name, doc.get(name, MISSING)) for name, label in LEASE_ROWS],
        last_error=error_view(doc.get("lastError")),
        previous_error=error_view(doc.get("previousError")),
        history=latest_first(doc),
        fields=other_fields(doc),
        tree=tree,
        children_shown=CHILDREN_SHOWN,
    )


def _offers(row: Row, cancelled: str) -> list[str]:
    """The actions the document page offers: unlock only where there is a lease or a
    wait to drop (a failed document's mark is no lease: unlocking it would not let it
    run), cancel unless it is cancelled already."""
    offers = []
    if row.state in (LeaseState.LEASED, LeaseState.OVERDUE, LeaseState.WAITING):
        offers.append("unlock")
    offers.append("retry")
    if row.phase != cancelled:
        offers.append("cancel")
    return offers


async def audit(site: Site, request: Request, links: Links) -> Response:
    """The audit trail: operators' actions and leases taken over, latest first; ``key``:
    only those naming a document by that business key."""
    key = request.query_params.get("key", "").strip()
    trail = await site.operations.audit(limit=200, key=key or None)
    return await site.render(request, links, "audit.html", refreshing=not key, trail=trail, key=key)
