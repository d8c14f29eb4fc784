"""What trees and events send: a child's owner, the look for a parent's children, the wake
of a waiting document, a signal's delivery."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.core.clock import bson_time
from orchestrator.core.queries.operators import exact_id_filter
from orchestrator.core.queries.submissions import check_fields
from orchestrator.core.resource import EPOCH
from orchestrator.core.trees import (
    ENDED_KEY,
    FAILED_KEY,
    MAX_SIGNALS,
    OWNER_FIELD,
    SENT_FIELD,
    SIGNALS_FIELD,
    TOTAL_KEY,
    WAIT_FIELD,
    Signal,
    WaitKind,
    check_signal_name,
)

__all__ = [
    "CHILD_PROJECTION",
    "OWNER_INDEX",
    "Delivery",
    "children_filter",
    "children_phases_pipeline",
    "children_wait_filter",
    "deliver_update",
    "delivery",
    "ended_update",
    "ids_filter",
    "move_children_filter",
    "waiting_filter",
    "wake_update",
]

OWNER_INDEX: list[tuple[str, int]] = [(f"{OWNER_FIELD}.collection", 1), (f"{OWNER_FIELD}.id", 1)]
"""On each collection children are made in: a parent's children (its waits, cascades)."""


def children_filter(collection: str, parent_id: Any) -> dict[str, Any]:
    """The children a document of ``collection`` owns (``OWNER_INDEX`` serves it)."""
    return {
        f"{OWNER_FIELD}.collection": {"$eq": collection},
        f"{OWNER_FIELD}.id": {"$eq": parent_id},
    }


CHILD_PROJECTION = {"phase": 1, OWNER_FIELD: 1}
"""What a parent's list of children reads of each (a child may be large)."""


def children_phases_pipeline(collection: str, parent_id: Any) -> list[dict[str, Any]]:
    """The children a document of ``collection`` owns, counted per phase (their match
    served by ``OWNER_INDEX``): what an operator's view of its wait counts (sent by
    ``Operations.tree``)."""
    return [
        {"$match": children_filter(collection, parent_id)},
        {"$group": {"_id": "$phase", "count": {"$sum": 1}}},
    ]


def move_children_filter(collection: str, parent_id: Any, phases: Iterable[str]) -> dict[str, Any]:
    """Its children in none of ``phases`` (a move to a phase leaves those already there,
    so a retried step does not take a running child's lease again)."""
    return {**children_filter(collection, parent_id), "phase": {"$nin": list(phases)}}


def waiting_filter(doc_id: Any, kind: WaitKind, name: str | None = None) -> dict[str, Any]:
    """The document while it waits (for ``kind``; for a signal, of ``name``) and no step
    holds it: a wake may make it due without taking a lease from anyone."""
    query: dict[str, Any] = {
        **exact_id_filter(doc_id),
        f"{WAIT_FIELD}.kind": {"$eq": kind.value},
        "lockToken": {"$exists": False},
    }
    if name is not None:
        query[f"{WAIT_FIELD}.name"] = {"$eq": name}
    return query


def children_wait_filter(doc_id: Any) -> dict[str, Any]:
    """The document while it waits for its children, held or not."""
    return {**exact_id_filter(doc_id), f"{WAIT_FIELD}.kind": {"$eq": WaitKind.CHILDREN.value}}


def ended_update(
    ended: Sequence[str], failed: Sequence[str], total: int | None = None
) -> dict[str, Any]:
    """Children's ends added to their parent's wait (a set: an end added twice counts
    once); with ``total``, how many children the judgement after the wait's write found."""
    update: dict[str, Any] = {
        "$addToSet": {f"{WAIT_FIELD}.{ENDED_KEY}": {"$each": list(ended)}},
    }
    if failed:
        update["$addToSet"][f"{WAIT_FIELD}.{FAILED_KEY}"] = {"$each": list(failed)}
    if total is not None:
        update["$set"] = {f"{WAIT_FIELD}.{TOTAL_KEY}": total}
    return update


def ids_filter(ids: Sequence[Any]) -> dict[str, Any]:
    """The documents of ``ids`` (the steps a replica runs, a wait's children to cancel)."""
    return {"_id": {"$in": list(ids)}}


def wake_update() -> dict[str, Any]:
    """Due at once (its wait is judged by the step that claims it)."""
    return {"$set": {"lockedUntil": bson_time(EPOCH)}}


def deliver_update(signal: Signal, *, wake: bool) -> dict[str, Any]:
    """A signal into the inbox, the oldest dropped past ``MAX_SIGNALS``; ``wake``: with
    ``waiting_filter``, due at once too."""
    update: dict[str, Any] = {
        "$push": {SIGNALS_FIELD: {"$each": [signal.stored()], "$slice": -MAX_SIGNALS}},
        "$inc": {SENT_FIELD: 1},
    }
    if wake:
        update["$set"] = {"lockedUntil": bson_time(EPOCH)}
    return update


@dataclass(frozen=True)
class Delivery:
    """A signal's delivery to one document, whoever sends it (a replica's ``signal``, an
    operator's): ``signal``, and two writes tried in turn until one lands: ``waking``
    (into the document while it waits for that name and no step holds it, due at once
    too), then ``storing`` (into the document as it is, for its next wait to find).
    Neither lands: there is no such document."""

    signal: Signal
    waking: tuple[dict[str, Any], dict[str, Any]]
    storing: tuple[dict[str, Any], dict[str, Any]]


def delivery(doc_id: Any, name: str, payload: Any, now: datetime) -> Delivery:
    """The delivery of signal ``name`` with ``payload`` to the document ``doc_id`` at
    ``now``; ``ConfigError`` for a name that is none, or a payload the store would refuse
    or read as update operators."""
    check_signal_name(name)
    check_fields({"payload": payload})
    signal = Signal.new(name, payload, now)
    return Delivery(
        signal,
        (waiting_filter(doc_id, WaitKind.SIGNAL, name), deliver_update(signal, wake=True)),
        (exact_id_filter(doc_id), deliver_update(signal, wake=False)),
    )
