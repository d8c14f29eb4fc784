"""The collection proxy: pymongo's ``Collection``, duck-typed over a mongomock collection.

Methods written out here are those where mongomock answers unlike a server: ``find``
(whose cursor must be read under the lock), ``create_index`` (which a server may refuse,
and whose TTL expires by the server's clock), ``distinct`` (of any values) and the
options a collection carries. Any
other method is mongomock's, ``Locked``. The mongomock collection itself gets the
server's document size limit and the faster query paths when a proxy first reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn, cast

import bson
from bson.codec_options import CodecOptions
from pymongo.write_concern import WriteConcern

from orchestrator.core import sharding
from orchestrator.testing.memory.accelerator import accelerate
from orchestrator.testing.memory.cursors import MemoryCursor
from orchestrator.testing.memory.indexes import (
    check_hint,
    index_conflict,
    index_spec,
    model_options,
)
from orchestrator.testing.memory.locked import locked_attribute
from orchestrator.testing.memory.server_rules import (
    every_type_name,
    expire_by_server_clock,
    limit_document_size,
    missing_through_scalars,
    union_with,
)

if TYPE_CHECKING:
    from orchestrator.testing.memory.database import MemoryDatabase
    from orchestrator.testing.memory.server import Server

__all__ = ["MemoryCollection"]


class MemoryCollection:
    """A mongomock collection whose every call runs under its client's lock.

    Duck-types pymongo's ``Collection``; methods not written out here are mongomock's,
    called under the lock, with cursors and generators read in full before it is released.
    """

    def __init__(
        self,
        server: Server,
        collection: Any,
        database: MemoryDatabase,
        codec_options: CodecOptions[Any] | None = None,
    ) -> None:
        self._server = server
        self._mongomock = collection
        self._database = database
        self._codec_options = codec_options if codec_options is not None else database.codec_options
        with server.lock:
            accelerate(collection)
            limit_document_size(collection)
            missing_through_scalars()
            every_type_name()
            union_with()

    @property
    def name(self) -> str:
        return cast(str, self._mongomock.name)

    @property
    def full_name(self) -> str:
        return f"{self._database.name}.{self.name}"

    @property
    def database(self) -> MemoryDatabase:
        return self._database

    @property
    def write_concern(self) -> WriteConcern:
        concern = self._mongomock.write_concern
        if isinstance(concern, WriteConcern):
            return concern
        # mongomock's default is its own class; give pymongo's, as a real collection does.
        return WriteConcern(**concern.document)

    @property
    def codec_options(self) -> CodecOptions[Any]:
        return self._codec_options

    def __getitem__(self, name: str) -> MemoryCollection:
        return self._database.get_collection(f"{self.name}.{name}", self._codec_options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(
                f"MemoryCollection has no attribute {name!r}; "
                f"use database[{self.name + '.' + name!r}]"
            )
        if not hasattr(type(self._mongomock), name):
            return self[name]
        return locked_attribute(self._server, self._mongomock, name, self._database, self)

    def find(self, *args: Any, **kwargs: Any) -> MemoryCursor:
        """A cursor read in full, under the lock, when it is first iterated."""
        with self._server.lock:
            if self._server.sharding.active:
                self._server.sharding.check_access(self._database.name)
            # Building a mongomock cursor validates the arguments; it reads no document.
            cursor = self._mongomock.find(*args, **kwargs)
        return MemoryCursor(self._server, cursor, self._codec_options)

    def distinct(self, key: str, filter: Any = None, **options: Any) -> list[Any]:
        """As the server answers: each value once (an array's elements each), however it is
        made; mongomock hashes the values, and fails on a list or a document holding one."""
        found: dict[bytes, Any] = {}
        for doc in self.find(filter or {}, **options):
            value: Any = doc
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value is None and not sharding.has(doc, key):
                continue
            for item in value if isinstance(value, list) else [value]:
                found.setdefault(bson.encode({"v": item}), item)
        return list(found.values())

    def count_documents(self, filter: Any, **options: Any) -> int:
        """As pymongo's, with a hint checked as the server checks it (``check_hint``)."""
        hint = options.pop("hint", None)
        with self._server.lock:
            if self._server.sharding.active:
                self._server.sharding.check_access(self._database.name)
            check_hint(hint, list(self._mongomock.list_indexes()))
            return int(self._server.call(self._mongomock.count_documents, (filter,), options))

    def create_index(self, keys: Any, **options: Any) -> str:
        """As the server does, refuse an index whose name or key pattern clashes with an
        existing index; an identical one is a no-op."""
        spec = index_spec(keys, options)
        with self._server.lock:
            existing = list(self._mongomock.list_indexes())
            if index_conflict(spec, existing, self._server.wire_version):
                name = cast(str, spec["name"])
            else:
                name = self._server.call(self._mongomock.create_index, (keys,), options)
            if spec.get("expireAfterSeconds") is not None:
                expire_by_server_clock(self._mongomock._store, self._server.clock)
        self._server.replication.acknowledge(self.write_concern)
        return name

    def create_indexes(self, indexes: Any, **kwargs: Any) -> list[str]:
        return [
            self.create_index(model.document["key"], **model_options(model)) for model in indexes
        ]

    def with_options(
        self,
        codec_options: CodecOptions[Any] | None = None,
        read_preference: Any = None,
        write_concern: WriteConcern | None = None,
        read_concern: Any = None,
    ) -> MemoryCollection:
        with self._server.lock:
            collection = self._mongomock.with_options(
                read_preference=read_preference,
                write_concern=write_concern,
                read_concern=read_concern,
            )
        if codec_options is None:
            codec_options = self._codec_options
        return MemoryCollection(self._server, collection, self._database, codec_options)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MemoryCollection):
            return self._database == other._database and self.name == other.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._database, self.name))

    def __bool__(self) -> NoReturn:
        raise NotImplementedError(
            "Collection objects do not implement truth value testing or bool(). "
            "Please compare with None instead: collection is not None"
        )

    def __iter__(self) -> NoReturn:
        raise TypeError("'MemoryCollection' object is not iterable")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            f"'Collection' object is not callable. If you meant to call the {self.name!r} "
            "method on a 'Collection' object it is failing because no such method exists."
        )

    def __repr__(self) -> str:
        return f"<memory collection {self.full_name!r}>"
