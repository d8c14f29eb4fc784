"""Sent by ``submit``: the new document and the identity its unique keys give it, with the
checks of the fields an application writes (submitted, or set by a step).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import bson
from bson.errors import BSONError

from orchestrator.core.clock import bson_time
from orchestrator.core.errors import ConfigError
from orchestrator.core.resource import (
    EPOCH,
    EXPIRY_FIELD,
    LEASE_FIELDS,
    PRIORITY_FIELD,
    TRACE_FIELD,
)
from orchestrator.core.retention import Retention, expiry


def new_document(
    doc: Mapping[str, Any],
    now: datetime,
    carrier: Mapping[str, str] | None = None,
    *,
    until: datetime = EPOCH,
    priority: int = 0,
) -> dict[str, Any]:
    """A submitted document: unlocked, in its first phase, with no lease history;
    claimable from ``until`` (``start_time``: a wait, as a relock's, so every claim,
    probe and count already treats it so) and stored with its ``priority`` when it has
    one (``PRIORITY_FIELD``); with the listeners' ``carrier`` (a trace context) when they
    gave one, none stored else."""
    stamped = bson_time(now)
    fresh = {k: v for k, v in doc.items() if k not in LEASE_FIELDS}
    fresh.update(
        lockedUntil=bson_time(until), attempts=0, relocks=0, createdAt=stamped, updatedAt=stamped
    )
    if priority:
        fresh[PRIORITY_FIELD] = priority
    if carrier:
        fresh[TRACE_FIELD] = dict(carrier)
    return fresh


def expiring(doc: dict[str, Any], now: datetime, kept: Retention) -> dict[str, Any]:
    """A new document submitted into a phase its collection retains (``kept``), with the
    date the server deletes it by; ``doc`` as it is otherwise."""
    phase = doc.get("phase")
    seconds = kept.get(phase) if isinstance(phase, str) else None
    if seconds is not None:
        doc[EXPIRY_FIELD] = bson_time(expiry(now, seconds))
    return doc


def leased(doc: Mapping[str, Any], lease: Mapping[str, Any]) -> dict[str, Any]:
    """A new document created already leased (``lease``: ``claims.claim_update``, whose
    fields it takes), with its ``_id`` chosen here when it has none, so the lease's fenced
    writes can name it even when the insert's answer is lost."""
    created = {**doc, **lease["$set"]}
    created.setdefault("_id", bson.ObjectId())
    return created


def unique_filter(doc: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The identity of ``doc`` by its unique keys; every key must be present."""
    missing = [k for k in keys if k not in doc or doc[k] is None]
    if missing:
        raise ConfigError(f"submit: the document has no value for its unique key(s) {missing}")
    return {k: doc[k] for k in keys}


_MANAGED = frozenset({"phase", "_id", "updatedAt"})
"""Managed by the orchestrator beside the lease's fields, dotted paths into them too."""
_LEASE_MANAGED = LEASE_FIELDS | _MANAGED


def check_fields(fields: Mapping[str, Any], *, reserved: frozenset[str] = LEASE_FIELDS) -> None:
    """Refuse field names that would corrupt the lease or be read as update operators."""
    managed = _LEASE_MANAGED if reserved is LEASE_FIELDS else reserved | _MANAGED
    for key, value in fields.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"field names must be non-empty strings, got {key!r}")
        if key.startswith("$") or "\x00" in key:
            raise ConfigError(f"field name {key!r} is not allowed: it starts with '$'")
        if key in reserved or key.split(".", 1)[0] in managed:
            raise ConfigError(f"field {key!r} is managed by the orchestrator")
        _check_nested(value, key)
    _check_storable(fields)


MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""MongoDB's document size limit."""


def _check_storable(fields: Mapping[str, Any]) -> None:
    """Refuse here what the server would refuse (mongomock stores anything), so the error
    is the same, and clear, on both."""
    try:
        size = len(bson.encode(fields))
    except (BSONError, UnicodeError, OverflowError, TypeError) as exc:
        raise ConfigError(f"fields cannot be stored in MongoDB: {exc}") from exc
    if size > MAX_DOCUMENT_BYTES:
        raise ConfigError(
            f"fields take {size} bytes; a MongoDB document holds at most {MAX_DOCUMENT_BYTES}"
        )


SCALARS = frozenset({str, int, float, bool, type(None)})
"""Types whose values hold nothing nested (exactly these: no subclass), told at once,
without ``isinstance``'s check through an abstract class (``Mapping``, a model)."""


def _check_nested(value: Any, path: str) -> None:
    if type(value) in SCALARS:
        return
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if isinstance(key, str) and key.startswith("$"):
                raise ConfigError(f"field {path}.{key} is not allowed: it starts with '$'")
            _check_nested(inner, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for inner in value:
            _check_nested(inner, path)
