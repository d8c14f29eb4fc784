"""Sent by a replica whose handler has a cluster-wide limit (``Limit``): the slots it takes
before a claim, renews with the lease, frees or gives back, one document per unit of the
limit.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from orchestrator.core.clock import bson_time
from orchestrator.core.resource import EPOCH

if TYPE_CHECKING:
    from orchestrator.core.limits import Limit


SLOT_INDEX: list[tuple[str, int]] = [("handler", 1), ("kind", 1), ("until", 1)]
"""Serves the take of a free slot of one limit (``take_slot_filter``) and the read of its
next free one (``next_slot_filter``)."""


def slot_id(key: str, limit: Limit, n: int) -> str:
    """The ``_id`` of the ``n``-th slot of ``limit`` of the handler ``key``."""
    return f"{key}/{limit.kind.value}/{n}"


def slot_documents(key: str, limit: Limit) -> list[dict[str, Any]]:
    """The slots of ``limit`` of the handler ``key``, free, as first made (inserted once:
    an existing one is kept as it is)."""
    return [
        {
            "_id": slot_id(key, limit, n),
            "handler": key,
            "kind": limit.kind.value,
            "n": n,
            "until": EPOCH,
            "token": None,
        }
        for n in range(limit.count)
    ]


def slots_filter(key: str, limit: Limit) -> dict[str, Any]:
    """The slots of ``limit`` of the handler ``key`` (those of a larger count some other
    replica uses are left out); read earliest ``until`` first (``NEXT_SLOT_SORT``), the
    first says when the next one comes free."""
    return {"handler": key, "kind": limit.kind.value, "n": {"$lt": limit.count}}


def take_slot_filter(key: str, limit: Limit, judged_at: datetime) -> dict[str, Any]:
    """A slot of ``limit`` free at ``judged_at`` (the server's time, as a claim judges
    leases): its ``until`` is not after it. Only the first ``limit.count`` slots count, so
    a replica whose limit is lower than another's (a rolling change) keeps its own."""
    return {**slots_filter(key, limit), "until": {"$not": {"$gt": bson_time(judged_at)}}}


def take_slot_update(token: str, until: datetime, replica: str, now: datetime) -> dict[str, Any]:
    """Take the slot for the lease ``token`` until ``until``: the lease's expiry (a global
    limit's), or one period after the start (a rate limit's)."""
    return {
        "$set": {
            "token": token,
            "until": bson_time(until),
            "by": replica,
            "at": bson_time(now),
        }
    }


SLOT_PROJECTION: dict[str, Any] = {"until": 1, "token": 1}
"""What a take reads back of the slot as it was: a rate slot given back is restored to it,
and a global slot's last holder tells whether it was freed or left to expire."""


def slot_fence(slot: str, token: str) -> dict[str, Any]:
    """The slot ``slot`` while the lease ``token`` holds it: once another step took it, a
    stale holder's renewal or release matches nothing."""
    return {"_id": slot, "token": token}


def held_slot_filter(key: str, limit: Limit, token: str) -> dict[str, Any]:
    """The slot of ``limit`` the lease ``token`` holds, if any: a take whose answer never
    came (cancelled, lost) is freed by it, its ``_id`` unknown."""
    return {**slots_filter(key, limit), "token": token}


def free_slot_update() -> dict[str, Any]:
    """A global slot freed when its step ends (or its claim found nothing): free at once."""
    return {"$set": {"until": EPOCH, "token": None}}


def extend_slot_update(until: datetime) -> dict[str, Any]:
    """A global slot renewed with its lease, to the lease's new expiry."""
    return {"$set": {"until": bson_time(until)}}


def restore_slot_update(until: Any, token: Any) -> dict[str, Any]:
    """A rate slot given back (its claim found no document): as it was before the take, so
    the start it counted is not counted."""
    return {
        "$set": {
            "until": bson_time(until) if isinstance(until, datetime) else EPOCH,
            "token": token,
        }
    }


NEXT_SLOT_SORT: list[tuple[str, int]] = [("until", 1)]
