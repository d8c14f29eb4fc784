"""Sent by a replica's claim loop: the claim of a document (its filter, sort and update)
and the probe that first asks which handlers could claim anything (``probe_pipeline``),
with the filters a handler's selection is checked and combined by.

Each function returns plain dicts, so it can be checked without a database. Times are
naive UTC truncated to milliseconds, as BSON stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orchestrator.core.clock import UTC_EPOCH, as_utc, bson_time
from orchestrator.core.errors import ConfigError
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.queries.replica_records import live_replicas_filter
from orchestrator.core.resource import PRIORITY_FIELD
from orchestrator.core.sharding import SORTED, ClaimPlan, shard_values

MAX_PRIORITY = 9
"""Priorities run 0 (the default) to 9, higher claimed first. ``PRIORITY_FIELD`` is stored
only when above 0, so a document without it (submitted before priorities, without one, or
written by the in-house pattern during a migration) is priority 0: a missing field sorts
lowest in the claim's descending order, and no priority is negative, so none ranks below
it. The field is named apart from the application's own (a business ``priority``, of any
type, would reorder the claims). Ten levels keep the probe's due branch a handful of
index seeks (``due_filter``)."""


PRIORITIES: list[int | None] = [None, *range(1, MAX_PRIORITY + 1)]
"""Every stored form of a priority: missing (null in an index), or 1 to ``MAX_PRIORITY``."""


CLAIM_SORT: list[tuple[str, int]] = [(PRIORITY_FIELD, -1), ("lockedUntil", 1), ("updatedAt", 1)]
"""Highest priority first; within one, the longest free (its wait is longest overdue),
then the longest untouched."""


CLAIM_INDEX: list[tuple[str, int]] = [
    ("phase", 1),
    (PRIORITY_FIELD, -1),
    ("lockedUntil", 1),
    ("updatedAt", 1),
    ("_id", 1),
]
"""Serves the claim filter (phase equality, lockedUntil range) and its sort without a scan:
after the equality on phase, ``CLAIM_SORT`` is the index's own order, so a claim reads its
document off the index, priority by priority, never sorting in memory. ``_id`` last makes
its order total, so operators page through a phase by it (``browse``). An earlier
version's index of this name (without the priority, or without ``_id``) is replaced."""


def check_match(match: Mapping[str, Any]) -> None:
    """A handler's filter may select on anything but the lease fields it is combined with."""
    if not isinstance(match, Mapping) or not match:
        raise ConfigError("a handler's filter must be a non-empty dict")
    clash = sorted(set(match) & {"lockedAt", "lockedUntil", "lockToken", "failedBy"})
    if clash:
        raise ConfigError(f"a handler's filter cannot select on {clash}: the claim owns them")


def claim_filter(
    match: Mapping[str, Any],
    now: datetime,
    horizon: float,
    exclusion: Mapping[str, Any] | None = None,
    in_house: InHouse = NO_IN_HOUSE,
) -> dict[str, Any]:
    """The handler's filter, limited to documents nobody holds: ``lockedUntil`` is not a
    date in ``(now, now + horizon]``.

    Each lease carries its own expiry, written from its holder's settings, so a reader with
    another lock timeout judges it the same way. Besides past dates this matches what no
    replica writes: a missing, null or non-date ``lockedUntil`` (claimable at once; they
    sort first) and a date further ahead than ``horizon``, which no lease or wait reaches:
    a lease that would never expire. Both branches are index ranges on (phase,
    lockedUntil), scanned in index order, so the server merges them for the sort.

    ``exclusion`` (``failed_exclusion``): what keeps a handler off the documents it moved
    to its failed phase, so a handler whose filter also matches that phase cannot spin on
    what it gave up on.

    ``in_house`` (while migrating): an in-house pod's lease is honoured too, ``lockedAt``
    judged as the lease expiring at its ``InHouse.expiry`` (``InHouse.free``).
    """
    horizon_at = bson_time(now + timedelta(seconds=horizon))
    free = {
        "$or": [
            {"lockedUntil": {"$not": {"$gt": bson_time(now)}}},
            {"lockedUntil": {"$gt": horizon_at}},
        ]
    }
    # check_match keeps lease fields out of the handler's filter.
    parts = [dict(match), *([dict(exclusion)] if exclusion else []), free]
    if in_house.migrating:
        parts.append(in_house.free(now, horizon))
    merged: dict[str, Any] = {}
    for part in parts:
        if merged.keys() & part.keys():
            return {"$and": parts}
        merged.update(part)
    return merged


def failed_exclusion(
    key: str, name: str, failed_phase: str, match: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Keeps the handler ``key`` off a document it moved to ``failed_phase`` (``failedBy``)
    while the document is still there; once the API or an operator moves it to another
    phase, its handler claims it again. ``name``: the handler's name, which marked its
    documents before it had a key (a shared name, so only old marks). None when the
    handler's filter pins another phase: the mark can never apply."""
    phase = match.get("phase")
    if isinstance(phase, str) and phase != failed_phase:
        return None
    marks = [{"failedBy": {"$ne": mark}} for mark in dict.fromkeys((key, name))]
    return {"$or": [{"$and": marks}, {"phase": {"$ne": failed_phase}}]}


def probe_filter(
    matches: Iterable[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
    now: datetime,
    horizon: float,
    in_house: InHouse = NO_IN_HOUSE,
) -> dict[str, Any]:
    """What any of several handlers could claim now: the ``$or`` of their claim filters, so
    one read finding nothing proves that none of their claims would find anything."""
    return {"$or": [claim_filter(m, now, horizon, exclusion, in_house) for m, exclusion in matches]}


PROBE_PROJECTION: dict[str, Any] = {"_id": 1}
"""A probe only asks whether work exists: it reads no field of it."""


Matches = Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None]]
"""The (match, exclusion) pairs of the handlers a probe covers on one collection."""


def due_filter(matches: Matches, now: datetime, horizon: float) -> dict[str, Any]:
    """What any of these handlers could claim later, and when: documents they select whose
    ``lockedUntil`` is a date in ``(now, now + horizon]`` (a lease held, a wait under way,
    or a later start set at submit). The earliest is the next moment work appears without
    anyone writing."""
    window = {"$gt": bson_time(now), "$lte": bson_time(now + timedelta(seconds=horizon))}
    branches = []
    for match, exclusion in matches:
        parts = [dict(match), *([dict(exclusion)] if exclusion else [])]
        parts.append({"lockedUntil": window})
        # Each stored priority named: with the phase's equality, every index key before
        # lockedUntil is a point, so the server can read the earliest of each priority
        # and merge them (MongoDB's "explode for sort") instead of sorting every lease
        # and wait of the phase. A malformed priority is left out of the due time only:
        # a tick's probe still finds it due.
        parts.append({PRIORITY_FIELD: {"$in": list(PRIORITIES)}})
        branches.append({"$and": parts})
    return {"$or": branches}


def in_house_due_filter(
    matches: Matches, now: datetime, horizon: float, in_house: InHouse
) -> dict[str, Any]:
    """``due_filter`` for in-house leases (while migrating): documents these handlers
    select that only a ``lockedAt`` holds (``InHouse.free``'s window; no ``lockedUntil``
    holds them, or ``due_filter`` has them), each due at its ``InHouse.expiry``. An index
    scan of ``in_house.IN_HOUSE_INDEX``."""
    floor = in_house.floor(now)
    window = {"$gt": floor, "$lte": bson_time(floor + timedelta(seconds=horizon))}
    branches = []
    for match, exclusion in matches:
        parts = [dict(match), *([dict(exclusion)] if exclusion else [])]
        parts.append({"lockedAt": window})
        parts.append({"lockedUntil": {"$not": {"$gt": bson_time(now)}}})
        branches.append({"$and": parts})
    return {"$or": branches}


PROBE_HANDLER = "h"
"""The field naming, in a probe's answers, the handler (its position) with work now."""


PROBE_DUE = "due"
"""The field holding the next due time of a collection's documents in a probe's answers."""


PROBE_COLLECTION = "c"
"""The field naming, in a probe's due-time answers, the collection the time is of."""


PROBE_PHASE = "p"
"""The field holding, in a probe's due-time answers, the phase of the document that comes
due then: only handlers that may claim it are woken at that time."""


PROBE_HELD_AT = "heldAt"
"""The field holding, in a probe's answers (while migrating), the earliest ``lockedAt`` of
a collection's documents in-house leases hold: they come due at its ``InHouse.expiry``."""


PROBE_BRANCHES = 300
"""Handlers one probe aggregation reads at most: three stages each at most (its own, its
collection's due branch and, while migrating, its in-house one), under MongoDB's limit of
1,000 stages in a pipeline. A replica with more sends one read per 300."""


def probe_chunks(groups: Sequence[tuple[str, Matches]]) -> list[list[tuple[str, Matches]]]:
    """``groups`` cut into probes of at most ``PROBE_BRANCHES`` handlers each, in order (a
    collection's handlers may straddle two)."""
    chunks: list[list[tuple[str, Matches]]] = [[]]
    room = PROBE_BRANCHES
    for name, matches in groups:
        rest = list(matches)
        while rest:
            if not room:
                chunks.append([])
                room = PROBE_BRANCHES
            taken, rest = rest[:room], rest[room:]
            chunks[-1].append((name, taken))
            room -= len(taken)
    return [chunk for chunk in chunks if chunk]


PROBE_LIVE = "live"
"""The field holding, in a probe's answers, how many replicas are live."""


PROBE_PAUSE = "pause"
"""The field holding, in a probe's answers, one of the operators' pauses."""


def probe_pipeline(
    groups: Sequence[tuple[str, Matches]],
    now: datetime,
    horizon: float,
    *,
    pauses: tuple[str, int] | None = None,
    replicas: str | None = None,
    in_house: InHouse = NO_IN_HOUSE,
    known: frozenset[int] = frozenset(),
) -> list[dict[str, Any]]:
    """One read for every handler of every collection: an aggregation over the first
    collection that adds the others' with ``$unionWith`` (MongoDB 4.4). It answers one
    document ``{h: n}`` for each handler (numbered across ``groups`` in order) that could
    claim now, and for each collection the earliest document its handlers could claim
    later, ``{due: lockedUntil, c: collection, p: phase}`` (so that time wakes only the
    handlers that may claim it). Each branch is an index scan of ``CLAIM_INDEX`` limited
    to one document, so an idle fleet costs one small read per replica per tick, whatever
    its handlers and collections, and no handler claims in vain. ``pauses``: (the pauses
    collection, at most how many): the operators' pauses come with it, ``{pause: doc}``,
    so reading them costs no round trip of its own. ``replicas`` (their collection): how
    many replicas are live, ``{live: n}`` (how many would wake at a due time).
    ``in_house`` (while migrating): in-house leases hold documents too
    (``claim_filter``), and each collection's earliest one comes as
    ``{heldAt: lockedAt}`` (``in_house_due_filter``). ``known``: the numbers of handlers
    known to have work, not asked (their due times still are)."""
    branches: list[tuple[str, list[dict[str, Any]]]] = []
    number = 0
    for name, matches in groups:
        for match, exclusion in matches:
            if number in known:
                number += 1
                continue
            branch: list[dict[str, Any]] = [
                {"$match": claim_filter(match, now, horizon, exclusion, in_house)},
                {"$limit": 1},
                {"$project": {"_id": 0, PROBE_HANDLER: {"$literal": number}}},
            ]
            branches.append((name, branch))
            number += 1
        due: list[dict[str, Any]] = [
            {"$match": due_filter(matches, now, horizon)},
            {"$sort": {"lockedUntil": 1}},
            {"$limit": 1},
            {"$project": {"_id": 0, PROBE_DUE: "$lockedUntil", **_due_of(name)}},
        ]
        branches.append((name, due))
        if in_house.migrating:
            held: list[dict[str, Any]] = [
                {"$match": in_house_due_filter(matches, now, horizon, in_house)},
                {"$sort": {"lockedAt": 1}},
                {"$limit": 1},
                {"$project": {"_id": 0, PROBE_HELD_AT: "$lockedAt", **_due_of(name)}},
            ]
            branches.append((name, held))
    if pauses is not None:
        name, most = pauses
        branches.append((name, [{"$limit": most}, {"$project": {"_id": 0, PROBE_PAUSE: "$$ROOT"}}]))
    if replicas is not None:
        live: list[dict[str, Any]] = [{"$match": live_replicas_filter(now)}, {"$count": PROBE_LIVE}]
        branches.append((replicas, live))
    (_, stages), *rest = branches
    return [*stages, *({"$unionWith": {"coll": c, "pipeline": b}} for c, b in rest)]


def _due_of(collection: str) -> dict[str, Any]:
    """What a due-time answer says besides the time: its collection, its document's phase."""
    return {PROBE_COLLECTION: {"$literal": collection}, PROBE_PHASE: "$phase"}


def peek_projection(shard_key: Iterable[str]) -> dict[str, Any]:
    """What a peek reads of each candidate: what a targeted claim names it by, and its
    priority (each replica goes round the candidates of one priority before the next:
    ``sharding.spread``)."""
    return {"_id": 1, PRIORITY_FIELD: 1, **dict.fromkeys(shard_key, 1)}


def shard_filter(doc: Mapping[str, Any], shard_key: Iterable[str]) -> dict[str, Any]:
    """Equality on ``doc``'s shard key values (null where it has none, as the server files
    it): what makes a write target one shard. A document value is matched with ``$eq``, so
    it is never read as operators."""
    if not shard_key:
        return {}
    return {
        name: {"$eq": value} if isinstance(value, Mapping) else value
        for name, value in shard_values(doc, tuple(shard_key)).items()
    }


def pinned(query: Mapping[str, Any], pins: Mapping[str, Any]) -> dict[str, Any]:
    """``query`` narrowed to the equalities ``pins`` (a document's ``_id`` and shard key),
    at the top level, where the server looks for a shard key."""
    extra = {k: v for k, v in pins.items() if k not in query or query[k] != v}
    if not extra:
        return dict(query)
    if extra.keys() & query.keys():
        return {**extra, "$and": [dict(query)]}
    return {**extra, **query}


def targeted_claim(
    candidate: Mapping[str, Any], shard_key: Iterable[str], query: Mapping[str, Any]
) -> dict[str, Any]:
    """A claim of one peeked ``candidate`` by its ``_id`` and shard key: ``query`` (the
    claim filter) re-checks that it is still free, so a candidate another replica took
    meanwhile matches nothing."""
    return pinned(query, {"_id": candidate["_id"], **shard_filter(candidate, shard_key)})


def claim_update(now: datetime, until: datetime, token: str, replica: str) -> dict[str, Any]:
    """Take the lease until ``until`` (the holder's own timeout): a fresh token fences every
    later write to this holder."""
    return {
        "$set": {
            "lockedAt": bson_time(now),
            "lockedUntil": bson_time(until),
            "lockToken": token,
            "lockedBy": replica,
        }
    }


@dataclass(frozen=True)
class ClaimRequest:
    """One claim as the claim loop asks it of the store: which documents (``match``, less
    what ``exclusion`` keeps out: ``failed_exclusion``), free when (``judged_at``: the
    replica's now less its clock's uncertainty; ``horizon``: ``claim_filter``'s), taken
    how (``update``: ``claim_update``) and found how (``plan``, the handler's; ``live``:
    how many replicas are live, from which an ``auto`` plan peeks). One object, so the
    store's ``claim`` reads as what it is asked, not as nine positions."""

    match: Mapping[str, Any]
    judged_at: datetime
    horizon: float
    update: Mapping[str, Any]
    exclusion: Mapping[str, Any] | None = None
    plan: ClaimPlan = SORTED
    live: int | None = None


def claimed(before: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """The document as a claim left it, from the document as it was before (the claim
    asks for that, to learn how long the document was due) and ``claim_update``'s
    ``$set``: its dates as the store reads them, aware UTC. ``before`` is changed in place."""
    if update.keys() != {"$set"}:
        raise ConfigError(f"a claim's update only sets fields, not {sorted(update)}")
    for key, value in update["$set"].items():
        before[key] = as_utc(value) if isinstance(value, datetime) else value
    return before


def due_since(before: Mapping[str, Any], in_house: InHouse = NO_IN_HOUSE) -> datetime | None:  # noqa: PLR0911  one return per rule, in the order they are judged
    """When a document about to be claimed became claimable, from its fields before the
    claim, where they tell: when its relock or retry wait, or its previous lease, ran out
    (``lockedUntil`` after the epoch), or when it entered its phase (released at the epoch
    since: submitted, advanced, or retried by an operator). None after a plain unlock or
    a hand-back within the phase, whose time no field records, and for malformed fields.

    ``in_house`` (while migrating): an in-house lease or relock (``lockedAt`` after the
    epoch) ran out at its ``InHouse.expiry``, when that is later than ``lockedUntil``.
    ``lockedAt`` then no longer records a claim (releases write the epoch there), so a
    document released at once is known to have been due since it entered its phase only
    if no replica ever claimed it (no ``lockedBy``): never right after an unlock, unknown
    after an advance."""
    until = before.get("lockedUntil")
    entered = before.get("updatedAt")
    locked = before.get("lockedAt")
    if until is not None and not isinstance(until, datetime):
        return None  # not a date: a malformed lease, claimable since nobody knows when
    if in_house.migrating and isinstance(locked, datetime) and as_utc(locked) > UTC_EPOCH:
        expiry = in_house.expiry(locked)
        return expiry if until is None or as_utc(until) < expiry else as_utc(until)
    if isinstance(until, datetime) and as_utc(until) > UTC_EPOCH:
        return as_utc(until)
    if until is not None and as_utc(until) != UTC_EPOCH:
        return None  # before the epoch: written by no replica
    if not isinstance(entered, datetime):
        return None
    if in_house.migrating:
        return as_utc(entered) if before.get("lockedBy") is None else None
    if isinstance(locked, datetime) and as_utc(locked) > as_utc(entered):
        return None  # claimed in this phase before, then unlocked or handed back
    return as_utc(entered)
