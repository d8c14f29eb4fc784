"""The audit trail: every operator's action, and every expired lease a replica took over.

One document per event in ``Settings.audit_collection``, each carrying its own expiry
(``expiresAt``, ``AUDIT_RETENTION`` after it by default), deleted by one TTL index as the
replicas' records are: the trail is bounded in time whatever the rate of actions. A
document's own history (``history``) says the same of that document; the trail says it
of the deployment (a bulk retry is one entry naming its filter and count, a replica's
death the leases taken from it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.redact import redact

AUDIT_RETENTION = 90 * 86_400.0
"""Seconds an entry is kept."""
AUDIT_INDEX: list[tuple[str, int]] = [("expiresAt", 1)]
AUDIT_SORT: list[tuple[str, int]] = [("at", -1), ("_id", -1)]
AUDIT_ORDER_INDEX: list[tuple[str, int]] = AUDIT_SORT
AUDIT_KEY_INDEX: list[tuple[str, int]] = [("keys", 1), *AUDIT_SORT]
"""Serves a search of the trail by business key (``keys``, each ``FIELD=VALUE``), latest
first."""
SHOWN_IN_ENTRY = 100
"""Documents (their ids, and their business keys) an entry names at most."""
FAILURE_LENGTH = 300
"""Most characters of a failure an entry keeps."""


class AuditKind(StrEnum):
    OPERATOR = "operator"
    TAKEOVER = "takeover"


@dataclass(frozen=True)
class OperatorAct:
    """Who did what, why and when: what every operator's entry starts with."""

    action: str
    by: str
    why: str
    at: datetime


def operator_record(  # noqa: PLR0913 - one record's fields, keyword-only past act
    act: OperatorAct,
    *,
    collection: str,
    scope: Mapping[str, Any],
    documents: Sequence[str],
    count: int,
    failed: str | None = None,
    refused: str | None = None,
    keys: Sequence[str | None] = (),
) -> dict[str, Any]:
    """An operator's ``act`` on ``collection``: ``scope`` the filter or pause it named (as
    text), ``documents`` the ids it changed (their first hundred, as Extended JSON),
    ``count`` how many it changed; ``failed``: why it stopped part way (``failure_text``),
    the changes before it counted, so no change goes unaudited; ``refused``: why it was
    refused before it did anything (the documents those it named), so an attempt by
    someone not permitted is on the trail too; ``keys``: the business key of each of
    ``documents`` (``FIELD=VALUE``, None for one without), stored only when one has one,
    so that the trail names documents as operators do and is searched by key. Kept
    ``AUDIT_RETENTION``."""
    record = {
        "kind": AuditKind.OPERATOR.value,
        "at": bson_time(act.at),
        "expiresAt": bson_time(act.at + timedelta(seconds=AUDIT_RETENTION)),
        "by": act.by,
        "action": act.action,
        "why": act.why,
        "collection": collection,
        "scope": dict(scope),
        "documents": list(documents[:SHOWN_IN_ENTRY]),
        "count": count,
    }
    if any(key is not None for key in keys[:SHOWN_IN_ENTRY]):
        record["keys"] = list(keys[:SHOWN_IN_ENTRY])
    if failed is not None:
        record["failed"] = failed
    if refused is not None:
        record["refused"] = refused
    return record


def failure_text(exc: BaseException) -> str:
    """An error as an entry keeps it: one line, its type first, redacted, bounded."""
    text = " ".join(redact(f"{type(exc).__name__}: {exc}").split())
    return text[:FAILURE_LENGTH]


def takeover_record(
    *, at: datetime, by: str, taken_from: str, collection: str, document: str, phase: Any
) -> dict[str, Any]:
    """Replica ``by`` claimed ``document``, whose lease ``taken_from`` held and never
    released: that replica died, stalled or lost the database."""
    return {
        "kind": AuditKind.TAKEOVER.value,
        "at": bson_time(at),
        "expiresAt": bson_time(at + timedelta(seconds=AUDIT_RETENTION)),
        "by": by,
        "action": "takeover",
        "why": f"the lease of {taken_from} expired unreleased",
        "takenFrom": taken_from,
        "collection": collection,
        "scope": {"phase": phase},
        "documents": [document],
        "count": 1,
    }


@dataclass(frozen=True)
class AuditEntry:
    """An entry as tools show it, whatever the stored document held."""

    kind: str
    at: datetime | None
    by: str
    action: str
    why: str
    collection: str
    scope: dict[str, str]
    documents: tuple[str, ...]
    count: int
    taken_from: str | None
    failed: str | None = None
    """Why the action stopped part way (``count`` changed before it); None: it finished."""
    refused: str | None = None
    """Why the action was refused before it did anything; None: it was not."""
    keys: tuple[str | None, ...] = ()
    """The business key of each of ``documents`` (``FIELD=VALUE``), None for one without:
    () for an entry that names none (or written before keys were recorded)."""

    @classmethod
    def read(cls, doc: Mapping[str, Any]) -> AuditEntry:
        at, scope, docs, count = (
            doc.get("at"),
            doc.get("scope"),
            doc.get("documents"),
            doc.get("count"),
        )
        taken, failed, refused = doc.get("takenFrom"), doc.get("failed"), doc.get("refused")
        keys = doc.get("keys")
        return cls(
            kind=str(doc.get("kind", "?")),
            at=as_utc(at) if isinstance(at, datetime) else None,
            by=str(doc.get("by", "")),
            action=str(doc.get("action", "?")),
            why=str(doc.get("why", "")),
            collection=str(doc.get("collection", "")),
            scope={str(k): _text(v) for k, v in scope.items()} if isinstance(scope, dict) else {},
            documents=tuple(str(d) for d in docs) if isinstance(docs, list) else (),
            count=count if isinstance(count, int) and not isinstance(count, bool) else 0,
            taken_from=None if taken is None else str(taken),
            failed=None if failed is None else str(failed),
            refused=None if refused is None else str(refused),
            keys=tuple(None if k is None else str(k) for k in keys)
            if isinstance(keys, list)
            else (),
        )

    def named(self) -> list[tuple[str, str | None]]:
        """Each document the entry names: its id (as recorded) and its business key."""
        keys = self.keys + (None,) * (len(self.documents) - len(self.keys))
        return list(zip(self.documents, keys, strict=False))

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["at"] = self.at.isoformat() if self.at is not None else None
        data["documents"] = list(self.documents)
        data["keys"] = list(self.keys)
        return data


def _text(value: Any) -> str:
    """A scope's value as text: a filter's phases (a list) as ``A,B``, as typed."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


__all__ = [
    "AUDIT_KEY_INDEX",
    "AUDIT_RETENTION",
    "AuditEntry",
    "AuditKind",
    "OperatorAct",
    "failure_text",
    "operator_record",
    "takeover_record",
]
