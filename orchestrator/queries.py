"""Every MongoDB filter and update the orchestrator sends, as pure functions.

This is the one place to read how a claim, a release or a failure is written. Each
function returns plain dicts, so it can be checked without a database. Times are naive
UTC truncated to milliseconds, as BSON stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
from bson import ObjectId
from bson.errors import BSONError

from orchestrator.errors import ConfigError
from orchestrator.redact import redact
from orchestrator.resource import EPOCH, LEASE_FIELDS

CLAIM_SORT: list[tuple[str, int]] = [("lockedAt", 1), ("updatedAt", 1)]
"""Oldest lease first (its wait is longest overdue), then the longest untouched."""

CLAIM_INDEX: list[tuple[str, int]] = [("phase", 1), ("lockedAt", 1), ("updatedAt", 1)]
"""Serves the claim filter (phase equality, lockedAt range) and its sort without a scan."""

CLAIM_INDEX_NAME = "orchestrator_claim"


def bson_time(value: datetime) -> datetime:
    """Naive UTC with millisecond precision: what the server will hand back."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def as_utc(value: datetime) -> datetime:
    """Aware UTC, whatever the client's ``tz_aware`` setting gave us."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def claim_filter(
    match: Mapping[str, Any], now: datetime, lock_timeout: float, max_wait: float
) -> dict[str, Any]:
    """The handler's filter, limited to documents nobody holds: ``lockedAt`` is not a live
    lease, a date in ``[now - lock_timeout, now + max_wait]``.

    So besides expired leases it matches what no replica writes: a missing, null or
    non-date ``lockedAt`` (claimable at once; they sort first) and a date past
    ``now + max_wait``, which no relock produces (its wait is capped by ``max_wait``): a
    lease that would never expire. Both branches are index ranges on (phase, lockedAt) —
    ``$not $gte`` is the complement ``[MinKey, cutoff)`` plus the types sorting after
    dates — each scanned in index order, so the server merges them for the sort.
    """
    cutoff = bson_time(now - timedelta(seconds=lock_timeout))
    horizon = bson_time(now + timedelta(seconds=max_wait))
    free = [{"lockedAt": {"$not": {"$gte": cutoff}}}, {"lockedAt": {"$gt": horizon}}]
    if "$or" in match:
        return {"$and": [dict(match), {"$or": free}]}
    return {**match, "$or": free}


def probe_filter(
    matches: Iterable[Mapping[str, Any]], now: datetime, lock_timeout: float, max_wait: float
) -> dict[str, Any]:
    """What any of several handlers could claim now: the ``$or`` of their claim filters, so
    one read finding nothing proves that none of their claims would find anything."""
    return {"$or": [claim_filter(m, now, lock_timeout, max_wait) for m in matches]}


PROBE_PROJECTION: dict[str, Any] = {"_id": 1}
"""A probe only asks whether work exists: it reads no field of it."""


def claim_update(now: datetime, token: str, replica: str) -> dict[str, Any]:
    """Take the lease: a fresh token fences every later write to this holder."""
    return {"$set": {"lockedAt": bson_time(now), "lockToken": token, "lockedBy": replica}}


def fenced(doc_id: Any, token: str) -> dict[str, Any]:
    """Matches the document only while this lease holds it."""
    return {"_id": doc_id, "lockToken": token}


def extend_update(now: datetime) -> dict[str, Any]:
    return {"$set": {"lockedAt": bson_time(now)}}


def unlock_update(fields: Mapping[str, Any], locked_at: datetime = EPOCH) -> dict[str, Any]:
    """Release for the next step at once (``lockedAt`` at the epoch, unless throttled);
    a step that succeeded resets the attempt count."""
    return {
        "$set": {**fields, "lockedAt": bson_time(locked_at), "attempts": 0},
        "$unset": {"lockToken": ""},
    }


def release_update() -> dict[str, Any]:
    """Claimable at once, counters untouched: a lease whose step never started, or an
    operator's unlock (a live holder's later writes then raise LeaseLost)."""
    return {"$set": {"lockedAt": EPOCH}, "$unset": {"lockToken": ""}}


def relock_update(locked_at: datetime, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Release, claimable again when ``locked_at`` falls behind the lock timeout.

    ``updatedAt`` is kept: it measures the time spent in this phase, which the
    progressive policy grows its wait from.
    """
    return {
        "$set": {**fields, "lockedAt": bson_time(locked_at), "attempts": 0},
        "$inc": {"relocks": 1},
        "$unset": {"lockToken": ""},
    }


def advance_update(phase: str, now: datetime, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Enter ``phase``, released at once, with the per-phase counters reset."""
    return {
        "$set": {
            **fields,
            "phase": phase,
            "lockedAt": EPOCH,
            "updatedAt": bson_time(now),
            "attempts": 0,
            "relocks": 0,
        },
        "$unset": {"lockToken": "", "lastError": ""},
    }


def error_record(kind: str, message: str, now: datetime, phase: str | None) -> dict[str, Any]:
    """Any exception's text must be storable (BSON refuses lone surrogates) and must not
    carry credentials to operators' screens."""
    return {
        "type": _storable_text(kind)[:200],
        "message": redact(_storable_text(message))[:2000],
        "at": bson_time(now),
        "phase": phase,
    }


def _storable_text(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def retry_update(attempts: int, error: Mapping[str, Any], locked_at: datetime) -> dict[str, Any]:
    """Record a failed attempt and release, claimable again after the retry backoff."""
    return {
        "$set": {"attempts": attempts, "lastError": dict(error), "lockedAt": bson_time(locked_at)},
        "$unset": {"lockToken": ""},
    }


def fail_update(
    failed_phase: str, attempts: int, error: Mapping[str, Any], now: datetime
) -> dict[str, Any]:
    """Give up: the failed phase, the error kept for operators, released."""
    return {
        "$set": {
            "phase": failed_phase,
            "attempts": attempts,
            "lastError": dict(error),
            "lockedAt": EPOCH,
            "updatedAt": bson_time(now),
        },
        "$unset": {"lockToken": ""},
    }


def new_document(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A submitted document: unlocked, in its first phase, with no lease history."""
    stamped = bson_time(now)
    fresh = {k: v for k, v in doc.items() if k not in LEASE_FIELDS}
    fresh.update(lockedAt=EPOCH, attempts=0, relocks=0, createdAt=stamped, updatedAt=stamped)
    return fresh


def unique_filter(doc: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The identity of ``doc`` by its unique keys; every key must be present."""
    missing = [k for k in keys if k not in doc or doc[k] is None]
    if missing:
        raise ConfigError(f"submit: the document has no value for its unique key(s) {missing}")
    return {k: doc[k] for k in keys}


def check_fields(fields: Mapping[str, Any], *, reserved: frozenset[str] = LEASE_FIELDS) -> None:
    """Refuse field names that would corrupt the lease or be read as update operators."""
    for key, value in fields.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"field names must be non-empty strings, got {key!r}")
        if key.startswith("$") or "\x00" in key:
            raise ConfigError(f"field name {key!r} is not allowed: it starts with '$'")
        if key in reserved or key.split(".", 1)[0] in reserved | {"phase", "_id", "updatedAt"}:
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


def _check_nested(value: Any, path: str) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if isinstance(key, str) and key.startswith("$"):
                raise ConfigError(f"field {path}.{key} is not allowed: it starts with '$'")
            _check_nested(inner, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for inner in value:
            _check_nested(inner, path)


def check_match(match: Mapping[str, Any]) -> None:
    """A handler's filter may select on anything but the lease fields it is combined with."""
    if not isinstance(match, Mapping) or not match:
        raise ConfigError("a handler's filter must be a non-empty dict")
    clash = sorted(set(match) & {"lockedAt", "lockToken"})
    if clash:
        raise ConfigError(f"a handler's filter cannot select on {clash}: the claim owns them")


# -- operators: status, unlock, retry ------------------------------------------------------

ERRORS_SORT: list[tuple[str, int]] = [("lastError.at", -1)]
"""Latest failure first."""


def status_pipeline(now: datetime, lock_timeout: float) -> list[dict[str, Any]]:
    """Per phase: documents, leases held now, leases held past their timeout (the holder
    died or is stuck), documents waiting out a relock or retry, and documents whose last
    attempt failed."""
    cutoff = bson_time(now - timedelta(seconds=lock_timeout))
    token = {"$ifNull": ["$lockToken", None]}
    held, free = {"$gt": [token, None]}, {"$lte": [token, None]}
    fresh, stale = {"$gte": ["$lockedAt", cutoff]}, {"$lt": ["$lockedAt", cutoff]}

    def count_if(condition: dict[str, Any]) -> dict[str, Any]:
        return {"$sum": {"$cond": [condition, 1, 0]}}

    return [
        # Documents without a lockedAt count too: the claim treats them as free.
        {"$match": {"phase": {"$exists": True}}},
        {
            "$group": {
                "_id": "$phase",
                "count": {"$sum": 1},
                "leased": count_if({"$and": [held, fresh]}),
                "overdue": count_if({"$and": [held, stale]}),
                "waiting": count_if({"$and": [free, fresh]}),
                "failed": count_if({"$gt": [{"$ifNull": ["$lastError", None]}, None]}),
            }
        },
        {"$sort": {"_id": 1}},
    ]


def errors_filter() -> dict[str, Any]:
    return {"lastError": {"$exists": True}}


ERRORS_PROJECTION = {"phase": 1, "lastError": 1, "attempts": 1}


def id_filter(raw: str) -> dict[str, Any]:
    """An id typed by an operator: an ObjectId's hex form matches the ObjectId or the string."""
    if ObjectId.is_valid(raw) and len(raw) == 24:
        return {"_id": {"$in": [ObjectId(raw), raw]}}
    return {"_id": raw}


def operator_retry_update(phase: str, now: datetime) -> dict[str, Any]:
    """Back to ``phase`` with fresh counters, claimable at once; the error is kept as
    ``previousError`` so the operator's reason to retry stays visible."""
    update = advance_update(phase, now, {})
    update["$unset"] = {"lockToken": ""}
    update["$rename"] = {"lastError": "previousError"}
    return update
