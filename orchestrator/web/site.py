"""The page's frame: URLs within the app wherever it is mounted, rendering a template with
what every page carries (the pauses in force, the auto-refresh), the reads every page
shares (the cached status report, a collection, a document), and a handler's failures
as pages: a refusal with its status, a database that does not answer as 503, never a
traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from pymongo.asynchronous.database import AsyncDatabase
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.operations import (
    AmbiguousId,
    AsyncOperations,
    AsyncStatusCache,
    DocumentNotFound,
    OperatorError,
    Status,
    id_json,
)
from orchestrator.web.inputs import Refused, Resend, Selection, parse_ref
from orchestrator.web.permits import Permission, WebAction
from orchestrator.web.views import MISSING, Fleet, environment, text

__all__ = ["SECURITY_HEADERS", "Actor", "Links", "Site", "default_actor"]

logger = logging.getLogger("orchestrator.web")

NOT_PERMITTED = "not permitted"
"""Why the audit trail says an action was refused for who asked."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Actor = Callable[[Request], str]
"""Who acts, from the request: the application's signed-in user (``operator_app``)."""


def default_actor(request: Request) -> str:
    """``web`` and the client's address: who acted, when the application names no user."""
    client = request.client
    return f"web {client.host}" if client is not None else "web"


@dataclass(frozen=True)
class Links:
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

    def documents(self, selection: Selection, **extra: str) -> str:
        """The list of the documents ``selection`` selects."""
        return f"{self.root}/documents?{urlencode([*selection.params(), *extra.items()])}"

    def listed(self, collection: str, phase: str | None = None, state: str | None = None) -> str:
        """A count's list: ``collection``'s documents, of ``phase``, in lease ``state``."""
        params = [("c", collection)]
        params += [("phase", phase)] if phase is not None else []
        params += [("state", state)] if state is not None else []
        return f"{self.root}/documents?{urlencode(params)}"

    def bulk(self, action: str, selection: Selection) -> str:
        """The confirmation of ``action`` on every document ``selection`` selects."""
        return f"{self.root}/bulk?{urlencode([('action', action), *selection.params()])}"

    def pause(self, verb: str, collection: str, phase: str | None, handler: str | None) -> str:
        """The confirmation of ``verb`` (pause, resume) of a collection, phase or handler."""
        params = [("c", collection)]
        params += [("phase", phase)] if phase else []
        params += [("handler", handler)] if handler else []
        return f"{self.root}/{verb}?{urlencode(params)}"


class Site:
    """What every page shares: the operations, the status cache, the templates, who acts
    and what they may do."""

    def __init__(  # noqa: PLR0913  what every page shares, each keyword-only
        self,
        database: AsyncDatabase[Document],
        operations: AsyncOperations,
        cache: AsyncStatusCache,
        *,
        refresh: float,
        own: set[str],
        actor: Actor,
        permission: Permission,
        schedules: str,
    ) -> None:
        self.database = database.name
        self.operations = operations
        self.cache = cache
        self.refresh = refresh
        self.own = own
        """The library's own collections (replicas, pauses, audit): no documents there."""
        self.actor = actor
        self.permission = permission
        self.schedules = schedules
        """The schedules' collection, which the audit trail names for their actions."""
        self.templates = environment()

    def page(
        self, handler: Callable[[Request, Links], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` with its failures as pages, and the security headers."""

        async def respond(request: Request) -> Response:
            links = links_of(request)
            try:
                response = await handler(request, links)
            except Refused as exc:
                response = self.error(links, exc.status, str(exc), exc.choices, exc.resend)
            except OperatorError as exc:
                response = self.error(links, 400, str(exc))
            except ConfigError as exc:
                response = self.error(links, 404, str(exc))
            except StoreError as exc:
                response = self.error(links, 503, f"the database did not answer: {exc}")
            response.headers.update(SECURITY_HEADERS)
            return response

        return respond

    def error(
        self,
        links: Links,
        code: int,
        message: str,
        choices: list[tuple[str, str]] | None = None,
        resend: Resend | None = None,
    ) -> Response:
        """A refusal's page (no banner: it is drawn without reading the database)."""
        return self.html(
            links,
            "error.html",
            code,
            message=message,
            choices=choices or [],
            resend=resend,
            fleet=None,
        )

    async def render(
        self, request: Request, links: Links, template: str, code: int = 200, **context: Any
    ) -> Response:
        """A page with the pauses in force (from the cached status report unless the page
        read one), offering only the actions the request may take (``can``), reloading
        itself every ``refresh`` seconds when ``refreshing``: to its own URL without
        ``done``, so a banner saying what was done is shown once."""
        context["can"] = await self.permission.granted(request)
        status: Status = context.pop("status", None) or await self.status()
        context.setdefault("fleet", Fleet.of(status))
        context.setdefault("at", status.at)
        if context.pop("refreshing", False):
            context["refresh"] = self.refresh
            kept = [(k, v) for k, v in request.query_params.multi_items() if k != "done"]
            context["refresh_url"] = request.url.path + (f"?{urlencode(kept)}" if kept else "")
        return self.html(links, template, code, status=status, **context)

    def html(self, links: Links, template: str, code: int = 200, **context: Any) -> Response:
        context.setdefault("refresh", None)
        context.setdefault("refresh_url", None)
        context.setdefault("at", None)
        context.setdefault("notice", None)
        context.setdefault("can", frozenset())
        html = self.templates.get_template(template).render(
            links=links, database=self.database, **context
        )
        return HTMLResponse(html, status_code=code)

    async def status(self) -> Status:
        return await self.cache.status()

    async def allow(
        self,
        request: Request,
        action: WebAction,
        collection: str,
        *,
        scope: Mapping[str, Any] | None = None,
        documents: Sequence[str] = (),
        why: str = "",
    ) -> None:
        """Go on only if the application permits ``action`` to who asks (``operator_app``'s
        ``permit``); else refuse it (403), logged, and recorded in the audit trail with
        what it named (``collection``, ``scope``, ``documents``) and the reason given."""
        if await self.permission.allows(request, action):
            return
        by = self.actor(request)
        shown = ", ".join(documents) or ", ".join(f"{k}={v}" for k, v in (scope or {}).items())
        fields = {"outcome": "refused", "action": action.value, "by": by, "collection": collection}
        logger.warning(
            "operator's page: refused %s by %s on %s%s: not permitted",
            action.value,
            by,
            collection or "?",
            f" ({shown})" if shown else "",
            extra=fields,
        )
        try:
            await self.operations.refused(
                action.value,
                collection,
                because=NOT_PERMITTED,
                scope=scope,
                documents=documents,
                by=by,
                why=why,
            )
        except StoreError as exc:
            logger.error(
                "operator's page: the refusal could not be audited: %s",
                exc,
                extra={**fields, "outcome": "unaudited"},
            )
        raise self.forbidden(action)

    async def may(self, request: Request, action: WebAction) -> None:
        """Show the confirmation of ``action`` only to who may take it (403 else): a look
        at a confirmation does nothing, so it is not audited."""
        if not await self.permission.allows(request, action):
            raise self.forbidden(action)

    @staticmethod
    def forbidden(action: WebAction) -> Refused:
        return Refused(
            403,
            f"you may not {action.value.replace('_', ' ')} here: the application that serves "
            "this page lets you look, not take this action (operator_app's permit)",
            kind="Forbidden",
        )

    def changed(self) -> None:
        """An action changed the documents or the pauses: the next page reads them anew."""
        self.cache.invalidate()

    # -- reads --------------------------------------------------------------------------

    async def collections(self) -> list[str]:
        """The database's collections but the library's own (no documents to open there)."""
        return [name for name in await self.operations.collections() if name not in self.own]

    async def collection(self, name: str | None) -> str:
        if not name:
            raise Refused(400, "which collection? give its name (c=...)")
        if name not in await self.collections():
            raise Refused(
                404, f"no collection {name!r} in database {self.database!r}", kind="NotFound"
            )
        return name

    async def locate(self, params: Mapping[str, str]) -> tuple[str, Document]:
        """The document ``ref`` names exactly, or the one an id typed as text (``id``, as
        it is: ``"gw-1 "`` is not ``"gw-1"``), else its business key, names.

        :raises DocumentNotFound: it names none
        :raises AmbiguousId: a typed id names two
        """
        collection = await self.collection(params.get("c"))
        ref, raw = params.get("ref"), params.get("id", "")
        if ref:
            return collection, await self.operations.document(collection, parse_ref(ref))
        if raw:
            return collection, await self.operations.find(collection, raw)
        raise Refused(400, "which document? give its id (id=...)")

    async def find(self, params: Mapping[str, str], links: Links) -> tuple[str, Document]:
        """``locate``, its failures as the page says them: a typed id that names two is
        answered with a link to each."""
        try:
            return await self.locate(params)
        except DocumentNotFound:
            shown = params.get("id") or params.get("ref")
            collection = params.get("c")
            raise Refused(
                404, f"no document {shown!r} in collection {collection!r}", kind="NotFound"
            ) from None
        except AmbiguousId as exc:
            choices = [
                (
                    f"{id_json(d['_id'])} (phase {text(d.get('phase', MISSING))})",
                    links.document(exc.collection, d["_id"]),
                )
                for d in exc.documents
            ]
            message = (
                f"{exc.typed!r} names more than one document in {exc.collection!r}: which one?"
            )
            raise Refused(300, message, choices, kind="AmbiguousId") from None


def links_of(request: Request) -> Links:
    return Links(str(request.scope.get("root_path", "")).rstrip("/"))
