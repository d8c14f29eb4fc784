"""Sent by a lease's holder: every write of a step under its lease (a release, relock,
advance, retry or failure, a carry into the next step, an extension, a late error's note)
and the fence that makes a stale holder's write land nowhere (``fenced``,
``released_fence``).

Each function returns plain dicts, so it can be checked without a database.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from orchestrator.core import retention
from orchestrator.core.clock import bson_time
from orchestrator.core.queries.claims import claim_update, pinned
from orchestrator.core.redact import redact
from orchestrator.core.resource import EPOCH, EXPIRY_FIELD

_ANY = object()


def fenced(
    doc_id: Any, token: str, phase: Any = _ANY, pins: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Matches the document only while this lease holds it (and, for writes that change the
    phase, only while it is still in ``phase``: an outside writer's phase change wins).
    ``pins``: its shard key (``shard_filter``), so the write targets its shard."""
    query: dict[str, Any] = {"_id": doc_id, "lockToken": token}
    if phase is not _ANY:
        query["phase"] = phase
    return pinned(query, pins) if pins else query


def released_fence(
    doc_id: Any,
    token: str,
    until: datetime,
    phase: Any,
    *,
    pins: Mapping[str, Any] | None = None,
    holder: str | None = None,
) -> dict[str, Any]:
    """Matches the document while it is as a step's own release left it (free, released
    by this lease: its token as ``lastToken``, the same ``lockedUntil`` and phase): how a
    step that gave an outcome and then failed still notes its error. Any later claim
    and release, by another replica or an operator's retry, changes ``lastToken``, so a
    stale note never lands on a state another step left. ``pins`` as for ``fenced``;
    ``holder``: the token the release carried on into the next step (``carry_update``),
    which holds it meanwhile."""
    query = {
        "_id": doc_id,
        "lockToken": {"$exists": False} if holder is None else holder,
        "lastToken": token,
        "lockedUntil": bson_time(until),
        "phase": phase,
    }
    return pinned(query, pins) if pins else query


def carry_update(
    update: Mapping[str, Any], now: datetime, until: datetime, token: str, replica: str
) -> dict[str, Any]:
    """A step's releasing ``update`` (an unlock or an advance) that takes the lease on for
    the next step instead of letting it go: the same outcome, the history entry and
    ``lastToken`` included, with a fresh ``token`` until ``until``, as a claim would have
    written it. One write where a release and a claim made two. ``update`` is left as it
    was; the operators' fields the carry does not change are shared with it."""
    carried = dict(update)
    carried["$set"] = {**update.get("$set", {}), **claim_update(now, until, token, replica)["$set"]}
    if "$unset" in update:
        unset = {k: v for k, v in update["$unset"].items() if k != "lockToken"}
        if unset:
            carried["$unset"] = unset
        else:
            del carried["$unset"]
    return carried


def stamp_release(update: dict[str, Any], token: str) -> dict[str, Any]:
    """``update`` (a releasing write of the lease ``token``) leaving the token behind as
    ``lastToken``: what ``released_fence`` recognises. Changed in place, and returned."""
    update.setdefault("$set", {})["lastToken"] = token
    return update


def note_update(error: Mapping[str, Any]) -> dict[str, Any]:
    """An error raised after the step's outcome moved the document on: kept as
    ``lastError``; the phase, the attempts and the lease stay as the outcome left them."""
    return {"$set": {"lastError": dict(error)}}


def extend_update(now: datetime, until: datetime) -> dict[str, Any]:
    return {"$set": {"lockedAt": bson_time(now), "lockedUntil": bson_time(until)}}


_SUCCEEDED = {"lastError": "previousError"}
"""A step that succeeds ends the streak of failures: ``lastError`` describes the current
streak only, and the last one stays visible to operators as ``previousError``."""


def unlock_update(fields: Mapping[str, Any], until: datetime = EPOCH) -> dict[str, Any]:
    """Release for the next step at once (``lockedUntil`` at the epoch, unless throttled);
    a step that succeeded resets the attempt count."""
    return {
        "$set": {**fields, "lockedUntil": bson_time(until), "attempts": 0},
        "$unset": {"lockToken": ""},
        "$rename": dict(_SUCCEEDED),
    }


def release_update(until: datetime = EPOCH) -> dict[str, Any]:
    """Claimable at once (unless throttled), counters untouched: a lease whose step never
    ran, or an operator's unlock (a live holder's later writes then raise LeaseLost)."""
    return {"$set": {"lockedUntil": bson_time(until)}, "$unset": {"lockToken": ""}}


def relock_update(until: datetime, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Release, claimable again at ``until``.

    ``updatedAt`` is kept: it measures the time spent in this phase, which the
    progressive policy grows its wait from.
    """
    return {
        "$set": {**fields, "lockedUntil": bson_time(until), "attempts": 0},
        "$inc": {"relocks": 1},
        "$unset": {"lockToken": ""},
        "$rename": dict(_SUCCEEDED),
    }


def advance_update(
    phase: str, now: datetime, fields: Mapping[str, Any], until: datetime = EPOCH
) -> dict[str, Any]:
    """Enter ``phase``, released (at once unless throttled), with the per-phase counters
    reset and the failed-by mark cleared."""
    return {
        "$set": {
            **fields,
            "phase": phase,
            "lockedUntil": bson_time(until),
            "updatedAt": bson_time(now),
            "attempts": 0,
            "relocks": 0,
        },
        "$unset": {"lockToken": "", "failedBy": ""},
        "$rename": dict(_SUCCEEDED),
    }


def expiring(
    update: Mapping[str, Any], phase: str, now: datetime, kept: retention.Retention
) -> dict[str, Any]:
    """``update`` (a write that enters ``phase`` at ``now``) with the date the server
    deletes the document by when its collection retains that phase (``kept``), or
    unsetting an earlier one when it does not: in that same write. A collection with no
    retention writes as before."""
    if not kept:
        return dict(update)
    seconds = kept.get(phase)
    if seconds is None:
        return {**update, "$unset": {**update.get("$unset", {}), EXPIRY_FIELD: ""}}
    date = bson_time(retention.expiry(now, seconds))
    dated = {**update, "$set": {**update.get("$set", {}), EXPIRY_FIELD: date}}
    unset = {k: v for k, v in update.get("$unset", {}).items() if k != EXPIRY_FIELD}
    if unset:
        dated["$unset"] = unset
    else:
        dated.pop("$unset", None)
    return dated


def error_record(
    kind: str, message: str, now: datetime, phase: str | None, trace: str | None = None
) -> dict[str, Any]:
    """Any exception's text must be storable (BSON refuses lone surrogates) and must not
    carry credentials to operators' screens. ``trace``: its traceback, already bounded
    and redacted (``history.trace_text``)."""
    record = {
        "type": _storable_text(kind)[:200],
        "message": redact(_storable_text(message))[:2000],
        "at": bson_time(now),
        "phase": phase,
    }
    if trace is not None:
        record["traceback"] = trace
    return record


def _storable_text(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def retry_update(attempts: int, error: Mapping[str, Any], until: datetime) -> dict[str, Any]:
    """Record a failed attempt and release, claimable again after the retry backoff."""
    return {
        "$set": {"attempts": attempts, "lastError": dict(error), "lockedUntil": bson_time(until)},
        "$unset": {"lockToken": ""},
    }


def unrecorded(update: Mapping[str, Any]) -> dict[str, Any]:
    """A retry's or a failure's ``update`` storing no error at all (``lastError`` and
    ``previousError`` dropped): the attempt counts on a document at 16 MiB, which it grows
    by nothing the claim did not add (``lastToken`` takes ``lockToken``'s place) but the
    failed phase's mark."""
    sets = {k: v for k, v in update["$set"].items() if k != "lastError"}
    unset = {**update.get("$unset", {}), "lastError": "", "previousError": ""}
    return {**update, "$set": sets, "$unset": unset}


def fail_update(
    failed_phase: str,
    attempts: int,
    error: Mapping[str, Any],
    now: datetime,
    failed_by: str,
    *,
    until: datetime = EPOCH,
) -> dict[str, Any]:
    """Give up: the failed phase, the error kept for operators, released; ``failedBy``
    (the handler's key) keeps the handler that gave up from claiming the document again
    while it stays in that phase (``failed_exclusion``)."""
    return {
        "$set": {
            "phase": failed_phase,
            "attempts": attempts,
            "lastError": dict(error),
            "failedBy": failed_by,
            "lockedUntil": bson_time(until),
            "updatedAt": bson_time(now),
        },
        "$unset": {"lockToken": ""},
    }
