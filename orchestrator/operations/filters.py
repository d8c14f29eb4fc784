"""Finding documents: an operator's filter, as the one query, order and index that serve it.

Every tool pages through documents the same way (the page, ``orchestrator find``, the JSON
API, and the bulk actions, which act on what a filter selects): a ``Filter`` becomes a
``Plan``, a query with a sort that an index provides and a hint naming that index, so
no filter ever costs a collection scan, and pages follow each other by keyset (the next
page starts after the last document shown, by the sort's own fields), never by skipping.

Which index serves which filter (``plan``):

- phase, lease state (leased, overdue, waiting, free), or none: the claim index
  ``CLAIM_INDEX`` (phase, claimPriority desc, lockedUntil, updatedAt, _id), in its order
  (the next to be claimed first). Without a phase the
  query names every phase the collection has (``$in``, from ``distinct``, itself served
  by the index), which the server merges in index order.
- retrying (a recorded error, no handler gave up), failed (a handler gave up: its
  ``failedBy`` mark), and an error type: ``ERRORS_INDEX`` (phase, lastError.at desc,
  _id desc): the latest errors first. A document given up on keeps its error (a
  document at 16 MiB keeps none, and sorts last), so the failed list is the errors
  index's entries of its phases with the mark.
- a business key (``FIELD=VALUE``): an index whose first field is FIELD (the unique
  index of ``submit``'s keys, or one of the application's); a field no index starts
  with is refused (``UnindexedField``), naming the indexes there are.
- a parent (``owner``: its children): ``trees.OWNER_INDEX``, which the replicas make on
  every collection they make children in (a collection without it is refused too).
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from bson import DBRef, Decimal128, MaxKey, MinKey, ObjectId, Regex, Timestamp, json_util
from bson.binary import UuidRepresentation
from bson.code import Code
from bson.codec_options import DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS

from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.errors import OperatorError, Refusal
from orchestrator.core.history import HISTORY_FIELD
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.names import CLAIM_INDEX_NAME, ERRORS_INDEX_NAME, OWNER_INDEX_NAME
from orchestrator.core.queries.claims import CLAIM_INDEX
from orchestrator.core.queries.operators import ERRORS_INDEX
from orchestrator.core.queries.trees import OWNER_INDEX, children_filter
from orchestrator.core.retention import expiry_of
from orchestrator.operations.rules import holding
from orchestrator.operations.tree_report import parent_of, progress_line, wait_line

MAX_LIMIT = 500
"""Most documents one page holds."""
DEFAULT_LIMIT = 50


class LeaseState(StrEnum):
    """A document's lease state, as the status counts judge it (``operators.status_pipeline``):
    ``leased`` a live lease holds it; ``overdue`` a lease past its expiry still names it
    (its holder died or is stuck: claimable); ``waiting`` it sits out a relock's or retry's
    wait, or a later start set at submit (``not_before``);
    ``free`` none of those (claimable now, unless its handler failed it).

    And what became of its failed attempts, which cuts across those (``attempt_state``):
    ``retrying`` its latest attempt failed and the library tries it again (it carries
    ``lastError``, and no handler gave up on it); ``failed`` a handler gave up on it (its
    last attempt, or ``fail()``): it stays in that handler's failed phase, marked
    ``failedBy``, until an operator retries it. The two are apart so that acting on the
    given-up ones (a bulk retry resets attempts) leaves those still being retried alone."""

    LEASED = "leased"
    OVERDUE = "overdue"
    WAITING = "waiting"
    FREE = "free"
    RETRYING = "retrying"
    FAILED = "failed"


_ERROR_STATES = (LeaseState.RETRYING, LeaseState.FAILED)
"""The states of a document's failed attempts: the errors index serves them."""


class UnindexedField(OperatorError):
    """A filter on a field no index starts with: it would scan the collection."""

    refusal = Refusal.UNINDEXED_FIELD


@dataclass(frozen=True)
class Filter:
    """What an operator asks for in one collection: any of the phases ``phases`` (none:
    every phase), in lease state ``state``, whose last error is of type ``error_type``,
    whose fields equal ``fields`` (a business key: ``FIELD=VALUE`` pairs), the children
    of ``owner`` (its collection and exact ``_id``)."""

    collection: str
    phases: tuple[str, ...] = ()
    state: LeaseState | None = None
    error_type: str | None = None
    fields: tuple[tuple[str, Any], ...] = ()
    owner: tuple[str, Any] | None = None

    def __post_init__(self) -> None:
        for phase in self.phases:
            if not isinstance(phase, str) or not phase or phase.startswith("$"):
                raise OperatorError(f"{phase!r} is not a phase name")
        for name, _ in self.fields:
            if not name or name.startswith("$") or "\x00" in name or name.endswith("."):
                raise OperatorError(f"{name!r} is not a field name")
        if self.error_type is not None and not self.error_type:
            raise OperatorError("an error type is a name, not empty")

    def describe(self) -> dict[str, Any]:
        """The filter as operators read it, and as the audit trail keeps it."""
        shown: dict[str, Any] = {"collection": self.collection}
        if self.phases:
            shown["phase"] = list(self.phases)
        if self.state is not None:
            shown["state"] = self.state.value
        if self.error_type is not None:
            shown["error"] = self.error_type
        for name, value in self.fields:
            shown[name] = _plain(value)
        if self.owner is not None:
            shown["owner"] = f"{self.owner[0]}/{_text(self.owner[1])}"
        return shown


@dataclass(frozen=True)
class Plan:
    """A filter's query at one moment, the order that pages it, and the index that serves
    both (``hint``: its key pattern, so an equivalent index of the application's serves
    too, and a missing one fails loudly instead of scanning)."""

    query: dict[str, Any]
    sort: list[tuple[str, int]]
    hint: list[tuple[str, int]]
    index: str = field(default="")
    """Which index serves it, in words (for operators, and the closing note)."""


LEASE_ORDER: list[tuple[str, int]] = list(CLAIM_INDEX[1:])
"""claimPriority (descending), lockedUntil, updatedAt, _id: the claim index's order within
a phase (the next to be claimed first)."""
ERROR_ORDER: list[tuple[str, int]] = list(ERRORS_INDEX[1:])
"""The latest error first."""

CLAIM_KEYS = ", ".join(f"{name}{' desc' if way < 0 else ''}" for name, way in CLAIM_INDEX)
"""The claim index's keys as operators read them."""

LIST_PROJECTION: dict[str, Any] = {HISTORY_FIELD: 0}
"""A list shows a document's lease and key, never its history (up to ``MAX_HISTORY``
entries with tracebacks)."""


def state_condition(
    state: LeaseState, now: datetime, in_house: InHouse = NO_IN_HOUSE
) -> dict[str, Any]:
    """The documents in ``state`` at ``now`` (the server's time), as a query: the status
    pipeline's judgement in query form (a date ``lockedUntil`` after ``now`` is live;
    anything else, missing and malformed values included, is not). ``in_house``: a
    document only an in-house lease holds is leased (``InHouse.holds``)."""
    at = bson_time(now)
    live = {"lockedUntil": {"$gt": at}}
    not_live = {"lockedUntil": {"$not": {"$gt": at}}}
    held = {"lockToken": {"$ne": None}}
    free = {"lockToken": None}
    conditions: dict[LeaseState, dict[str, Any]] = {
        LeaseState.LEASED: {"$and": [held, live]},
        LeaseState.OVERDUE: {"$and": [held, not_live]},
        LeaseState.WAITING: {"$and": [free, live]},
        LeaseState.FREE: {"$and": [free, not_live]},
        LeaseState.RETRYING: {"$and": [{"lastError": {"$ne": None}}, {"failedBy": None}]},
        LeaseState.FAILED: {"failedBy": {"$ne": None}},
    }
    if in_house.migrating:
        floor = in_house.floor(now)
        in_house_held = {"lockedAt": {"$gt": floor}}
        not_in_house = {"lockedAt": {"$not": {"$gt": floor}}}
        conditions |= {
            LeaseState.LEASED: {
                "$or": [{"$and": [held, live]}, {"$and": [in_house_held, not_live]}]
            },
            LeaseState.OVERDUE: {"$and": [held, not_live, not_in_house]},
            LeaseState.FREE: {"$and": [free, not_live, not_in_house]},
        }
    return conditions[state]


def plan(
    browse: Filter,
    now: datetime,
    every_phase: Sequence[str],
    indexes: Sequence[Sequence[tuple[str, Any]]],
    *,
    after: str | None = None,
    in_house: InHouse = NO_IN_HOUSE,
) -> Plan:
    """The query serving ``browse`` at ``now``; ``every_phase``: the collection's phases
    (``distinct``), for a filter naming none; ``indexes``: the collection's indexes' key
    patterns (a business key needs one); ``after``: the cursor of the page before
    (``cursor``), or None for the first page; ``in_house``: as for ``state_condition``."""
    phases = list(browse.phases) or sorted(set(every_phase))
    parts: list[dict[str, Any]] = [{"phase": phases[0] if len(phases) == 1 else {"$in": phases}}]
    if browse.state is not None:
        parts.append(state_condition(browse.state, now, in_house))
    if browse.error_type is not None:
        parts.append({"lastError.type": {"$eq": browse.error_type}})
    for name, value in browse.fields:
        parts.append({name: {"$eq": value}})
    if browse.owner is not None:
        parts.append(children_filter(*browse.owner))
    if browse.fields:
        first = browse.fields[0][0]
        hint = _index_starting(first, indexes)
        if hint is None:
            shown = ", ".join("(" + ", ".join(k for k, _ in keys) + ")" for keys in indexes)
            raise UnindexedField(
                f"no index of {browse.collection!r} starts with {first!r}, so finding by it "
                f"would scan the collection; its indexes: {shown or 'none'}. Filter by a "
                "field an index starts with (submit's unique keys are indexed), or create one"
            )
        sort: list[tuple[str, int]] = [("_id", 1)]
        served = f"the index on ({', '.join(k for k, _ in hint)})"
    elif browse.owner is not None:
        if _index_starting(OWNER_INDEX[0][0], indexes) is None:
            raise UnindexedField(
                f"no index of {browse.collection!r} serves the children of a document "
                f"({OWNER_INDEX_NAME}: the replicas make it where they make children), so "
                "finding them would scan the collection"
            )
        hint, sort = list(OWNER_INDEX), [("_id", 1)]
        served = f"{OWNER_INDEX_NAME} (the owner's collection and id)"
    elif browse.state in _ERROR_STATES or browse.error_type is not None:
        hint, sort = list(ERRORS_INDEX), ERROR_ORDER
        served = f"{ERRORS_INDEX_NAME} (phase, lastError.at desc, _id desc)"
    else:
        hint, sort = list(CLAIM_INDEX), LEASE_ORDER
        served = f"{CLAIM_INDEX_NAME} ({CLAIM_KEYS})"
    if after is not None:
        parts.append(_after(sort, _decode(after, sort)))
    query = parts[0] if len(parts) == 1 else {"$and": parts}
    return Plan(query=query, sort=sort, hint=hint, index=served)


def attempt_state(doc: Mapping[str, Any]) -> LeaseState | None:
    """What became of ``doc``'s failed attempts, as ``state_condition`` and the status
    counts judge it: ``FAILED`` a handler gave up on it (a ``failedBy`` mark),
    ``RETRYING`` it carries an error and none did; None when it carries neither."""
    if doc.get("failedBy") is not None:
        return LeaseState.FAILED
    if doc.get("lastError") is not None:
        return LeaseState.RETRYING
    return None


def judge(doc: Mapping[str, Any], now: datetime, in_house: InHouse = NO_IN_HOUSE) -> LeaseState:
    """``doc``'s lease state at ``now`` (leased, overdue, waiting or free), as
    ``state_condition`` and the status counts judge it: a lease token with a date
    ``lockedUntil`` after ``now`` is leased, with anything else overdue; no token and a
    later date is waiting; anything else is free. ``in_house``: an in-house lease is leased."""
    if in_house.holds(doc, now):
        return LeaseState.LEASED
    until = doc.get("lockedUntil")
    live = isinstance(until, datetime) and as_utc(until) > as_utc(now)
    if doc.get("lockToken") is not None:
        return LeaseState.LEASED if live else LeaseState.OVERDUE
    return LeaseState.WAITING if live else LeaseState.FREE


@dataclass(frozen=True)
class Row:
    """A document as a list shows it, every part as text whatever the stored fields hold:
    ``id`` its id as text, ``ref`` as canonical Extended JSON (exact, for links and
    actions; None when it has none); ``key`` its business key (``FIELD=VALUE``), ``state``
    its lease state, ``failed_by`` the handler (by name where a live replica publishes
    it) that gave up on it and leaves it alone in its failed phase; ``failure`` what
    became of its failed attempts (``attempt_state``: retrying, failed, or None). An in-house pod's
    lease (``in_house``) shows its own expiry, held by ``IN_HOUSE_HOLDER``.
    ``expires_at``: when the server deletes it, dated by its retained phase
    (``retention.expiry_of``; None when it is not dated). ``owner``: its parent as
    ``collection/id`` (``unreadable`` when the field holds no owner), ``wait``: what it
    waits for, in words (``tree_report.wait_line``; children not counted)."""

    id: str
    ref: str | None
    key: str | None
    phase: str | None
    state: LeaseState
    holder: str | None
    until: datetime | None
    attempts: int
    error_type: str | None
    error_message: str | None
    error_at: datetime | None
    failed_by: str | None
    updated_at: datetime | None
    expires_at: datetime | None = None
    owner: str | None = None
    wait: str | None = None
    progress: str | None = None
    failure: LeaseState | None = None

    @classmethod
    def read(
        cls,
        doc: Mapping[str, Any],
        now: datetime,
        keys: Sequence[tuple[str, ...]] = (),
        names: Mapping[str, str] | None = None,
        in_house: InHouse = NO_IN_HOUSE,
    ) -> Row:
        state = judge(doc, now, in_house)
        held = holding(doc, now, in_house)
        error = doc.get("lastError")
        kind = message = at = None
        if isinstance(error, Mapping):
            kind, message, at = error.get("type"), error.get("message"), error.get("at")
        elif error is not None:
            kind, message = "?", error
        until, holder = held.until, held.holder
        updated, attempts, mark = doc.get("updatedAt"), doc.get("attempts"), doc.get("failedBy")
        return cls(
            id=_text(doc.get("_id")),
            ref=_ref(doc.get("_id")),
            key=business_key(doc, keys),
            phase=None if doc.get("phase") is None else _text(doc.get("phase")),
            state=state,
            holder=_text(holder)
            if holder is not None and state in (LeaseState.LEASED, LeaseState.OVERDUE)
            else None,
            until=as_utc(until) if isinstance(until, datetime) else None,
            attempts=attempts
            if isinstance(attempts, int) and not isinstance(attempts, bool)
            else 0,
            error_type=None if kind is None else _text(kind),
            error_message=None if message is None else _text(message),
            error_at=as_utc(at) if isinstance(at, datetime) else None,
            failed_by=None if mark is None else (names or {}).get(_text(mark), _text(mark)),
            updated_at=as_utc(updated) if isinstance(updated, datetime) else None,
            expires_at=expiry_of(doc),
            owner=_owner(doc),
            wait=wait_line(doc),
            progress=progress_line(doc),
            failure=attempt_state(doc),
        )

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        for name in ("until", "error_at", "updated_at", "expires_at"):
            data[name] = data[name].isoformat() if data[name] is not None else None
        data["state"] = self.state.value
        data["failure"] = None if self.failure is None else self.failure.value
        return data


@dataclass(frozen=True)
class Page:
    """One page of a filter's documents: ``rows`` in the list's order, ``next`` the cursor
    of the page after it (None: this is the last), ``index`` the index that served it."""

    rows: list[Row]
    next: str | None
    index: str
    at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "documents": [row.to_dict() for row in self.rows],
            "next": self.next,
            "index": self.index,
        }


def business_key(doc: Mapping[str, Any], keys: Sequence[tuple[str, ...]]) -> str | None:
    """``doc``'s business key as ``FIELD=VALUE`` (joined by ``, `` for a compound key),
    from the first of ``keys`` it has every field of; None when none."""
    for fields in keys:
        values = [_get(doc, name) for name in fields]
        if all(v is not None for v in values):
            return ", ".join(f"{n}={_text(v)}" for n, v in zip(fields, values, strict=True))
    return None


def _owner(doc: Mapping[str, Any]) -> str | None:
    parent, unreadable = parent_of(doc)
    if parent is not None:
        return f"{parent.collection}/{parent.id}"
    return "unreadable" if unreadable else None


def _ref(doc_id: Any) -> str | None:
    try:
        return json_util.dumps(doc_id, json_options=CANONICAL_JSON_OPTIONS)
    except (TypeError, ValueError, BSONError):
        return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def cursor(
    doc: Mapping[str, Any],
    sort: Sequence[tuple[str, int]],
    uuids: int = UuidRepresentation.STANDARD,
) -> str:
    """The cursor of the page after ``doc`` (the last of a page), in ``sort``'s order:
    its sort values, as canonical Extended JSON, base64url-encoded for a link. ``uuids``:
    the client's ``uuidRepresentation``, which decoded a ``uuid.UUID`` from binary data of
    its subtype, so the cursor names those same bytes. A value of a type BSON's order does
    not place (a custom codec's) is refused: no later page can be found after it."""
    values = [_get(doc, name) for name, _ in sort]
    for (name, _), value in zip(sort, values, strict=True):
        _placed(name, value, "a document's")
    if uuids == UuidRepresentation.UNSPECIFIED:
        uuids = UuidRepresentation.STANDARD
    options = CANONICAL_JSON_OPTIONS.with_options(uuid_representation=uuids)
    text = json_util.dumps(values, json_options=options)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


_CURSOR_OPTIONS = CANONICAL_JSON_OPTIONS.with_options(
    datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
"""A cursor's values as they were stored: binary data (a UUID's too) as ``Binary`` of its
subtype, a date outside ``datetime``'s range as ``DatetimeMS`` (as the store reads it)."""


def _decode(token: str, sort: Sequence[tuple[str, int]]) -> list[Any]:
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        values = json_util.loads(text, json_options=_CURSOR_OPTIONS)
    except (ValueError, TypeError, BSONError, binascii.Error, UnicodeDecodeError):
        raise OperatorError(f"malformed page cursor {token[:40]!r}") from None
    if not isinstance(values, list) or len(values) != len(sort):
        raise OperatorError("the page cursor is not one of this list's (start again)")
    for (name, _), value in zip(sort, values, strict=True):
        _placed(name, value, "the page cursor's")
    return values


def _placed(name: str, value: Any, whose: str) -> None:
    if _rank(value) is None:
        raise OperatorError(
            f"{whose} {name} is a {type(value).__name__}, a value BSON's sort order does not "
            "place, so no page can start after it (start again, or filter it out)"
        )


_TYPE_ORDER: tuple[tuple[str, ...], ...] = (
    ("minKey",),
    ("null",),
    ("number",),
    ("string", "symbol"),
    ("object",),
    ("array",),
    ("binData",),
    ("objectId",),
    ("bool",),
    ("date",),
    ("timestamp",),
    ("regex",),
    ("dbPointer",),
    ("javascript",),
    ("javascriptWithScope",),
    ("maxKey",),
)
"""BSON's comparison and sort order of types (MongoDB's ``canonicalizeBSONType``), each
rank by its ``$type`` names: int, long, double and decimal compare as numbers, symbols as
strings; null stands for missing and undefined too. ``$gt`` compares within a rank only,
so a keyset condition adds the ranks after the last value's."""

_RANKS = {kind: rank for rank, kinds in enumerate(_TYPE_ORDER) for kind in kinds}
_SINGLE = frozenset(_RANKS[kind] for kind in ("minKey", "null", "maxKey"))
"""The ranks of one value each: nothing follows within them (and ``$gt`` a minKey or
``$lt`` a maxKey would match every type)."""


def _rank(value: Any) -> int | None:
    """Where ``value``'s type sits in ``_TYPE_ORDER``, as PyMongo decodes each BSON type
    (a ``DBRef`` is stored as a document, a ``Code`` is a ``str`` and a ``bool`` an
    ``int`` to Python, so those come first); None for a type it does not place."""
    if value is None:
        return _RANKS["null"]
    if isinstance(value, Code):
        return _RANKS["javascript" if value.scope is None else "javascriptWithScope"]
    if isinstance(value, bool):
        return _RANKS["bool"]
    for kinds, kind in _PYTHON_TYPES:
        if isinstance(value, kinds):
            return _RANKS[kind]
    return None


_PYTHON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (MinKey, "minKey"),
    ((int, float, Decimal128), "number"),
    (str, "string"),
    ((Mapping, DBRef), "object"),
    ((list, tuple), "array"),
    ((bytes, uuid.UUID), "binData"),
    (ObjectId, "objectId"),
    ((datetime, DatetimeMS), "date"),
    (Timestamp, "timestamp"),
    ((Regex, re.Pattern), "regex"),
    (MaxKey, "maxKey"),
)
"""The Python types PyMongo decodes each BSON type to (``bytes``: ``Binary`` of any
subtype; ``uuid.UUID``: a UUID under a client's ``uuidRepresentation``)."""


def _beyond(name: str, value: Any, direction: int) -> dict[str, Any]:
    """``name`` after ``value`` in ``direction`` (1 ascending, -1 descending), across
    types as BSON orders them (null and missing alike, next after minKey)."""
    rank = _rank(value)
    assert rank is not None  # _decode refused the rest
    ranks = _TYPE_ORDER[rank + 1 :] if direction == 1 else _TYPE_ORDER[:rank]
    branches: list[dict[str, Any]] = [
        {name: None} if kind == "null" else {name: {"$type": kind}}
        for kinds in ranks
        for kind in kinds
    ]
    if rank not in _SINGLE:
        branches.insert(0, {name: {"$gt" if direction == 1 else "$lt": value}})
    if not branches:
        return {name: {"$in": []}}  # nothing comes after: the last possible value
    return branches[0] if len(branches) == 1 else {"$or": branches}


def _after(sort: Sequence[tuple[str, int]], values: Sequence[Any]) -> dict[str, Any]:
    """The documents after the one whose sort values are ``values``: later in the first
    field, or equal in it and later in the next, and so on (the last field is ``_id``,
    unique, so no two documents tie)."""
    branches = []
    for i, (name, direction) in enumerate(sort):
        beyond = _beyond(name, values[i], direction)
        equal = {
            n: ({"$eq": v} if v is not None else None)
            for (n, _), v in zip(sort[:i], values[:i], strict=True)
        }
        branches.append({**equal, **beyond} if equal else beyond)
    return {"$or": branches}


def _get(doc: Mapping[str, Any], path: str) -> Any:
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return bson_time(value) if isinstance(value, datetime) else value


def _index_starting(
    name: str, indexes: Sequence[Sequence[tuple[str, Any]]]
) -> list[tuple[str, Any]] | None:
    """The shortest index whose first field is ``name``."""
    found = [list(keys) for keys in indexes if keys and keys[0][0] == name]
    return min(found, key=len) if found else None


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def parse_fields(pairs: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    """``FIELD=VALUE`` pairs as typed: the value is Extended JSON when it parses as such
    (``n=42`` is the integer, ``n="42"`` the string), else the text as it is."""
    out = []
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise OperatorError(f"{pair!r} is not FIELD=VALUE")
        try:
            value = json_util.loads(raw, json_options=CANONICAL_JSON_OPTIONS)
        except (ValueError, TypeError, BSONError):
            value = raw
        if isinstance(value, dict | list):
            raise OperatorError(f"{pair!r}: a key's value is a string, number or id, not {raw}")
        out.append((name, value))
    return tuple(out)


__all__ = [
    "DEFAULT_LIMIT",
    "ERROR_ORDER",
    "LEASE_ORDER",
    "LIST_PROJECTION",
    "MAX_LIMIT",
    "Filter",
    "LeaseState",
    "Page",
    "Plan",
    "Row",
    "UnindexedField",
    "attempt_state",
    "business_key",
    "cursor",
    "judge",
    "parse_fields",
    "plan",
    "state_condition",
]
