"""Every MongoDB filter and update the orchestrator sends, as pure functions.

This is the one place to read how a claim, a release or a failure is written. Each
function returns plain dicts, so it can be checked without a database. Times are naive
UTC truncated to milliseconds, as BSON stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import bson
from bson import ObjectId
from bson.errors import BSONError

from orchestrator.core.errors import ConfigError
from orchestrator.core.redact import redact
from orchestrator.core.resource import EPOCH, LEASE_FIELDS, PRIORITY_FIELD, TRACE_FIELD
from orchestrator.core.sharding import shard_values

if TYPE_CHECKING:
    from orchestrator.core.limits import Limit
    from orchestrator.core.replicas import ReplicaRecord

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

CLAIM_INDEX_NAME = "orchestrator_claim_until"

UNIQUE_PREFIX = "orchestrator_unique_"
"""Names the unique index of each set of ``submit``'s keys (its fields follow)."""

ERRORS_INDEX: list[tuple[str, int]] = [("phase", 1), ("lastError.at", -1), ("_id", -1)]
"""Serves the latest errors of a phase (or, merged, of every phase): the status report's
and the failed documents' list. Its keys change only when a step fails or a document
changes phase, not at every claim."""

ERRORS_INDEX_NAME = "orchestrator_errors"


def bson_time(value: datetime) -> datetime:
    """Naive UTC with millisecond precision: what the server will hand back."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


_NAIVE_EPOCH = datetime(1970, 1, 1)
_UTC_EPOCH = _NAIVE_EPOCH.replace(tzinfo=UTC)


def as_utc(value: datetime) -> datetime:
    """Aware UTC, whatever the client's ``tz_aware`` setting gave us."""
    if value.tzinfo is None:
        # As value.replace(tzinfo=UTC), a tenth of its cost (every claim pays it).
        return _UTC_EPOCH + (value - _NAIVE_EPOCH)
    return value.astimezone(UTC)


# -- the in-house pattern's leases, while a fleet migrates (``Settings.legacy_lock_timeout``) --

LEGACY_SLACK = timedelta(milliseconds=1)
"""The in-house claim takes a document whose ``lockedAt < now - timeout``: strictly, so an
in-house lease still holds at ``lockedAt + timeout`` and is free one millisecond later,
while a ``lockedUntil`` is free from its own moment on (``$not: {$gt: now}``)."""

LEGACY_INDEX: list[tuple[str, int]] = [("phase", 1), ("lockedAt", 1)]
"""Serves the probe's branch finding when the earliest in-house lease runs out (and the
in-house pods' own claim): made with the claim index while ``legacy_lock_timeout`` is set."""

LEGACY_INDEX_NAME = "orchestrator_legacy_lock"


def legacy_expiry(locked_at: datetime, legacy: float) -> datetime:
    """When an in-house lease taken at ``locked_at`` runs out, as a ``lockedUntil`` says it:
    the first moment the in-house query takes the document (aware UTC)."""
    return as_utc(locked_at) + timedelta(seconds=legacy) + LEGACY_SLACK


def legacy_locked_at(until: datetime, legacy: float) -> datetime:
    """The ``lockedAt`` an in-house pod judges as this library judges ``lockedUntil=until``
    (``legacy_expiry``'s inverse): a lease, a relock's wait or a retry's backoff ends for
    both at one moment. A release at once writes the epoch itself, as the in-house unlock
    does (its ``TASK_LOCK_INIT_TIME``).

    The one place a stamp is decided from an expiry: ``until`` is taken as stored
    (``bson_time``) first, so the stamp a write stores (``legacy_fields``, from the stored
    ``lockedUntil``) and the one a lease's fence names (``legacy_fence``, from the lease's
    own expiry) are one, whatever the setting's digits."""
    if as_utc(until) <= _UTC_EPOCH:
        return EPOCH
    return bson_time(bson_time(until) - timedelta(seconds=legacy) - LEGACY_SLACK)


def legacy_fields(fields: Mapping[str, Any], legacy: float | None) -> dict[str, Any]:
    """``fields`` (a new document, or an update's ``$set``) with the ``lockedAt`` that tells
    in-house pods its ``lockedUntil``, while ``legacy`` is set and that is a date."""
    until = fields.get("lockedUntil")
    if legacy is None or not isinstance(until, datetime):
        return dict(fields)
    return {**fields, "lockedAt": legacy_locked_at(until, legacy)}


def legacy_update(update: Mapping[str, Any], legacy: float | None) -> Mapping[str, Any]:
    """A write that in-house pods read as this library reads it, while ``legacy`` is set:
    one that sets ``lockedUntil`` (a claim, a carry, an extension, any release, relock,
    retry or failure, an operator's unlock, retry or cancel) sets the matching
    ``lockedAt`` with it (``legacy_locked_at``). The store applies it to every write it
    sends (and ``legacy_fields`` to every document it inserts), and the operators' tools
    to their changes (``operator_legacy_update``), so no lease write can be left out;
    ``update`` itself when there is nothing to add."""
    sets = update.get("$set")
    if legacy is None or not isinstance(sets, Mapping) or "lockedUntil" not in sets:
        return update
    return {**update, "$set": legacy_fields(sets, legacy)}


def operator_legacy_update(update: Mapping[str, Any], legacy: float | None) -> Mapping[str, Any]:
    """An operator's change (``legacy_update``) as in-house pods read it, also when no live
    replica publishes the setting (while old pods run, none may be live): one that frees
    the document at once writes the epoch ``lockedAt`` whatever the setting, as the
    in-house unlock does (what ``legacy_locked_at`` gives the epoch for any timeout, and
    nothing reads after the migration). Written only with the setting, a replica's relock
    left its ``lockedAt`` ahead of now, holding the document for the old pods (and the
    replicas honouring them) until that wait ended."""
    sets = update.get("$set")
    if legacy is not None or not isinstance(sets, Mapping):
        return legacy_update(update, legacy)
    until = sets.get("lockedUntil")
    if not isinstance(until, datetime) or as_utc(until) > _UTC_EPOCH:
        return update
    return {**update, "$set": {**sets, "lockedAt": EPOCH}}


def legacy_fence(
    query: Mapping[str, Any], untils: Sequence[datetime], legacy: float | None
) -> dict[str, Any]:
    """A lease's fence (``fenced``, ``released_fence``) also naming the ``lockedAt`` its
    last write stamped with ``lockedUntil`` (one of ``untils``: an extension whose reply
    was lost may have landed), while ``legacy`` is set: an in-house pod's claim rewrites
    only ``lockedAt`` and leaves the token as it was, so without it a holder that stalled
    past its lease would still write over the in-house pod's work."""
    if legacy is None:
        return dict(query)
    stamps = [legacy_locked_at(until, legacy) for until in untils]
    return {**query, "lockedAt": stamps[0] if len(stamps) == 1 else {"$in": stamps}}


def legacy_floor(now: datetime, legacy: float) -> datetime:
    """The ``lockedAt`` of an in-house lease that runs out at ``now``: a later one holds."""
    return bson_time(now - timedelta(seconds=legacy) - LEGACY_SLACK)


def legacy_free(now: datetime, horizon: float, legacy: float) -> dict[str, Any]:
    """Documents no in-house lease holds at ``now``: ``lockedAt`` is not a date whose
    ``legacy_expiry`` falls in ``(now, now + horizon]``, the window in which
    ``claim_filter`` takes a ``lockedUntil`` to hold. As there, what is no date (missing,
    null, a string, a number) holds nothing, so a malformed ``lockedAt`` never keeps a
    document from being claimed (the claim writes a date over it), and a date further
    ahead than ``horizon`` is a lease that would never run out: free too."""
    floor = legacy_floor(now, legacy)
    return {
        "$or": [
            {"lockedAt": {"$not": {"$gt": floor}}},
            {"lockedAt": {"$gt": bson_time(floor + timedelta(seconds=horizon))}},
        ]
    }


IN_HOUSE_HOLDER = "an in-house pod"
"""Who holds a document an in-house lease holds, as operators' tools name it: its pods
write no name (the ``lockedBy`` it may carry is an earlier replica's)."""


def in_house_lease(doc: Mapping[str, Any], now: datetime, legacy: float | None) -> bool:
    """Whether an in-house pod holds ``doc`` at ``now``: a ``lockedAt`` that holds it
    (``legacy_expiry`` after ``now``, as the status counts judge it) while no
    ``lockedUntil`` does. A replica's own writes keep the two alike, so only an in-house
    claim or relock leaves ``lockedAt`` alone holding it; its ``lockedBy`` and
    ``lockToken``, if any, are an earlier replica's."""
    locked = doc.get("lockedAt")
    if legacy is None or not isinstance(locked, datetime):
        return False
    at = as_utc(now)
    until = doc.get("lockedUntil")
    if isinstance(until, datetime) and as_utc(until) > at:
        return False
    return legacy_expiry(locked, legacy) > at


def claim_filter(
    match: Mapping[str, Any],
    now: datetime,
    horizon: float,
    exclusion: Mapping[str, Any] | None = None,
    legacy: float | None = None,
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

    ``legacy`` (``Settings.legacy_lock_timeout``): an in-house pod's lease is honoured
    too, ``lockedAt`` judged as the lease expiring at ``legacy_expiry`` (``legacy_free``).
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
    if legacy is not None:
        parts.append(legacy_free(now, horizon, legacy))
    merged: dict[str, Any] = {}
    for part in parts:
        if merged.keys() & part.keys():
            return {"$and": parts}
        merged.update(part)
    return merged


def failed_exclusion(
    key: str, legacy: str, failed_phase: str, match: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Keeps the handler ``key`` off a document it moved to ``failed_phase`` (``failedBy``)
    while the document is still there; once the API or an operator moves it to another
    phase, its handler claims it again. ``legacy``: the handler's name, which marked its
    documents before it had a key (a shared name, so only old marks). None when the
    handler's filter pins another phase: the mark can never apply."""
    phase = match.get("phase")
    if isinstance(phase, str) and phase != failed_phase:
        return None
    marks = [{"failedBy": {"$ne": mark}} for mark in dict.fromkeys((key, legacy))]
    return {"$or": [{"$and": marks}, {"phase": {"$ne": failed_phase}}]}


def probe_filter(
    matches: Iterable[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
    now: datetime,
    horizon: float,
    legacy: float | None = None,
) -> dict[str, Any]:
    """What any of several handlers could claim now: the ``$or`` of their claim filters, so
    one read finding nothing proves that none of their claims would find anything."""
    return {"$or": [claim_filter(m, now, horizon, exclusion, legacy) for m, exclusion in matches]}


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


def legacy_due_filter(
    matches: Matches, now: datetime, horizon: float, legacy: float
) -> dict[str, Any]:
    """``due_filter`` for in-house leases: documents these handlers select that only a
    ``lockedAt`` holds (``legacy_free``'s window; no ``lockedUntil`` holds them, or
    ``due_filter`` has them), each due at its ``legacy_expiry``. An index scan of
    ``LEGACY_INDEX``."""
    floor = legacy_floor(now, legacy)
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
PROBE_HELD_AT = "heldAt"
"""The field holding, in a probe's answers (``legacy``), the earliest ``lockedAt`` of a
collection's documents in-house leases hold: they come due at its ``legacy_expiry``."""


PROBE_BRANCHES = 300
"""Handlers one probe aggregation reads at most: three stages each at most (its own, its
collection's due branch and, with ``legacy``, its in-house one), under MongoDB's limit of
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
    pauses: tuple[str, int] | None = None,
    replicas: str | None = None,
    legacy: float | None = None,
) -> list[dict[str, Any]]:
    """One read for every handler of every collection: an aggregation over the first
    collection that adds the others' with ``$unionWith`` (MongoDB 4.4). It answers one
    document ``{h: n}`` for each handler (numbered across ``groups`` in order) that could
    claim now, and for each collection the earliest document its handlers could claim
    later, ``{due: lockedUntil}``. Each branch is an index scan of ``CLAIM_INDEX`` limited
    to one document, so an idle fleet costs one small read per replica per tick, whatever
    its handlers and collections, and no handler claims in vain. ``pauses``: (the pauses
    collection, at most how many): the operators' pauses come with it, ``{pause: doc}``,
    so reading them costs no round trip of its own. ``replicas`` (their collection): how
    many replicas are live, ``{live: n}`` (how many would wake at a due time).
    ``legacy``: in-house leases hold documents too (``claim_filter``), and each
    collection's earliest one comes as ``{heldAt: lockedAt}`` (``legacy_due_filter``)."""
    branches: list[tuple[str, list[dict[str, Any]]]] = []
    number = 0
    for name, matches in groups:
        for match, exclusion in matches:
            branch: list[dict[str, Any]] = [
                {"$match": claim_filter(match, now, horizon, exclusion, legacy)},
                {"$limit": 1},
                {"$project": {"_id": 0, PROBE_HANDLER: {"$literal": number}}},
            ]
            branches.append((name, branch))
            number += 1
        due: list[dict[str, Any]] = [
            {"$match": due_filter(matches, now, horizon)},
            {"$sort": {"lockedUntil": 1}},
            {"$limit": 1},
            {"$project": {"_id": 0, PROBE_DUE: "$lockedUntil"}},
        ]
        branches.append((name, due))
        if legacy is not None:
            held: list[dict[str, Any]] = [
                {"$match": legacy_due_filter(matches, now, horizon, legacy)},
                {"$sort": {"lockedAt": 1}},
                {"$limit": 1},
                {"$project": {"_id": 0, PROBE_HELD_AT: "$lockedAt"}},
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


def claimed(before: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """The document as a claim left it, from the document as it was before (the claim
    asks for that, to learn how long the document was due) and ``claim_update``'s
    ``$set``: its dates as the store reads them, aware UTC. ``before`` is changed in place."""
    if update.keys() != {"$set"}:
        raise ConfigError(f"a claim's update only sets fields, not {sorted(update)}")
    for key, value in update["$set"].items():
        before[key] = as_utc(value) if isinstance(value, datetime) else value
    return before


def due_since(before: Mapping[str, Any], legacy: float | None = None) -> datetime | None:
    """When a document about to be claimed became claimable, from its fields before the
    claim, where they tell: when its relock or retry wait, or its previous lease, ran out
    (``lockedUntil`` after the epoch), or when it entered its phase (released at the epoch
    since: submitted, advanced, or retried by an operator). None after a plain unlock or
    a hand-back within the phase, whose time no field records, and for malformed fields.

    ``legacy``: an in-house lease or relock (``lockedAt`` after the epoch) ran out at its
    ``legacy_expiry``, when that is later than ``lockedUntil``. ``lockedAt`` then no
    longer records a claim (releases write the epoch there), so a document released at
    once is known to have been due since it entered its phase only if no replica ever
    claimed it (no ``lockedBy``): never right after an unlock, unknown after an advance."""
    until = before.get("lockedUntil")
    entered = before.get("updatedAt")
    locked = before.get("lockedAt")
    if until is not None and not isinstance(until, datetime):
        return None  # not a date: a malformed lease, claimable since nobody knows when
    if legacy is not None and isinstance(locked, datetime) and as_utc(locked) > _UTC_EPOCH:
        expiry = legacy_expiry(locked, legacy)
        return expiry if until is None or as_utc(until) < expiry else as_utc(until)
    if isinstance(until, datetime) and as_utc(until) > _UTC_EPOCH:
        return as_utc(until)
    if until is not None and as_utc(until) != _UTC_EPOCH:
        return None  # before the epoch: written by no replica
    if not isinstance(entered, datetime):
        return None
    if legacy is not None:
        return as_utc(entered) if before.get("lockedBy") is None else None
    if isinstance(locked, datetime) and as_utc(locked) > as_utc(entered):
        return None  # claimed in this phase before, then unlocked or handed back
    return as_utc(entered)


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
    written it. One write where a release and a claim made two."""
    carried = {op: dict(fields) for op, fields in update.items()}
    carried.setdefault("$set", {}).update(claim_update(now, until, token, replica)["$set"])
    unset = carried.get("$unset", {})
    unset.pop("lockToken", None)
    if "$unset" in carried and not unset:
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
    clash = sorted(set(match) & {"lockedAt", "lockedUntil", "lockToken", "failedBy"})
    if clash:
        raise ConfigError(f"a handler's filter cannot select on {clash}: the claim owns them")


# -- operators: status, unlock, retry ------------------------------------------------------

ERRORS_SORT: list[tuple[str, int]] = [("lastError.at", -1), ("_id", -1)]
"""Latest failure first: ``ERRORS_INDEX``'s order within a phase."""


def status_pipeline(
    now: datetime, match: Mapping[str, Any] | None = None, legacy: float | None = None
) -> list[dict[str, Any]]:
    """Per phase: documents, leases held now, leases held past their expiry (the holder
    died or is stuck), documents waiting out a relock or retry, and documents whose latest
    attempt failed. Every lease carries its expiry, so no lock timeout is needed here.

    ``match`` narrows it to some documents (the operator's page judges one document's
    lease with it), so one judgement serves the counts and a single document alike.
    ``legacy`` (the live replicas' ``legacy_lock_timeout``): a document only an in-house
    lease holds (``in_house_lease``) counts as leased, and not as overdue."""
    at = bson_time(now)
    token = {"$ifNull": ["$lockToken", None]}
    held, free = {"$gt": [token, None]}, {"$lte": [token, None]}
    # BSON order ranks null, numbers and strings below every date: not live.
    until = {"$ifNull": ["$lockedUntil", None]}
    live, expired = {"$gt": [until, at]}, {"$lte": [until, at]}
    leased: dict[str, Any] = {"$and": [held, live]}
    overdue: dict[str, Any] = {"$and": [held, expired]}
    if legacy is not None:
        locked = {"$ifNull": ["$lockedAt", None]}
        in_house = {"$and": [{"$gt": [locked, legacy_floor(now, legacy)]}, expired]}
        leased = {"$or": [leased, in_house]}
        overdue = {"$and": [held, expired, {"$not": [in_house]}]}

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
                "failed": count_if({"$gt": [{"$ifNull": ["$lastError", None]}, None]}),
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


def operator_unlock_update() -> dict[str, Any]:
    """An operator's unlock: claimable at once, counters untouched, and no note of the
    last step's error may land after it (``lastToken`` goes, as ``released_fence`` asks
    of any change by someone else)."""
    update = release_update()
    update["$unset"]["lastToken"] = ""
    return update


def operator_move_update(phase: str, now: datetime) -> dict[str, Any]:
    """An operator's retry or cancel: to ``phase`` with fresh counters, claimable at once,
    the lease taken from any step running (as an outside writer's phase change: its later
    writes raise ``LeaseLost``); the error is kept as ``previousError`` so the operator's
    reason to act stays visible."""
    update = advance_update(phase, now, {})
    update["$unset"] = {"lockToken": "", "failedBy": "", "lastToken": ""}
    return update


# -- live replicas -------------------------------------------------------------------------

REPLICA_INDEX: list[tuple[str, int]] = [("expiresAt", 1)]
"""The TTL index of the replicas' records: each record carries its own expiry, so one
index with ``expireAfterSeconds: 0`` serves replicas with any settings."""

REPLICA_INDEX_NAME = "orchestrator_replica_expiry"
REPLICA_INDEX_EXPIRY = 0
"""Seconds past ``expiresAt`` after which the server deletes a record (at its TTL
monitor's next pass, within a minute)."""

REPLICAS_SORT: list[tuple[str, int]] = [("_id", 1)]


def replica_document(record: ReplicaRecord) -> dict[str, Any]:
    """A replica's record as stored, replacing the last one whole (``_id``: the replica
    id), so no field of an earlier version or setting lingers."""
    return {
        "_id": record.replica_id,
        "instance": record.instance,
        "host": record.host,
        "pid": record.pid,
        "version": record.version,
        "engine": record.engine,
        "started": bson_time(record.started),
        "lastSeen": bson_time(record.last_seen),
        "expiresAt": bson_time(record.expires_at),
        "lockTimeout": record.lock_timeout,
        "legacyLockTimeout": record.legacy_lock_timeout,
        "tick": record.tick,
        "maxConcurrency": record.max_concurrency,
        "steps": [
            {"collection": s.collection, "id": s.id, "phase": s.phase, "since": bson_time(s.since)}
            for s in record.steps
        ],
        "handlers": [h.to_dict() for h in record.handlers],
        "unique": [{"collection": c, "keys": list(k)} for c, k in record.unique],
        "cancelledPhase": record.cancelled_phase,
        "history": record.history,
        "paused": list(record.paused),
        "claimStrategy": record.claim_strategy,
        "claimCandidates": record.claim_candidates,
    }


REPLICA_INSTANCE_PROJECTION: dict[str, Any] = {"_id": 0, "instance": 1}
"""What a refresh reads back of the record it replaces: who wrote it."""


def replica_filter(replica_id: str) -> dict[str, Any]:
    return {"_id": replica_id}


def replica_removal(replica_id: str, instance: str) -> dict[str, Any]:
    """A stopping replica's own record only: another process started with the same
    replica id (a restarted pod) keeps the one it wrote since."""
    return {"_id": replica_id, "instance": instance}


def live_replicas_filter(now: datetime) -> dict[str, Any]:
    """Records not yet expired at ``now`` (the server's time): the TTL monitor runs once a
    minute, so an expired record may still be there."""
    return {"expiresAt": {"$gt": bson_time(now)}}


# -- cluster-wide limits: slots -------------------------------------------------------------

SLOT_INDEX: list[tuple[str, int]] = [("handler", 1), ("kind", 1), ("until", 1)]
"""Serves the take of a free slot of one limit (``take_slot_filter``) and the read of its
next free one (``next_slot_filter``)."""

SLOT_INDEX_NAME = "orchestrator_slots"


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
