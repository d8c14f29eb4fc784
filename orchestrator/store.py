"""The only module that talks to pymongo: it runs what ``queries`` builds.

Driver errors leave here as ``StoreError`` (with a ``transient`` flag) and fenced writes
that match nothing as ``LeaseLost``, so the layers above never see a driver exception.

Whatever codec options the application's client has (``tz_aware``, ``DATETIME_MS``...),
the store reads with its own: dates come back as aware UTC datetimes (a date outside the
range of ``datetime`` as ``bson.DatetimeMS``), documents as the client's document class.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import BSONError
from pymongo import MongoClient, ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteConcernError,
    WTimeoutError,
)
from pymongo.errors import DocumentTooLarge as DriverDocumentTooLarge
from pymongo.write_concern import WriteConcern

from orchestrator import queries
from orchestrator.errors import ConfigError, LeaseLost, StoreError
from orchestrator.queries import as_utc
from orchestrator.redact import redact

Document = dict[str, Any]

logger = logging.getLogger("orchestrator")

MIN_SERVER_VERSION = "4.4"
MIN_WIRE_VERSION = 9
"""The oldest MongoDB the orchestrator runs on (the oldest PyMongo 4.14+ connects to)."""
_RELEASES = {6: "3.6", 7: "4.0", 8: "4.2"}

COMMAND_NOT_FOUND = 59
"""The server's answer to ``hello`` before MongoDB 4.4.2 (and 4.2.10, 4.0.21)."""
WRITE_CONCERN_FAILED = 64
TOO_LARGE_CODES = frozenset({10334, 17419, 17420})
"""BSONObjectTooLarge; an update's, an upsert's result over 16 MiB (Location17419/17420)."""
INDEX_CONFLICT_CODES = frozenset({85, 86})
"""IndexOptionsConflict, IndexKeySpecsConflict: an index of that name or keys exists."""


class DocumentTooLarge(StoreError):
    """The server refused a write because the document would exceed 16 MiB: nothing of
    it was applied."""


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


@contextmanager
def driver_errors(action: str) -> Iterator[None]:
    try:
        yield
    except PyMongoError as exc:
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


def _check_database_name(name: object) -> None:
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


class Store:
    """Lease reads and writes against one database, with the configured write concern.

    Writes wait at most ``write_timeout`` seconds for their write concern (``wtimeout``):
    past it they raise a transient ``StoreError`` instead of blocking while no majority
    is reachable.
    """

    def __init__(
        self,
        db: Database[Document],
        write_concern: str | int = "majority",
        write_timeout: float = 10.0,
    ) -> None:
        _check_database_name(getattr(db, "name", None))
        if (
            not isinstance(write_timeout, int | float)
            or not math.isfinite(write_timeout)
            or write_timeout <= 0
        ):
            raise ConfigError(
                f"write_timeout must be a number of seconds > 0, not {write_timeout!r}"
            )
        self._db = db
        self._write_concern = WriteConcern(
            w=write_concern, wtimeout=max(1, round(write_timeout * 1000))
        )
        # Read what the library expects whatever the client's options (tz_aware, DATETIME_MS):
        # aware UTC datetimes; out-of-range dates as DatetimeMS rather than an error.
        self._codec: CodecOptions[Document] = db.codec_options.with_options(
            tz_aware=True, tzinfo=UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
        )
        self._collections: dict[str, Collection[Document]] = {}
        self._unique_done: set[tuple[str, tuple[str, ...]]] = set()
        self._lock = threading.Lock()
        self._legacy_hello = False

    @property
    def database(self) -> Database[Document]:
        return self._db

    def collection(self, name: str) -> Collection[Document]:
        coll = self._collections.get(name)
        if coll is None:
            coll = self._db.get_collection(
                name, codec_options=self._codec, write_concern=self._write_concern
            )
            self._collections[name] = coll
        return coll

    # -- time ---------------------------------------------------------------------------

    def server_time(self) -> datetime | None:
        """The server's clock from ``hello`` (no privileges needed), or None if it gives none.

        Raises ``StoreError`` for a server older than ``MIN_SERVER_VERSION``, so ``start()``,
        which measures the clock first, refuses it.
        """
        with driver_errors("hello"):
            reply = self._hello()
        check_server(reply)
        local = reply.get("localTime")
        return as_utc(local) if isinstance(local, datetime) else None

    def _hello(self) -> Mapping[str, Any]:
        """``hello``, or ``isMaster`` on servers that predate it (and from then on)."""
        if not self._legacy_hello:
            try:
                return self._db.command("hello", codec_options=self._codec)
            except OperationFailure as exc:
                if exc.code != COMMAND_NOT_FOUND:
                    raise
                self._legacy_hello = True
        return self._db.command("isMaster", codec_options=self._codec)

    # -- leases -------------------------------------------------------------------------

    def claim(
        self,
        name: str,
        match: Mapping[str, Any],
        judged_at: datetime,
        horizon: float,
        handler: str | None,
        update: Mapping[str, Any],
    ) -> Document | None:
        """One atomic find-and-modify: the longest-free document ``match`` selects whose
        lease is free at ``judged_at``, taken with ``update``; None when there is none."""
        with driver_errors(f"claim on {name}"):
            return self.collection(name).find_one_and_update(
                queries.claim_filter(match, judged_at, horizon, handler),
                dict(update),
                sort=queries.CLAIM_SORT,
                return_document=ReturnDocument.AFTER,
            )

    def has_claimable(
        self,
        name: str,
        matches: Sequence[tuple[Mapping[str, Any], str]],
        now: datetime,
        horizon: float,
    ) -> bool:
        """One read: could any of these handlers' claims find a document now?"""
        with driver_errors(f"probe {name}"):
            found = self.collection(name).find_one(
                queries.probe_filter(matches, now, horizon), queries.PROBE_PROJECTION
            )
        return found is not None

    def write(self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]) -> bool:
        """A fenced write (``query`` from ``queries.fenced``); False when it matched nothing,
        that is, the lease is no longer the writer's."""
        with driver_errors(f"write to {name}/{query.get('_id')}"):
            result = self.collection(name).update_one(dict(query), update)
        return result.matched_count > 0

    def delete(self, name: str, doc_id: Any, token: str) -> None:
        """Delete under a lease; ``LeaseLost`` when the lease is no longer this token's."""
        with driver_errors(f"remove {name}/{doc_id}"):
            result = self.collection(name).delete_one(queries.fenced(doc_id, token))
        if result.deleted_count == 0:
            raise LeaseLost(name, doc_id, token, "remove")

    # -- documents ----------------------------------------------------------------------

    def insert(self, name: str, doc: Document, unique: Sequence[str]) -> Document:
        """Create ``doc`` unless a document with the same unique keys exists; return the one
        stored. Concurrent calls with one key make one document (the unique index decides)."""
        coll = self.collection(name)
        if not unique:
            with driver_errors(f"insert into {name}"):
                coll.insert_one(doc)
            return doc
        key = queries.unique_filter(doc, unique)
        if tuple(unique) != ("_id",):
            self.ensure_unique(name, unique)
        on_insert = {k: v for k, v in doc.items() if k not in key}
        for _ in range(3):
            with driver_errors(f"submit to {name}"):
                try:
                    stored = coll.find_one_and_update(
                        key,
                        {"$setOnInsert": on_insert},
                        upsert=True,
                        return_document=ReturnDocument.AFTER,
                    )
                except DuplicateKeyError:
                    # Two upserts raced; the unique index let one insert. Read the winner.
                    stored = coll.find_one(key)
            if stored is not None:
                return stored
        raise StoreError(f"submit to {name}: the document {key} vanished while being created")

    def ensure_claim_index(self, name: str) -> str:
        """The index serving the claim: an equivalent one already there under any name, or
        a new one. Returns the name of the index used."""
        return self.ensure_index(
            name, queries.CLAIM_INDEX, index_name=queries.CLAIM_INDEX_NAME, unique=False
        )

    def ensure_unique(self, name: str, keys: Sequence[str]) -> None:
        marker = (name, tuple(keys))
        if marker in self._unique_done:
            return
        with self._lock:
            if marker in self._unique_done:
                return
            self.ensure_index(
                name,
                [(k, 1) for k in keys],
                index_name="orchestrator_unique_" + "_".join(keys),
                unique=True,
            )
            self._unique_done.add(marker)

    def ensure_index(
        self, name: str, keys: Sequence[tuple[str, int]], *, index_name: str, unique: bool
    ) -> str:
        """Make sure an index that does the job of ``keys`` exists; return its name.

        An application's equivalent index is reused whatever its name (the server refuses
        a second index on the same keys: codes 85/86). One on the same keys that cannot do
        the job (not unique, partial, sparse...) is refused with a ``ConfigError`` naming
        it. An index named ``index_name`` with other keys or options is an earlier
        version's: it is replaced.
        """
        coll = self.collection(name)
        wanted = [(str(k), int(d)) for k, d in keys]
        for attempt in range(2):
            with driver_errors(f"list indexes of {name}"):
                existing = [dict(info) for info in coll.list_indexes()]
                collation = (
                    self._default_collation(name)
                    if any("collation" in info for info in existing)
                    else None
                )
            ours: str | None = None
            for info in existing:
                if _index_problem(info, wanted, unique, collation) is None:
                    return str(info["name"])
            for info in existing:
                if info.get("name") == index_name:
                    ours = index_name
                elif _key_pattern(info) == wanted:
                    problem = _index_problem(info, wanted, unique, collation)
                    raise ConfigError(
                        f"collection {name!r} has an index {info.get('name')!r} on "
                        f"{_describe_keys(wanted)} that {problem}; the orchestrator needs "
                        f"{'a unique index' if unique else 'an index'} on these keys and "
                        "adds no second index on one key pattern (a server before 5.0 "
                        f"refuses it): {_index_remedy(unique)}"
                    )
            with driver_errors(f"create index {index_name} on {name}"):
                if ours is not None:
                    logger.warning(
                        f"replacing index {ours!r} on {name}: it is an earlier version's",
                        extra={"collection": name, "outcome": "index-replaced"},
                    )
                    coll.drop_index(ours)
                try:
                    options: dict[str, Any] = {"name": index_name}
                    if unique:
                        options["unique"] = True
                    coll.create_index(wanted, **options)
                except DuplicateKeyError as exc:
                    raise ConfigError(
                        f"collection {name!r} holds documents with the same "
                        f"{_describe_keys(wanted)}: the unique index cannot be built until "
                        f"the duplicates are removed ({redact(str(exc))})"
                    ) from exc
                except OperationFailure as exc:
                    if exc.code in INDEX_CONFLICT_CODES and attempt == 0:
                        continue  # another process created an index meanwhile: look again
                    raise
            return index_name
        raise StoreError(f"create index {index_name} on {name}: indexes keep changing")

    def _default_collation(self, name: str) -> Any:
        """The collection's default collation, which indexes created without one inherit."""
        for info in self._db.list_collections(filter={"name": name}):
            return (info.get("options") or {}).get("collation")
        return None

    def find_one(self, name: str, query: Mapping[str, Any]) -> Document | None:
        with driver_errors(f"read from {name}"):
            return self.collection(name).find_one(dict(query))

    # -- operators ----------------------------------------------------------------------

    def collection_names(self) -> list[str]:
        with driver_errors("list collections"):
            names = self._db.list_collection_names()
        return sorted(n for n in names if not n.startswith("system."))

    def phase_summary(self, name: str, now: datetime) -> list[Document]:
        with driver_errors(f"summarise {name}"):
            return list(self.collection(name).aggregate(queries.status_pipeline(now)))

    def latest_errors(self, name: str, limit: int) -> list[Document]:
        with driver_errors(f"read errors of {name}"):
            cursor = self.collection(name).find(queries.errors_filter(), queries.ERRORS_PROJECTION)
            return list(cursor.sort(queries.ERRORS_SORT).limit(limit))

    def operator_update(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document | None:
        """An operator's change to one document; the document after it, or None if absent."""
        with driver_errors(f"update {name}"):
            return self.collection(name).find_one_and_update(
                dict(query), dict(update), return_document=ReturnDocument.AFTER
            )

    def drop(self, name: str) -> None:
        with driver_errors(f"drop {name}"):
            self._db.drop_collection(name)


def _key_pattern(info: Mapping[str, Any]) -> list[tuple[str, Any]]:
    key = info.get("key")
    if isinstance(key, Mapping):
        return list(key.items())
    if isinstance(key, list | tuple):
        return [tuple(pair) for pair in key]
    return []


def _index_problem(
    info: Mapping[str, Any], wanted: list[tuple[str, int]], unique: bool, collation: Any
) -> str | None:
    """Why the existing index ``info`` cannot do the job of ``wanted``; None if it can.

    A unique index enforces the uniqueness of its set of fields whatever their order and
    direction; the claim needs its exact key pattern to serve its filter and sort.
    """
    keys = _key_pattern(info)
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


def _describe_keys(keys: Sequence[tuple[str, int]]) -> str:
    return "(" + ", ".join(k if d == 1 else f"{k} {d}" for k, d in keys) + ")"


def _index_remedy(unique: bool) -> str:
    if unique:
        return (
            "make it unique (collMod with prepareUnique, then unique; MongoDB 6.0+) or drop it,"
            " and the orchestrator creates its own"
        )
    return "drop it, and the orchestrator creates its own"


def connect(uri: str, database: str | None = None, *, timeout: float = 5.0) -> Database[Document]:
    """The database of ``uri`` (or ``database``), checked reachable within ``timeout`` s:
    a command-line tool should fail in seconds with the reason, not hang for thirty."""
    where = redact(uri)
    try:
        client: MongoClient[Document] = MongoClient(
            uri, serverSelectionTimeoutMS=max(int(timeout * 1000), 1), appname="orchestrator"
        )
    except PyMongoError as exc:
        raise StoreError(f"invalid MongoDB URI {where}: {redact(str(exc))}") from exc
    try:
        db = client[database] if database else client.get_default_database("orchestrator")
        db.command("ping")
    except ServerSelectionTimeoutError as exc:
        client.close()
        raise StoreError(
            f"cannot reach MongoDB at {where} within {timeout:g}s", transient=True
        ) from exc
    except PyMongoError as exc:
        client.close()
        raise StoreError(f"MongoDB at {where}: {redact(str(exc))}") from exc
    _check_database_name(db.name)
    return db
