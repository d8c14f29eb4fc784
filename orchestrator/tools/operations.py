"""The operator's actions, unlock and retry, decided once for the command line and the page.

Each action is planned from the document as the operator saw it: the plan holds the
filter that applies it only while the document is still so (``queries.operator_guard``:
its phase and its lease token) and the update. The command line and the page carry it
out with their own store (sync or async), so what an action means cannot differ between
them. Which document an operator means is settled here too: an id typed as text may name
two documents (the string ``"42"`` and the integer ``42``), and is then refused with the
exact forms that tell them apart, never applied to one of them.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS

from orchestrator.core import queries
from orchestrator.core.queries import as_utc
from orchestrator.mongo import AsyncStore, Store
from orchestrator.mongo.common import Document
from orchestrator.runners.plans import Plan
from orchestrator.tools.loading import CommandError


@dataclass(frozen=True)
class Retry:
    """Send ``doc_id`` from ``source`` back to ``target`` with fresh counters."""

    collection: str
    doc_id: Any
    source: Any
    target: str
    guard: dict[str, Any]

    def update(self, now: datetime) -> dict[str, Any]:
        """The update at ``now``, the server's time: ``updatedAt`` starts the phase's clock
        for the replicas' backoff, so it must be on the clock they judge by."""
        return queries.operator_retry_update(self.target, now)


@dataclass(frozen=True)
class Unlock:
    """Make ``doc_id`` claimable at once; a live holder's later writes raise ``LeaseLost``."""

    collection: str
    doc_id: Any
    guard: dict[str, Any]

    def update(self) -> dict[str, Any]:
        return queries.release_update()


def error_phase(doc: Document) -> str | None:
    """The phase the document's last error happened in, where a retry sends it by default."""
    error = doc.get("lastError")
    phase = error.get("phase") if isinstance(error, dict) else None
    return phase if isinstance(phase, str) and phase else None


def live_lease(doc: Document, now: datetime) -> bool:
    """Whether a replica holds ``doc`` now: a lease token with a ``lockedUntil`` after
    ``now``, the server's time (as the status counts judge ``leased``). An expired lease
    is no one's: its holder died or is stuck, and any replica may claim it."""
    until = doc.get("lockedUntil")
    return doc.get("lockToken") is not None and isinstance(until, datetime) and as_utc(until) > now


def plan_retry(collection: str, doc_id: Any, source: Any, token: Any, target: str) -> Retry:
    """Back to ``target``, applied only while the document is still in ``source`` and held
    by the lease ``token`` (or by none, for None), as the operator saw it: a retry
    confirmed on a free document never takes the lease of a replica that claimed it
    since. ``CommandError`` when ``target`` is no phase name."""
    if not target or target.startswith("$"):
        raise CommandError(f"{target!r} is not a phase name")
    guard = queries.operator_guard(doc_id, source, token)
    return Retry(collection, doc_id, source, target, guard)


def plan_unlock(collection: str, doc_id: Any, phase: Any, token: Any) -> Unlock:
    """Release the lease, applied only while the document is in ``phase`` and held by the
    lease ``token`` (or by none, for None), as the operator saw it: an unlock confirmed
    for one holder never releases the next one's."""
    return Unlock(collection, doc_id, queries.operator_guard(doc_id, phase, token))


# -- which document ------------------------------------------------------------------------


def id_json(doc_id: Any) -> str:
    """``doc_id`` as canonical Extended JSON: exact whatever its type (``42`` is
    ``{"$numberInt": "42"}``, the string ``"42"`` is ``"42"``), so it round-trips through
    a link, a form or a command line to the very same id."""
    return json_util.dumps(doc_id, json_options=CANONICAL_JSON_OPTIONS)


def parse_id_json(text: str) -> Any:
    """An id given as Extended JSON (``id_json``'s form; plain JSON too): ``CommandError``
    when it is not."""
    try:
        return json_util.loads(text, json_options=CANONICAL_JSON_OPTIONS)
    except (ValueError, TypeError, BSONError) as exc:
        raise CommandError(f"malformed Extended JSON id {text!r}: {exc}") from None


def find_typed(store: Store | AsyncStore, collection: str, raw: str) -> Plan[list[Document]]:
    """The documents an id typed as ``raw`` names (``queries.id_filter``: an ObjectId's hex
    or an integer's digits name that value and the string alike): none, one, or two when
    both exist, as a plan either store carries out (``runners.base``)."""
    query = queries.id_filter(raw)
    first: Document | None = yield partial(store.find_one, collection, query)
    if first is None or not isinstance(query["_id"], dict):
        return [] if first is None else [first]
    other_query = {"$and": [query, {"_id": {"$ne": first["_id"]}}]}
    other: Document | None = yield partial(store.find_one, collection, other_query)
    return [first] if other is None else [first, other]


def ambiguous(collection: str, raw: str, docs: Iterable[Document], option: str) -> str:
    """Why ``raw`` is refused on the command line: the documents it names, each with the
    Extended JSON that names it alone, quoted for a shell, to give as ``option``."""
    forms = " or ".join(f"{option} {shlex.quote(id_json(doc['_id']))}" for doc in docs)
    return f"{raw!r} names more than one document in {collection!r}: say which with {forms}"


__all__ = [
    "Retry",
    "Unlock",
    "ambiguous",
    "error_phase",
    "find_typed",
    "id_json",
    "live_lease",
    "parse_id_json",
    "plan_retry",
    "plan_unlock",
]
