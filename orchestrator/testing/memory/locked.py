"""mongomock's methods, run under the client's lock and answering as a server would.

Bare mongomock is not linearizable: its ``find_one_and_update`` finds a document, then
updates it by ``_id`` in a second step, so two threads can claim the same document. Every
mongomock method a proxy hands out is wrapped in ``Locked``: the call and the wrapping of
its result (lazy results read in full) happen under the one lock; then a collection's
write waits for its write concern, and documents returned are decoded with the
collection's codec options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mongomock.collection import Collection as _MongomockCollection

from orchestrator.testing.memory.cursors import decode
from orchestrator.testing.memory.server_rules import (
    OversizedDocument,
    refuse_push_onto_non_arrays,
    slice_projection,
)

if TYPE_CHECKING:
    from orchestrator.testing.memory.collection import MemoryCollection
    from orchestrator.testing.memory.database import MemoryDatabase
    from orchestrator.testing.memory.server import Server

__all__ = ["DOCUMENT_WRITES", "INDEX_WRITES", "Locked", "locked_attribute"]

DOCUMENT_WRITES = frozenset(
    {
        "insert_one",
        "insert_many",
        "update_one",
        "update_many",
        "replace_one",
        "delete_one",
        "delete_many",
        "find_one_and_update",
        "find_one_and_replace",
        "find_one_and_delete",
        "bulk_write",
    }
)
"""Collection methods that change documents (and nothing else)."""
INDEX_WRITES = frozenset({"create_index", "create_indexes", "drop_index", "drop_indexes"})
_WRITES = DOCUMENT_WRITES | INDEX_WRITES
"""Collection methods that write, and so wait for their write concern."""

_RETURNS_DOCUMENTS = frozenset(
    {
        "find_one",
        "find_one_and_update",
        "find_one_and_replace",
        "find_one_and_delete",
        "aggregate",
        "distinct",
    }
)
"""Collection methods whose results the client decodes with its codec options."""


class Locked:
    """A mongomock method that runs under the client's lock and wraps what it returns.

    For a collection's method, ``collection`` is its proxy: documents returned are decoded
    with its codec options, and a write then waits for its write concern.
    """

    def __init__(
        self,
        server: Server,
        method: Any,
        database: MemoryDatabase | None,
        collection: MemoryCollection | None = None,
    ) -> None:
        self._server = server
        self._method = method
        self._database = database
        self._collection = collection

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self._method, "__name__", "")
        try:
            cut = None
            with self._server.lock:
                if self._collection is not None:
                    sharding = self._server.sharding
                    if sharding.active:
                        sharding.check_access(self._collection.database.name)
                        sharding.check_write(self._collection.full_name, name, args, kwargs)
                    owner = getattr(self._method, "__self__", None)
                    refuse_push_onto_non_arrays(owner, name, args, kwargs)
                    if name in _RETURNS_DOCUMENTS:
                        kwargs = dict(kwargs)
                        cut = slice_projection(kwargs)
                result = self._server.call(self._method, args, kwargs)
                if cut is not None:
                    result = cut(result)
                result = self._server.adopt(result, self._database)
        except OversizedDocument as exc:
            raise exc.as_raised_for(name) from None
        collection = self._collection
        if collection is None:
            return result
        if name in _WRITES:
            self._server.replication.acknowledge(collection.write_concern)
        if name in _RETURNS_DOCUMENTS:
            return decode(result, collection.codec_options)
        return result

    def __repr__(self) -> str:
        return f"<locked {self._method!r}>"


def locked_attribute(
    server: Server,
    target: Any,
    name: str,
    db: MemoryDatabase | None,
    collection: MemoryCollection | None = None,
) -> Any:
    """A proxy's public attribute, read from mongomock's ``target`` under the lock:
    methods come back ``Locked``, other values adopted by the server."""
    if name.startswith("_"):
        raise AttributeError(name)
    with server.lock:
        value = getattr(target, name)
        if callable(value) and not isinstance(value, _MongomockCollection):
            return Locked(server, value, db, collection)
        return server.adopt(value, db)
