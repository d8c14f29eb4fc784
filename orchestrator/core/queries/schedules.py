"""What a schedule's step and its operators send: its document, its runs, its requests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.queries import submissions
from orchestrator.core.queries.operators import exact_id_filter, operator_move_update
from orchestrator.core.schedules import SCHEDULE_PHASE, SCHEDULED_FIELD, ScheduleSpec

__all__ = [
    "RUNS_INDEX",
    "RUNS_SORT",
    "SCHEDULES_SORT",
    "active_runs_filter",
    "cancel_runs_update",
    "claim_match",
    "dropped_update",
    "existing_runs_filter",
    "fire_of",
    "held_filter",
    "next_filter",
    "pause_filter",
    "pause_update",
    "request_update",
    "respec_update",
    "runs_between_filter",
    "runs_filter",
    "runs_since_filter",
    "schedule_document",
    "served_update",
    "wake_filter",
    "wake_update",
]

PAUSED_FIELD = "paused"
FIRE_FIELD = f"{SCHEDULED_FIELD}.fire"
RUNS_INDEX: list[tuple[str, int]] = [
    (f"{SCHEDULED_FIELD}.name", 1),
    (f"{SCHEDULED_FIELD}.fire", -1),
]
"""On each collection schedules start documents in: a schedule's runs, latest first (the
overlap policy's look for a run going on, the operators' list of runs)."""

SCHEDULES_SORT: list[tuple[str, int]] = [("_id", 1)]
"""The schedules as operators list them: by name."""
RUNS_SORT: list[tuple[str, int]] = [(f"{SCHEDULED_FIELD}.fire", -1), ("_id", -1)]
"""A schedule's runs as operators list them: the newest fire first."""


def claim_match(names: Sequence[str]) -> dict[str, Any]:
    """The schedule step's handler: the documents of the schedules this replica declares,
    unless paused (a replica without a schedule's function never claims its fires)."""
    return {"phase": SCHEDULE_PHASE, "_id": {"$in": list(names)}, PAUSED_FIELD: {"$ne": True}}


def schedule_document(
    spec: ScheduleSpec, first: datetime, until: datetime, replica: str, now: datetime
) -> dict[str, Any]:
    """A schedule's document as the first replica declaring it makes it: its first fire
    (``first``) claimable at ``until`` (the fire plus its jitter)."""
    fields = {
        "_id": spec.name,
        "phase": SCHEDULE_PHASE,
        "spec": spec.stored(),
        "declaredBy": replica,
        "next": bson_time(first),
        "counts": {},
    }
    return submissions.new_document(fields, now, None, until=until)


def respec_update(
    spec: ScheduleSpec,
    first: datetime,
    replica: str,
    counts: Mapping[str, int],
    until: datetime | None,
) -> dict[str, Any]:
    """A replica declaring another spec than the stored one writes its own (the replica
    started last wins): the next fire from now on by the new spec, the counts with the old
    one's fires it accounted for, and, when no step holds the document (``until`` given,
    with ``wake_filter``), when it is claimable. A buffered fire stays: it was due."""
    update: dict[str, Any] = {
        "spec": spec.stored(),
        "declaredBy": replica,
        "next": bson_time(first),
        "counts": dict(counts),
    }
    if until is not None:
        update["lockedUntil"] = bson_time(until)
    return {"$set": update}


def wake_filter(name: str) -> dict[str, Any]:
    """The schedule's document while no step holds it (a write then may set when it is
    claimable without taking a lease from anyone)."""
    return {**exact_id_filter(name), "lockToken": {"$exists": False}}


def next_filter(name: str, known: datetime | None) -> dict[str, Any]:
    """The schedule's document while its next fire is still ``known`` (no step has moved
    it since it was read; None: it held no date, and any is taken)."""
    if known is None:
        return exact_id_filter(name)
    return {**exact_id_filter(name), "next": {"$eq": bson_time(known)}}


def held_filter(name: str, token: str) -> dict[str, Any]:
    """The schedule's document while ``token``'s step holds it."""
    return {**exact_id_filter(name), "lockToken": {"$eq": token}}


def runs_filter(name: str) -> dict[str, Any]:
    """The documents schedule ``name`` started."""
    return {f"{SCHEDULED_FIELD}.name": {"$eq": name}}


def active_runs_filter(name: str, matches: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Its runs a handler of their collection would still claim: not in a terminal phase."""
    return {**runs_filter(name), "$or": [dict(m) for m in matches]}


def runs_between_filter(name: str, start: datetime, end: datetime) -> dict[str, Any]:
    """Its runs whose fire time is in [``start``, ``end``) (``RUNS_INDEX`` serves it)."""
    fire = {"$gte": bson_time(start), "$lt": bson_time(end)}
    return {**runs_filter(name), FIRE_FIELD: fire}


def runs_since_filter(name: str, start: datetime) -> dict[str, Any]:
    """Its runs whose fire time is ``start`` or later."""
    return {**runs_filter(name), FIRE_FIELD: {"$gte": bson_time(start)}}


def fire_of(doc: Mapping[str, Any]) -> datetime | None:
    """A run's fire time as stored (aware), or None when it holds no date."""
    mark = doc.get(SCHEDULED_FIELD)
    fire = mark.get("fire") if isinstance(mark, Mapping) else None
    return as_utc(fire) if isinstance(fire, datetime) else None


def existing_runs_filter(ids: Sequence[str]) -> dict[str, Any]:
    return {"_id": {"$in": list(ids)}}


def cancel_runs_update(cancelled_phase: str, now: datetime) -> dict[str, Any]:
    """Its previous runs sent to the cancelled phase, as an operator's cancel does (a step
    running on one loses its lease at its next write)."""
    return operator_move_update(cancelled_phase, now)


def served_update(ids: Sequence[str]) -> dict[str, Any]:
    """The operators' requests a step served taken off the document; requests pushed
    meanwhile stay."""
    return {"$pull": {"requests": {"id": {"$in": list(ids)}}}}


def dropped_update(values: Sequence[Any]) -> dict[str, Any]:
    """Stored values that are no request (someone else's write) taken off the document."""
    return {"$pull": {"requests": {"$in": list(values)}}}


def request_update(request: Mapping[str, Any]) -> dict[str, Any]:
    """An operator's trigger or backfill, for the next step of the schedule."""
    return {"$push": {"requests": dict(request)}}


def pause_update(paused: bool) -> dict[str, Any]:
    return {"$set": {PAUSED_FIELD: paused}}


def pause_filter(name: str, paused: bool) -> dict[str, Any]:
    """The schedule's document unless it is so already (a pause of a paused schedule, a
    resume of one not paused, changes nothing and says so)."""
    state: dict[str, Any] = {"$ne": True} if paused else {"$eq": True}
    return {**exact_id_filter(name), PAUSED_FIELD: state}


def wake_update(at: datetime) -> dict[str, Any]:
    """Claimable at ``at`` (an operator's request is served at once, not at the next
    fire); with ``wake_filter``, only while no step holds it."""
    return {"$set": {"lockedUntil": bson_time(at)}}
