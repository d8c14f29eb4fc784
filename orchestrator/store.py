"""The only module that talks to pymongo: it runs what ``queries`` builds.

Driver errors leave here as ``StoreError`` (with a ``transient`` flag) and fenced writes
that match nothing as ``LeaseLost``, so the layers above never see a driver exception.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from bson.errors import BSONError
from pymongo import MongoClient, ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    DuplicateKeyError,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from pymongo.write_concern import WriteConcern

from orchestrator import queries
from orchestrator.errors import ConfigError, LeaseLost, StoreError
from orchestrator.queries import as_utc
from orchestrator.redact import redact

Document = dict[str, Any]


def is_transient(exc: PyMongoError) -> bool:
    """Network trouble and elections: the same operation may succeed when retried."""
    return isinstance(exc, AutoReconnect | ConnectionFailure) or exc.has_error_label(
        "RetryableWriteError"
    )


@contextmanager
def driver_errors(action: str) -> Iterator[None]:
    try:
        yield
    except PyMongoError as exc:
        raise StoreError(
            f"{action} failed: {redact(str(exc))}", transient=is_transient(exc)
        ) from exc
    except BSONError as exc:  # DocumentTooLarge and unencodable values are not PyMongoErrors
        raise StoreError(f"{action} failed: {redact(str(exc))}") from exc


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
    """Lease reads and writes against one database, with the configured write concern."""

    def __init__(self, db: Database[Document], write_concern: str | int = "majority") -> None:
        _check_database_name(getattr(db, "name", None))
        self._db = db
        self._write_concern = WriteConcern(w=write_concern)
        self._collections: dict[str, Collection[Document]] = {}
        self._unique_done: set[tuple[str, tuple[str, ...]]] = set()
        self._lock = threading.Lock()

    @property
    def database(self) -> Database[Document]:
        return self._db

    def collection(self, name: str) -> Collection[Document]:
        coll = self._collections.get(name)
        if coll is None:
            coll = self._db.get_collection(name).with_options(write_concern=self._write_concern)
            self._collections[name] = coll
        return coll

    # -- time ---------------------------------------------------------------------------

    def server_time(self) -> datetime | None:
        """The server's clock from ``hello`` (no privileges needed), or None if it gives none."""
        with driver_errors("hello"):
            reply = self._db.command("hello")
        local = reply.get("localTime")
        return as_utc(local) if isinstance(local, datetime) else None

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

    def ensure_claim_index(self, name: str) -> None:
        with driver_errors(f"create index on {name}"):
            self.collection(name).create_index(queries.CLAIM_INDEX, name=queries.CLAIM_INDEX_NAME)

    def ensure_unique(self, name: str, keys: Sequence[str]) -> None:
        marker = (name, tuple(keys))
        if marker in self._unique_done:
            return
        with self._lock:
            if marker in self._unique_done:
                return
            with driver_errors(f"create unique index on {name}"):
                self.collection(name).create_index(
                    [(k, 1) for k in keys],
                    unique=True,
                    name="orchestrator_unique_" + "_".join(keys),
                )
            self._unique_done.add(marker)

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
