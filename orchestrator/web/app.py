"""The operator's page as an ASGI app (Starlette), on the async driver only.

Mount it in your own FastAPI or Starlette application, so that it sits behind that
application's authentication::

    app.mount("/ops", operator_app(client["orchestrator"]))  # an AsyncMongoClient's database

or run it alone with ``orchestrator web --uri ...`` (loopback by default). It reads and
acts with ``orchestrator.operations.AsyncOperations``: the counts are the status
command's (from the one aggregation in ``core.queries``), unlock and retry the command
line's.

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
  the application, and whatever authentication the application mounts it behind.
- **Acting on what was confirmed.** The confirmation form carries the state the operator
  saw (its phase and lease token); the action applies only while the document is still
  so, else it says the document changed meanwhile (409): a retry confirmed on a free
  document never takes the lease of a replica that claimed it since.
- **Acting on the document shown.** Links and forms name a document by its id as
  canonical Extended JSON (``ref``), exact whatever its type: the string ``"42"`` and the
  integer ``42``, ``"gw-1 "`` and ``"gw-1"`` are different documents. An id typed as text
  (``id``) that names two documents gets a page listing both, not one of them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from bson import json_util
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS, RELAXED_JSON_OPTIONS
from jinja2 import Environment, PackageLoader, StrictUndefined
from pymongo.asynchronous.database import AsyncDatabase
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.core.replicas import REPLICAS_COLLECTION
from orchestrator.core.resource import EPOCH, LEASE_FIELDS
from orchestrator.mongo.common import Document
from orchestrator.operations import (
    AmbiguousId,
    AsyncOperations,
    DocumentChanged,
    DocumentNotFound,
    OperatorError,
    PhaseCount,
    Status,
    error_phase,
    id_json,
)

__all__ = ["operator_app"]

MAX_FORM_BYTES = 16 * 1024
"""An action's form holds a few short fields; anything larger is refused unread."""
MAX_FIELDS_SHOWN = 20_000
"""Characters of a document's other fields shown on its page (a document may be 16 MiB)."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

NOTICES = {
    "unlocked": "Unlocked: the document is claimable at once.",
    "retried": "Retried: attempts reset, the document is claimable at once.",
    "retried-local-clock": (
        "Retried: attempts reset, claimable at once. The server reports no time, so "
        "updatedAt was stamped with this machine's clock."
    ),
}
"""What a finished action says on the document's page (a fixed text per code: nothing
from the request is echoed)."""

LEASE_ROWS = (
    ("phase", "phase"),
    ("lockedBy", "replica (last holder)"),
    ("lockToken", "lease token"),
    ("lockedAt", "lease taken or renewed at"),
    ("lockedUntil", "lease until"),
    ("attempts", "attempts in this phase"),
    ("relocks", "relocks in this phase"),
    ("failedBy", "failed by (handler)"),
    ("updatedAt", "phase entered or updated at"),
    ("createdAt", "created at"),
)
SHOWN_FIELDS = frozenset({"_id", "updatedAt", *(name for name, _ in LEASE_ROWS), *LEASE_FIELDS})


def operator_app(
    database: AsyncDatabase[Document],
    *,
    refresh: float = 5.0,
    errors: int = 10,
    replicas_collection: str = REPLICAS_COLLECTION,
) -> Starlette:
    """The operator's page for ``database`` (an ``AsyncMongoClient``'s database), as an
    ASGI app to mount (``app.mount("/ops", operator_app(db))``) or serve alone.

    ``refresh``: seconds between the page's reloads of itself; ``errors``: latest errors
    shown per collection; ``replicas_collection``: where the replicas record themselves
    (their ``replicas_collection`` setting). The page has no authentication of its own:
    mount it behind your application's, or serve it on loopback (``orchestrator web``).
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
    page = _Page(database, refresh=refresh, errors=errors, replicas=replicas_collection)
    return Starlette(
        routes=[
            Route("/", page.endpoint(page.overview)),
            Route("/document", page.endpoint(page.document)),
            Route("/confirm", page.endpoint(page.confirm)),
            Route("/unlock", page.endpoint(page.unlock), methods=["POST"]),
            Route("/retry", page.endpoint(page.retry), methods=["POST"]),
        ]
    )


class _Refused(Exception):
    """A request the page answers with an explanation and an HTTP status, not a result;
    ``choices``: links (text, URL) to the documents the request may have meant."""

    def __init__(self, status: int, message: str, choices: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.choices = list(choices)


@dataclass(frozen=True)
class _Links:
    """URLs within the app wherever it is mounted (the request's ``root_path``). Ids go in
    the query string, not the path: an id may hold any character, ``/`` included."""

    root: str

    @property
    def home(self) -> str:
        return f"{self.root}/"

    def action(self, name: str) -> str:
        return f"{self.root}/{name}"

    def document(self, collection: str, doc_id: Any, **extra: str) -> str:
        """The page of the document whose ``_id`` is ``doc_id``, exactly."""
        return self._document(collection, {"ref": id_json(doc_id), **extra})

    def recorded(self, collection: str, ref: str | None, typed: str) -> str:
        """The page of the document a report names by ``ref`` (its id as canonical
        Extended JSON), or by its id as text when it has none."""
        return self._document(collection, {"ref": ref} if ref is not None else {"id": typed})

    def typed(self, collection: str, raw: str) -> str:
        """The document an id shown as text names (a replica records its steps' ids so),
        found as an operator types it: a choice when it names two."""
        return self._document(collection, {"id": raw})

    def _document(self, collection: str, params: dict[str, str]) -> str:
        return f"{self.root}/document?{urlencode({'c': collection, **params})}"

    def confirm(self, action: str, collection: str, doc_id: Any) -> str:
        params = {"action": action, "c": collection, "ref": id_json(doc_id)}
        return f"{self.root}/confirm?{urlencode(params)}"


class _Page:
    def __init__(
        self, database: AsyncDatabase[Document], *, refresh: float, errors: int, replicas: str
    ) -> None:
        self.database = database
        self.operations = AsyncOperations(database, replicas_collection=replicas)
        self.refresh = refresh
        self.errors = errors
        self.replicas = replicas
        self.templates = Environment(
            loader=PackageLoader("orchestrator.web", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["text"] = _text
        self.templates.filters["seconds"] = _seconds
        self.templates.filters["ago"] = _ago

    def endpoint(
        self, handler: Callable[[Request, _Links], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` with its failures as pages: a refusal with its status, a database
        that does not answer as 503, never a traceback."""

        async def respond(request: Request) -> Response:
            links = _Links(str(request.scope.get("root_path", "")).rstrip("/"))
            try:
                response = await handler(request, links)
            except _Refused as exc:
                response = self.render(
                    links, "error.html", exc.status, message=str(exc), choices=exc.choices
                )
            except OperatorError as exc:
                response = self.render(links, "error.html", 400, message=str(exc))
            except StoreError as exc:
                message = f"the database did not answer: {exc}"
                response = self.render(links, "error.html", 503, message=message)
            response.headers.update(SECURITY_HEADERS)
            return response

        return respond

    def render(self, links: _Links, template: str, code: int = 200, **context: Any) -> Response:
        context.setdefault("refresh", None)
        context.setdefault("at", None)
        context.setdefault("choices", [])
        html = self.templates.get_template(template).render(
            links=links, database=self.database.name, **context
        )
        return HTMLResponse(html, status_code=code)

    # -- pages ----------------------------------------------------------------------------

    async def overview(self, request: Request, links: _Links) -> Response:
        status = await self.operations.status(errors=self.errors)
        latest = sorted(
            status.errors,
            key=lambda e: e.at or datetime.min.replace(tzinfo=UTC),
            reverse=True,
        )
        return self.render(
            links,
            "overview.html",
            refresh=self.refresh,
            at=status.at,
            status=status,
            totals=_totals(status),
            latest=latest,
            disagree={d.setting for d in status.disagreements},
        )

    async def document(self, request: Request, links: _Links) -> Response:
        params = request.query_params
        if not params.get("id") and not params.get("ref"):
            # Which one? A form, on a page that does not reload under the typing operator.
            return self.render(
                links,
                "find.html",
                collections=await self._collections(),
                chosen=params.get("c", ""),
            )
        collection, doc = await self._find(params, links)
        now = await self.operations.now()
        notice = NOTICES.get(request.query_params.get("done", ""))
        return self.render(
            links,
            "document.html",
            refresh=self.refresh,
            at=now,
            collection=collection,
            doc_id=doc["_id"],
            ref=id_json(doc["_id"]),
            state=await self._state(collection, doc, now),
            lease=[(label, name, doc.get(name, _MISSING)) for name, label in LEASE_ROWS],
            last_error=_error_view(doc.get("lastError")),
            previous_error=_error_view(doc.get("previousError")),
            fields=_other_fields(doc),
            notice=notice,
        )

    async def confirm(self, request: Request, links: _Links) -> Response:
        action = request.query_params.get("action")
        if action not in ("unlock", "retry"):
            raise _Refused(400, "unknown action: the page offers unlock and retry")
        collection, doc = await self._find(request.query_params, links)
        seen = {"phase": doc.get("phase"), "lockToken": doc.get("lockToken")}
        now = await self.operations.now()
        return self.render(
            links,
            "confirm.html",
            at=now,
            action=action,
            collection=collection,
            doc_id=doc["_id"],
            state=await self._state(collection, doc, now),
            phase=doc.get("phase", _MISSING),
            holder=doc.get("lockedBy", _MISSING),
            until=doc.get("lockedUntil", _MISSING),
            attempts=doc.get("attempts", 0),
            ref=id_json(doc["_id"]),
            seen=json_util.dumps(seen, json_options=CANONICAL_JSON_OPTIONS),
            target=error_phase(doc) or "",
            last_error=_error_view(doc.get("lastError")),
        )

    # -- actions --------------------------------------------------------------------------

    async def unlock(self, request: Request, links: _Links) -> Response:
        collection, doc_id, seen, _form = await self._action(request)
        async with self._applying(collection, doc_id):
            await self.operations.unlock(collection, seen)
        return RedirectResponse(links.document(collection, doc_id, done="unlocked"), 303)

    async def retry(self, request: Request, links: _Links) -> Response:
        collection, doc_id, seen, form = await self._action(request)
        target = form.get("phase", "").strip()
        if not target:
            raise _Refused(400, "name the phase to send the document back to")
        # Forced: the confirmation showed the lease, and warned when a replica held it.
        async with self._applying(collection, doc_id):
            retried = await self.operations.retry(collection, seen, target, force=True)
        done = "retried" if retried.server_time else "retried-local-clock"
        return RedirectResponse(links.document(collection, doc_id, done=done), 303)

    async def _action(self, request: Request) -> tuple[str, Any, dict[str, Any], dict[str, str]]:
        """The checked request of an action: its collection, document id, the state the
        operator confirmed (with the id: the document as they saw it), and the form."""
        refusal = _cross_site(request)
        if refusal is not None:
            raise _Refused(403, f"refused a cross-site request ({refusal})")
        form = await _form(request)
        collection = await self._collection(form.get("c"))
        doc_id = _parse_json(form.get("ref"), "document reference")
        seen = _parse_json(form.get("seen"), "confirmed state")
        if not isinstance(seen, dict):
            raise _Refused(400, "the confirmed state is not a document")
        return collection, doc_id, {**seen, "_id": doc_id}, form

    @asynccontextmanager
    async def _applying(self, collection: str, doc_id: Any) -> AsyncIterator[None]:
        """An action's refusals as the page words them."""
        try:
            yield
        except DocumentNotFound:
            raise _Refused(
                404, f"no document {_text(doc_id)} in collection {collection!r}"
            ) from None
        except DocumentChanged:
            raise _Refused(
                409,
                f"{collection}/{_text(doc_id)} changed since you confirmed (another operator, a "
                "replica or the application moved it): nothing was done; look again",
            ) from None

    # -- reads ----------------------------------------------------------------------------

    async def _collections(self) -> list[str]:
        """The database's collections but the replicas' own (no document to open there)."""
        return [name for name in await self.operations.collections() if name != self.replicas]

    async def _collection(self, name: str | None) -> str:
        if not name:
            raise _Refused(400, "which collection? give its name (c=...)")
        if name not in await self._collections():
            raise _Refused(404, f"no collection {name!r} in database {self.database.name!r}")
        return name

    async def _find(self, params: Mapping[str, str], links: _Links) -> tuple[str, Document]:
        """The document ``ref`` names exactly, or the one an id typed as text (``id``, as it
        is: ``"gw-1 "`` is not ``"gw-1"``) names; a typed id that names two is refused
        with a link to each."""
        collection = await self._collection(params.get("c"))
        ref, raw = params.get("ref"), params.get("id", "")
        try:
            if ref:
                doc_id = _parse_json(ref, "document reference")
                return collection, await self.operations.document(collection, doc_id)
            if raw:
                return collection, await self.operations.find(collection, raw)
        except DocumentNotFound:
            shown = raw or ref
            raise _Refused(404, f"no document {shown!r} in collection {collection!r}") from None
        except AmbiguousId as exc:
            choices = [
                (
                    f"{id_json(d['_id'])} (phase {_text(d.get('phase', _MISSING))})",
                    links.document(collection, d["_id"]),
                )
                for d in exc.documents
            ]
            message = f"{raw!r} names more than one document in {collection!r}: which one?"
            raise _Refused(300, message, choices) from None
        raise _Refused(400, "which document? give its id (id=...)")

    async def _state(self, collection: str, doc: Document, now: datetime) -> dict[str, Any]:
        """The document's lease state as the counts judge it (``queries.status_pipeline``)."""
        return _state(await self.operations.lease_state(collection, doc["_id"], now))


# -- requests ------------------------------------------------------------------------------


def _cross_site(request: Request) -> str | None:
    """Why a POST came from another site, or None: fetch metadata first, then ``Origin``
    against ``Host``; neither header is no browser's cross-site form (see the module)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    if origin == "null" or urlsplit(origin).netloc != request.headers.get("host"):
        return f"Origin {origin} is not this site"
    return None


async def _form(request: Request) -> dict[str, str]:
    """The url-encoded form of an action, at most ``MAX_FORM_BYTES``."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise _Refused(415, "an action is a form post (application/x-www-form-urlencoded)")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise _Refused(413, f"an action's form is at most {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(
            body.decode("utf-8", errors="replace"), keep_blank_values=True, max_num_fields=16
        )
    except ValueError as exc:
        raise _Refused(400, f"malformed form: {exc}") from None
    return {name: values[-1] for name, values in fields.items()}


def _parse_json(text: str | None, what: str) -> Any:
    if not text:
        raise _Refused(400, f"the form has no {what}")
    try:
        return json_util.loads(text, json_options=CANONICAL_JSON_OPTIONS)
    except (ValueError, TypeError, BSONError) as exc:
        raise _Refused(400, f"malformed {what}: {exc}") from None


# -- views ---------------------------------------------------------------------------------


class _Missing:
    def __str__(self) -> str:
        return "-"


_MISSING = _Missing()


def _totals(status: Status) -> dict[str, dict[str, int]]:
    """Per collection: documents, leased, overdue, waiting and failed over its phases."""
    totals: dict[str, dict[str, int]] = {}
    for row in status.phases:
        total = totals.setdefault(
            row.collection, dict.fromkeys(("count", "leased", "overdue", "waiting", "failed"), 0)
        )
        for name in total:
            total[name] += getattr(row, name)
    return totals


def _state(row: PhaseCount | None) -> dict[str, Any]:
    """A document's lease state as ``queries.status_pipeline`` judged it (the counts'
    own judgement, run on that one document)."""
    if row is None:
        return {"name": "no phase", "failed": False}
    for name in ("leased", "overdue", "waiting"):
        if getattr(row, name):
            return {"name": name, "failed": bool(row.failed)}
    return {"name": "free", "failed": bool(row.failed)}


def _error_view(error: Any) -> dict[str, Any] | None:
    """An error record's parts; a malformed one (not a document) shown as it is."""
    if error is None:
        return None
    if not isinstance(error, dict):
        return {"type": "?", "message": _text(error), "at": None, "phase": None}
    return {
        "type": _text(error.get("type", "?")),
        "message": _text(error.get("message", "")),
        "at": error.get("at"),
        "phase": error.get("phase"),
    }


def _other_fields(doc: Document) -> str:
    """The application's own fields, as relaxed Extended JSON, cut to ``MAX_FIELDS_SHOWN``."""
    rest = {name: value for name, value in doc.items() if name not in SHOWN_FIELDS}
    if not rest:
        return ""
    try:
        text = json_util.dumps(
            rest, indent=2, ensure_ascii=False, json_options=RELAXED_JSON_OPTIONS
        )
    except (TypeError, ValueError, BSONError):
        text = repr(rest)
    if len(text) > MAX_FIELDS_SHOWN:
        text = text[:MAX_FIELDS_SHOWN] + f"\n... ({len(text) - MAX_FIELDS_SHOWN} more characters)"
    return text


def _text(value: Any) -> str:
    """A value as text: strings as they are, ids and the rest by ``str``."""
    return value if isinstance(value, str) else str(value)


def _when(value: Any, now: datetime | None = None) -> str:
    """A stored time as UTC with how far it is from ``now``; anything else as text (a
    malformed ``lockedUntil`` is shown, not hidden)."""
    if not isinstance(value, datetime):
        return _text(value) if value is not _MISSING else "-"
    at = value if value.tzinfo else value.replace(tzinfo=UTC)
    shown = f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if at == EPOCH.replace(tzinfo=UTC):
        return f"{shown} (released)"
    if now is None:
        return shown
    seconds = (at - now).total_seconds()
    if abs(seconds) < 1:
        return f"{shown} (now)"
    span = _span(abs(seconds))
    return f"{shown} (in {span})" if seconds > 0 else f"{shown} ({span} ago)"


def _seconds(value: float) -> str:
    """A duration setting as the status command shows it: ``30s``, ``0.5s``."""
    return f"{value:g}s"


def _ago(value: datetime, now: datetime) -> str:
    """How long ago ``value`` was, by the server's time: ``12 s``, ``3 min``."""
    return _span(max((now - value).total_seconds(), 0.0))


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"
