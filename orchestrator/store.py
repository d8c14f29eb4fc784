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

from pymongo import ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    DuplicateKeyError,
    PyMongoError,
)
from pymongo.write_concern import WriteConcern

from orchestrator import queries
from orchestrator.errors import LeaseLost, StoreError
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


class Store:
    """Lease reads and writes against one database, with the configured write concern."""

    def __init__(self, db: Database[Document], write_concern: str | int = "majority") -> None:
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
        now: datetime,
        lock_timeout: float,
        token: str,
        replica: str,
    ) -> Document | None:
        """One atomic find-and-modify: the oldest expired lease matching ``match``, or None."""
        with driver_errors(f"claim on {name}"):
            return self.collection(name).find_one_and_update(
                queries.claim_filter(match, now, lock_timeout),
                queries.claim_update(now, token, replica),
                sort=queries.CLAIM_SORT,
                return_document=ReturnDocument.AFTER,
            )

    def write(
        self, name: str, doc_id: Any, token: str, update: Mapping[str, Any], action: str
    ) -> None:
        """A write under a lease; ``LeaseLost`` when the lease is no longer this token's."""
        with driver_errors(f"{action} on {name}/{doc_id}"):
            result = self.collection(name).update_one(queries.fenced(doc_id, token), update)
        if result.matched_count == 0:
            raise LeaseLost(name, doc_id, token, action)

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
