"""What the async and the sync store share and that does no I/O.

The stores (``_async/store.py``, and ``_sync/store.py`` generated from it) only carry
queries to the server and answers back; every decision about those answers is made here
once: how a driver error is classified, which codec options and write concern the store
reads and writes with, whether a server is recent enough, and whether an existing index
can do the job of the one the orchestrator needs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import BSONError
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
    WTimeoutError,
)
from pymongo.errors import DocumentTooLarge as DriverDocumentTooLarge
from pymongo.server_type import SERVER_TYPE
from pymongo.write_concern import WriteConcern

from orchestrator.core import pauses, sharding
from orchestrator.core.clock import as_utc
from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.queries import claims
from orchestrator.core.redact import redact
from orchestrator.core.scheduler import Found

MIN_SERVER_VERSION = "4.4"
MIN_WIRE_VERSION = 9
"""The oldest MongoDB the orchestrator runs on (the oldest PyMongo 4.14+ connects to)."""
_RELEASES = {6: "3.6", 7: "4.0", 8: "4.2"}

COMMAND_NOT_FOUND = 59
"""The server's answer to ``hello`` before MongoDB 4.4.2 (and 4.2.10, 4.0.21)."""
WRITE_CONCERN_FAILED = 64
UNKNOWN_STAGE_CODES = frozenset({16436, 40324})
"""The server's answer to an aggregation stage it does not know (``$unionWith`` before 4.4)."""
TOO_LARGE_CODES = frozenset({10334, 17419, 17420})
"""BSONObjectTooLarge; an update's, an upsert's result over 16 MiB (Location17419/17420)."""
INDEX_CONFLICT_CODES = frozenset({85, 86})
"""IndexOptionsConflict, IndexKeySpecsConflict: an index of that name or keys exists."""
SHARD_KEY_NOT_FOUND = 61
"""A sharded collection's refusal, before MongoDB 8.0 (7.1 on Atlas), of a findAndModify,
a single delete or an upsert whose filter does not name the whole shard key."""
INVALID_OPTIONS = 72
DUPLICATE_KEY = 11000
"""An insert refused by a unique index: a limit's slot another replica made first."""
"""InvalidOptions: among others, a sharded collection's refusal of a single update that
names neither its ``_id`` nor its shard key."""


class DocumentTooLarge(StoreError):
    """The server refused a write because the document would exceed 16 MiB: nothing of
    it was applied."""


# -- driver errors -------------------------------------------------------------------------


def is_write_timeout(exc: PyMongoError) -> bool:
    """The write applied on the primary, but too few members acknowledged it within
    ``wtimeout``: no majority is reachable now (an election, a partition)."""
    if isinstance(exc, WTimeoutError):
        return True
    if isinstance(exc, WriteConcernError):
        info = (exc.details or {}).get("errInfo")
        return exc.code == WRITE_CONCERN_FAILED or (
            isinstance(info, Mapping) and bool(info.get("wtimeout"))
        )
    return False


def is_transient(exc: PyMongoError) -> bool:
    """Network trouble and elections: the same operation may succeed when retried."""
    return isinstance(exc, AutoReconnect | ConnectionFailure) or exc.has_error_label(
        "RetryableWriteError"
    )


def _too_large(exc: Exception) -> bool:
    if isinstance(exc, DriverDocumentTooLarge):
        return True
    return isinstance(exc, OperationFailure) and exc.code in TOO_LARGE_CODES


def untargeted(exc: PyMongoError) -> bool:
    """The server refused a write because it names no shard key of a sharded collection."""
    if not isinstance(exc, OperationFailure):
        return False
    if exc.code == SHARD_KEY_NOT_FOUND:
        return True
    return exc.code == INVALID_OPTIONS and "sharded collection" in str(exc)


Sharded = tuple[str, Sequence[str] | None]
"""A write's collection, and the shard key it names (None: not known where it is sent)."""


@contextmanager
def driver_errors(action: str, sharded: Sharded | None = None) -> Iterator[None]:
    """Driver errors raised inside leave as ``StoreError`` saying what ``action`` failed,
    with ``transient`` set when retrying may help, so no layer above sees pymongo's.

    ``sharded``: a write to that collection, naming that shard key; the server's refusal
    of it for want of the shard key leaves as ``ShardKeyRequired`` (a ``ConfigError``
    naming the fix), never as a ``StoreError`` to retry: retrying cannot help."""
    try:
        yield
    except PyMongoError as exc:
        if sharded is not None and untargeted(exc):
            details = exc.details if isinstance(exc, OperationFailure) else None
            said = (details or {}).get("errmsg") or str(exc)
            raise sharding.refused(sharded[0], sharded[1], redact(str(said))) from exc
        if _too_large(exc):
            raise DocumentTooLarge(
                f"{action} refused: the document would exceed MongoDB's 16 MiB limit"
                f" ({redact(str(exc))})"
            ) from exc
        if is_write_timeout(exc):
            raise StoreError(
                f"{action}: no majority acknowledged the write within the write timeout"
                " (it may have applied on the primary)",
                transient=True,
            ) from exc
        raise StoreError(
            f"{action} failed: {redact(str(exc))}", transient=is_transient(exc)
        ) from exc
    except BSONError as exc:  # DocumentTooLarge and unencodable values are not PyMongoErrors
        if _too_large(exc):
            raise DocumentTooLarge(f"{action} refused: {redact(str(exc))}") from exc
        raise StoreError(f"{action} failed: {redact(str(exc))}") from exc


# -- the server and the store's options ----------------------------------------------------


def check_server(reply: Mapping[str, Any]) -> None:
    """Refuse a server older than ``MIN_SERVER_VERSION``, judged by the ``maxWireVersion``
    of its ``hello`` (every server sends it)."""
    wire = reply.get("maxWireVersion")
    if isinstance(wire, int) and not isinstance(wire, bool) and wire < MIN_WIRE_VERSION:
        release = _RELEASES.get(wire, "older than 3.6")
        raise StoreError(
            f"MongoDB {MIN_SERVER_VERSION} or newer is required; this server is MongoDB "
            f"{release} (wire version {wire})"
        )


_BAD_DATABASE_CHARS = frozenset('/\\. "$*<>:|?\x00')


def database_kind(db: object) -> bool | None:
    """True for a database of PyMongo's async API (``AsyncDatabase``, its in-memory and
    fault-injecting stand-ins: their ``command`` is a coroutine function), False for a sync
    one, None for what is no database."""
    if isinstance(db, AsyncDatabase):
        return True
    if isinstance(db, Database):
        return False
    command = getattr(db, "command", None)
    if not callable(command) or not callable(getattr(db, "get_collection", None)):
        return None
    return inspect.iscoroutinefunction(command)


def primary_of(client: object) -> Hashable:
    """What names the server whose clock a replica measures, from what the driver already
    knows of its topology (no I/O): the replica set's primary and its election. A
    failover changes it, and with it, possibly, the clock ``hello`` reports. None when
    the client tells nothing (the in-memory store), or has no primary right now."""
    try:
        description = getattr(client, "topology_description", None)
        if description is None:
            return None
        servers = description.server_descriptions().values()
        return next(
            (
                (s.address, s.election_id, s.set_version)
                for s in servers
                if s.server_type == SERVER_TYPE.RSPrimary
            ),
            None,
        )
    except Exception:  # a proxy or fake client: nothing to watch
        return None


def check_database_name(name: object) -> None:
    """MongoDB's naming rules, checked before the first operation rather than by it."""
    if (
        not isinstance(name, str)
        or not name
        or len(name.encode("utf-8")) >= 64
        or _BAD_DATABASE_CHARS.intersection(name)
    ):
        raise ConfigError(
            f'invalid database name {name!r}: 1 to 63 bytes, none of / \\ . space " $ * < > : | ?'
        )


def write_concern(w: str | int, write_timeout: float) -> WriteConcern:
    """The store's write concern: ``w``, waiting at most ``write_timeout`` seconds
    (``wtimeout``), so a write raises a transient error instead of blocking while no
    majority is reachable."""
    if (
        not isinstance(write_timeout, int | float)
        or not math.isfinite(write_timeout)
        or write_timeout <= 0
    ):
        raise ConfigError(f"write_timeout must be a number of seconds > 0, not {write_timeout!r}")
    return WriteConcern(w=w, wtimeout=max(1, round(write_timeout * 1000)))


def codec_options(client: CodecOptions[Document]) -> CodecOptions[Document]:
    """Read what the library expects whatever the client's options (``tz_aware``,
    ``DATETIME_MS``): aware UTC datetimes, and a date outside ``datetime``'s range as
    ``bson.DatetimeMS`` rather than an error; documents as the client's document class."""
    return client.with_options(
        tz_aware=True, tzinfo=UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
    )


def unreachable(exc: PyMongoError) -> str:
    """The reason a server could not be reached, in one short line: the driver's message
    without its timeouts and topology description (hundreds of characters), redacted."""
    reason = str(exc).split(" (configured timeouts", 1)[0].split(", Timeout:", 1)[0]
    reason = " ".join(redact(reason).split())
    return reason[:200] if reason else type(exc).__name__


def client_options(timeout: float) -> dict[str, Any]:
    """The options ``connect`` opens a client with: server selection gives up after
    ``timeout`` seconds, so a command-line tool fails in seconds, not thirty."""
    return {"serverSelectionTimeoutMS": max(int(timeout * 1000), 1), "appname": "orchestrator"}


# -- indexes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexPlan:
    """What ``ensure_index`` does after reading a collection's indexes: use ``reuse`` (an
    index that does the job), or drop ``replace`` (an earlier version's, if any) and
    create the index."""

    reuse: str | None = None
    replace: str | None = None


def index_keys(keys: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(str(k), int(d)) for k, d in keys]


def index_options(index_name: str, unique: bool, expire_after: int | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"name": index_name}
    if unique:
        options["unique"] = True
    if expire_after is not None:
        options["expireAfterSeconds"] = expire_after
    return options


def has_collation(existing: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the collection's default collation must be read to judge ``existing``
    (only an index with a collation can differ from it)."""
    return any("collation" in info for info in existing)


def plan_index(
    collection: str,
    existing: Sequence[Mapping[str, Any]],
    wanted: list[tuple[str, int]],
    *,
    index_name: str,
    unique: bool,
    collation: Any,
    expire_after: int | None = None,
) -> IndexPlan:
    """Decide from the indexes ``existing`` on ``collection`` how to get one doing the job
    of ``wanted``.

    An application's equivalent index is reused whatever its name (the server refuses a
    second index on the same keys: codes 85/86). One on the same keys that cannot do the
    job (not unique, partial, sparse...) is refused with a ``ConfigError`` naming it. An
    index named ``index_name`` with other keys or options is an earlier version's: it is
    replaced. ``expire_after``: a TTL index, deleting documents that many seconds after
    the date in its key (the replicas' records).
    """
    for info in existing:
        if index_problem(info, wanted, unique, collation, expire_after) is None:
            return IndexPlan(reuse=str(info["name"]))
    ours: str | None = None
    for info in existing:
        if info.get("name") == index_name:
            ours = index_name
        elif key_pattern(info) == wanted:
            problem = index_problem(info, wanted, unique, collation, expire_after)
            raise ConfigError(
                f"collection {collection!r} has an index {info.get('name')!r} on "
                f"{describe_keys(wanted)} that {problem}; the orchestrator needs "
                f"{'a unique index' if unique else 'an index'} on these keys and "
                "adds no second index on one key pattern (a server before 5.0 "
                f"refuses it): {_index_remedy(unique)}"
            )
    return IndexPlan(replace=ours)


def duplicates_error(collection: str, wanted: Sequence[tuple[str, int]], exc: Exception) -> str:
    """Why a unique index could not be built: the collection already breaks it."""
    return (
        f"collection {collection!r} holds documents with the same "
        f"{describe_keys(wanted)}: the unique index cannot be built until "
        f"the duplicates are removed ({redact(str(exc))})"
    )


def key_pattern(info: Mapping[str, Any]) -> list[tuple[str, Any]]:
    key = info.get("key")
    if isinstance(key, Mapping):
        return list(key.items())
    if isinstance(key, list | tuple):
        return [tuple(pair) for pair in key]
    return []


def index_problem(
    info: Mapping[str, Any],
    wanted: list[tuple[str, int]],
    unique: bool,
    collation: Any,
    expire_after: int | None = None,
) -> str | None:
    """Why the existing index ``info`` cannot do the job of ``wanted``; None if it can.

    A unique index enforces the uniqueness of its set of fields whatever their order and
    direction; the claim needs its exact key pattern to serve its filter and sort.
    """
    keys = key_pattern(info)
    if unique:
        same = len(keys) == len(wanted) and {k for k, _ in keys} == {k for k, _ in wanted}
        if not same or any(d not in (1, -1) for _, d in keys):
            return "has other keys"
        if not info.get("unique"):
            return "is not unique"
    else:
        if keys != wanted:
            return "has other keys"
        if info.get("unique"):
            return "is unique (documents with equal keys would be refused)"
        if info.get("sparse"):
            return "is sparse (it cannot serve a claim of documents missing a key)"
        if info.get("hidden"):
            return "is hidden from the query planner"
    if expire_after is not None and info.get("expireAfterSeconds") != expire_after:
        return f"does not expire documents {expire_after}s after their {describe_keys(wanted)}"
    if "partialFilterExpression" in info:
        return "is partial (it covers only documents matching its filter)"
    if _collation(info.get("collation")) != _collation(collation):
        return "has a collation other than the collection's (the orchestrator's queries use that)"
    return None


def _collation(value: Any) -> Any:
    """None for the simple (binary) collation, however it is spelt."""
    if not isinstance(value, Mapping) or value.get("locale", "simple") == "simple":
        return None
    return dict(value)


def describe_keys(keys: Sequence[tuple[str, int]]) -> str:
    return "(" + ", ".join(k if d == 1 else f"{k} {d}" for k, d in keys) + ")"


def _index_remedy(unique: bool) -> str:
    if unique:
        return (
            "make it unique (collMod with prepareUnique, then unique; MongoDB 6.0+) or drop it,"
            " and the orchestrator creates its own"
        )
    return "drop it, and the orchestrator creates its own"


def unknown_stage(exc: OperationFailure) -> bool:
    """The server refused a pipeline stage it does not know (so the probe asks per
    collection)."""
    return exc.code in UNKNOWN_STAGE_CODES or "Unrecognized pipeline stage" in str(exc)


def found(
    rows: Sequence[Mapping[str, Any]], with_pauses: bool = False, in_house: InHouse = NO_IN_HOUSE
) -> Found:
    """A probe's answer (``claims.probe_pipeline``): the handlers with work now, the
    earliest due time among the documents of the others (while migrating, an in-house
    lease's comes as its ``lockedAt``), the operators' pauses (``with_pauses``) and how
    many replicas are live, when it read them. A row that is none of those is skipped:
    the probe only ever narrows what is claimed."""
    ready: set[int] = set()
    due: datetime | None = None
    paused: list[Mapping[str, Any]] = []
    live: int | None = None
    for row in rows:
        number = row.get(claims.PROBE_HANDLER)
        when = row.get(claims.PROBE_DUE)
        held = row.get(claims.PROBE_HELD_AT)
        if in_house.migrating and isinstance(held, datetime):
            when = in_house.expiry(held)
        if isinstance(number, int) and not isinstance(number, bool):
            ready.add(number)
        elif isinstance(when, datetime):
            when = as_utc(when)
            due = when if due is None or when < due else due
        elif isinstance(row.get(claims.PROBE_PAUSE), Mapping):
            paused.append(row[claims.PROBE_PAUSE])
        elif isinstance(row.get(claims.PROBE_LIVE), int):
            live = row[claims.PROBE_LIVE]
    return Found(frozenset(ready), due, pauses.read_all(paused) if with_pauses else None, live)


def merged(answers: Sequence[Found], sizes: Sequence[int]) -> Found:
    """The answers of a probe read in parts (``claims.probe_chunks``) as one: each part's
    handlers numbered after those of the parts before (``sizes``), the earliest due time,
    the pauses and the live replicas of the first."""
    ready: set[int] = set()
    offset = 0
    for answer, size in zip(answers, sizes, strict=True):
        ready.update(offset + n for n in answer.ready)
        offset += size
    dues = [a.next_due for a in answers if a.next_due is not None]
    first = answers[0]
    return Found(frozenset(ready), min(dues) if dues else None, first.pauses, first.live)
