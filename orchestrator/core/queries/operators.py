"""Sent by the operators' tools (the command line, the page, ``Operations``): the status
counts, the latest errors, finding a document by a typed id, and the guarded changes of an
unlock, a retry or a cancel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from bson import ObjectId

from orchestrator.core.clock import bson_time
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.queries.lease_writes import advance_update, expiring, release_update
from orchestrator.core.resource import EXPIRY_FIELD
from orchestrator.core.retention import NO_RETENTION, Retention
from orchestrator.core.trees import WAIT_FIELD

_ANY = object()


ERRORS_INDEX: list[tuple[str, int]] = [("phase", 1), ("lastError.at", -1), ("_id", -1)]
"""Serves the latest errors of a phase (or, merged, of every phase): the status report's
and the failed documents' list. Its keys change only when a step fails or a document
changes phase, not at every claim."""


ERRORS_SORT: list[tuple[str, int]] = [("lastError.at", -1), ("_id", -1)]
"""Latest failure first: ``ERRORS_INDEX``'s order within a phase."""


def status_pipeline(
    now: datetime, match: Mapping[str, Any] | None = None, in_house: InHouse = NO_IN_HOUSE
) -> list[dict[str, Any]]:
    """Per phase: documents, leases held now, leases held past their expiry (the holder
    died or is stuck), documents waiting out a relock or retry, documents whose latest
    attempt failed and that are tried again (``retrying``: an error, no ``failedBy``
    mark), and documents a handler gave up on (``failed``: the mark). Every lease carries
    its expiry, so no lock timeout is needed here.

    ``match`` narrows it to some documents (the operator's page judges one document's
    lease with it), so one judgement serves the counts and a single document alike.
    ``in_house`` (the live replicas', ``InHouse.honoured_by``): a document only an
    in-house lease holds (``InHouse.holds``) counts as leased, and not as overdue."""
    at = bson_time(now)
    token = {"$ifNull": ["$lockToken", None]}
    held, free = {"$gt": [token, None]}, {"$lte": [token, None]}
    # BSON order ranks null, numbers and strings below every date: not live.
    until = {"$ifNull": ["$lockedUntil", None]}
    live, expired = {"$gt": [until, at]}, {"$lte": [until, at]}
    leased: dict[str, Any] = {"$and": [held, live]}
    overdue: dict[str, Any] = {"$and": [held, expired]}
    if in_house.migrating:
        locked = {"$ifNull": ["$lockedAt", None]}
        only_in_house = {"$and": [{"$gt": [locked, in_house.floor(now)]}, expired]}
        leased = {"$or": [leased, only_in_house]}
        overdue = {"$and": [held, expired, {"$not": [only_in_house]}]}

    errored = {"$gt": [{"$ifNull": ["$lastError", None]}, None]}
    mark = {"$ifNull": ["$failedBy", None]}
    given_up, not_given_up = {"$gt": [mark, None]}, {"$lte": [mark, None]}

    def count_if(condition: dict[str, Any]) -> dict[str, Any]:
        return {"$sum": {"$cond": [condition, 1, 0]}}

    return [
        # Documents without a lockedUntil count too: the claim treats them as free.
        {"$match": {**(match or {}), "phase": {"$exists": True}}},
        {
            "$group": {
                "_id": "$phase",
                "count": {"$sum": 1},
                "leased": count_if(leased),
                "overdue": count_if(overdue),
                "waiting": count_if({"$and": [free, live]}),
                "retrying": count_if({"$and": [errored, not_given_up]}),
                "failed": count_if(given_up),
            }
        },
        {"$sort": {"_id": 1}},
    ]


def errors_filter(phases: Iterable[str]) -> dict[str, Any]:
    """Documents of ``phases`` carrying an error (``ERRORS_INDEX`` serves it, merging the
    phases in its order)."""
    return {"phase": {"$in": list(phases)}, "lastError": {"$ne": None}}


ERRORS_PROJECTION = {"phase": 1, "lastError": 1, "attempts": 1}


def id_filter(raw: str) -> dict[str, Any]:
    """An id typed by an operator (or shown as text): an ObjectId's hex form matches the
    ObjectId or the string, an integer's digits the integer or the string."""
    if ObjectId.is_valid(raw) and len(raw) == 24:
        return {"_id": {"$in": [ObjectId(raw), raw]}}
    if raw.lstrip("-").isdigit() and str(int(raw)) == raw and -(2**63) <= int(raw) < 2**63:
        return {"_id": {"$in": [int(raw), raw]}}
    return {"_id": raw}


def operator_guard(
    doc_id: Any, phase: Any, token: Any = _ANY, shard: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Matches the document only while it is as the operator saw it: in ``phase`` (and,
    when ``token`` is given, held by that lease, or by none for None), so an action
    confirmed on one state is not applied to another. ``$eq``: the values were read from
    a document (or a form), and a value is never taken for an operator. ``shard``: the
    document's shard key values, so the change targets its shard."""
    query: dict[str, Any] = {**exact_id_filter(doc_id), "phase": {"$eq": phase}}
    if token is not _ANY:
        query["lockToken"] = {"$eq": token}
    for name, value in (shard or {}).items():
        query.setdefault(name, {"$eq": value})
    return query


def exact_id_filter(doc_id: Any) -> dict[str, Any]:
    """The document whose ``_id`` equals ``doc_id``, whatever its type (``$eq``: an
    embedded document id is a value, never an operator)."""
    return {"_id": {"$eq": doc_id}}


def audit_filter(kind: str | None = None, keys: Iterable[str] = ()) -> dict[str, Any]:
    """The audit trail's entries of ``kind`` (all, when None) naming a document by one of
    the business keys ``keys`` (each ``FIELD=VALUE``; any entry, when none given)."""
    query: dict[str, Any] = {} if kind is None else {"kind": {"$eq": kind}}
    wanted = sorted(set(keys))
    if wanted:
        query["keys"] = {"$in": wanted}
    return query


def operator_unlock_update() -> dict[str, Any]:
    """An operator's unlock: claimable at once, counters untouched, and no note of the
    last step's error may land after it (``lastToken`` goes, as ``released_fence`` asks
    of any change by someone else)."""
    update = release_update()
    update["$unset"]["lastToken"] = ""
    return update


def operator_move_update(
    phase: str, now: datetime, kept: Retention = NO_RETENTION
) -> dict[str, Any]:
    """An operator's retry or cancel: to ``phase`` with fresh counters, claimable at once,
    the lease taken from any step running (as an outside writer's phase change: its later
    writes raise ``LeaseLost``); the error is kept as ``previousError`` so the operator's
    reason to act stays visible. Into a phase the live replicas retain (``kept``), dated
    for deletion; into any other, undated (a retry out of a retained phase must not be
    deleted on the way), whatever the replicas say."""
    update = advance_update(phase, now, {})
    # A wait stored is over too: the phase it waited in is left.
    update["$unset"] = {
        "lockToken": "",
        "failedBy": "",
        "lastToken": "",
        EXPIRY_FIELD: "",
        WAIT_FIELD: "",
    }
    return expiring(update, phase, now, kept)
