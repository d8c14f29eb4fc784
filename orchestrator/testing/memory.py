"""An in-memory MongoDB that stays correct when several threads share it.

Bare mongomock is not linearizable: its ``find_one_and_update`` finds a document, then
updates it by ``_id`` in a second step, so two threads can claim the same document. Here
mongomock sits behind proxies that run every operation of one client under a single lock,
and read cursors in full under it, so concurrent "replicas" see a consistent database.

Where mongomock is laxer than a server in ways the library must handle, the proxies
answer as a MongoDB 7.0 replica set does (see ``memory_database``): codec options,
conflicting indexes (codes 85 and 86), the 16 MiB document limit (code 17419), write
concerns that no majority acknowledges (code 64), and servers without ``hello`` (code 59).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import GeneratorType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self, cast

import bson
from bson import ObjectId
from bson.codec_options import DEFAULT_CODEC_OPTIONS, CodecOptions
from mongomock import MongoClient as _MongomockClient
from mongomock.collection import Collection as _MongomockCollection
from mongomock.collection import Cursor as _MongomockCursor
from mongomock.command_cursor import CommandCursor as _MongomockCommandCursor
from mongomock.database import Database as _MongomockDatabase
from mongomock.filtering import filter_applies as _untyped_filter_applies
from mongomock.helpers import patch_datetime_awareness_in_document as _untyped_patch
from pymongo.errors import (
    DocumentTooLarge,
    DuplicateKeyError,
    InvalidOperation,
    OperationFailure,
    WriteError,
    WTimeoutError,
)
from pymongo.write_concern import WriteConcern

from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.settings import DEFAULT_DATABASE

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = ["MAX_BSON_SIZE", "Replication", "memory_database"]

_HELLO = frozenset({"hello", "isMaster", "ismaster"})

MAX_BSON_SIZE = 16 * 1024 * 1024
"""The largest document a server stores (``BSONObjMaxUserSize``)."""

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


def memory_database(
    name: str = DEFAULT_DATABASE,
    *,
    clock: Clock | None = None,
    server_time: bool = True,
    hello: bool = True,
    wire_version: int = 21,
    codec_options: CodecOptions[Any] | None = None,
) -> Database[dict[str, Any]]:
    """A new, empty, thread-safe in-memory database (its own client), typed as pymongo's.

    ``clock`` is the server's clock: ``command("hello")`` reports its time as ``localTime``
    (naive UTC, to the millisecond, as pymongo returns it). With ``server_time=False`` the
    reply has no ``localTime``, like servers that give none. The proxy's ``clock``
    attribute is that clock; ``_mongomock`` is the underlying mongomock object.

    Like a MongoDB 7.0 replica set, and unlike bare mongomock:

    - ``codec_options`` are the client's (``MongoClient(tz_aware=True)``,
      ``datetime_conversion=DATETIME_MS``, a ``document_class``...): documents read through
      a collection are decoded with the collection's codec options, as pymongo decodes a
      server's reply; commands with ``DEFAULT_CODEC_OPTIONS`` unless given others.
    - ``hello=False`` answers ``hello`` with CommandNotFound (code 59), as servers before
      4.4.2 do, and only ``isMaster`` works; ``wire_version`` is the ``maxWireVersion``
      that ``hello`` reports (21: MongoDB 7.0; 9: 4.4; 8: 4.2).
    - ``create_index`` refuses an index whose name or key pattern clashes with an existing
      one: IndexOptionsConflict (85) or IndexKeySpecsConflict (86), by the rules of the
      ``wire_version`` (from 5.0, uniqueness, sparseness and the partial filter tell two
      indexes on one key pattern apart; before, only the collation did).
    - An update whose result exceeds 16 MiB changes nothing and fails with code 17419 (a
      ``WriteError`` from ``update_one``, an ``OperationFailure`` from
      ``find_one_and_update``); an insert that large raises pymongo's ``DocumentTooLarge``.
    - Writes wait for their write concern: see ``Replication`` (``db.replication``).
    """
    _check_options(name, clock, server_time, hello, wire_version)
    if codec_options is not None and not isinstance(codec_options, CodecOptions):
        raise TypeError("codec_options must be a bson.codec_options.CodecOptions")
    server = _Server(
        mongomock=_MongomockClient(),
        lock=threading.RLock(),
        clock=clock if clock is not None else SystemClock(),
        server_time=server_time,
        hello=hello,
        wire_version=wire_version,
        codec_options=codec_options if codec_options is not None else DEFAULT_CODEC_OPTIONS,
        replication=Replication(),
    )
    return cast("Database[dict[str, Any]]", MemoryClient(server)[name])


def _check_options(
    name: object, clock: object, server_time: object, hello: object, wire_version: object
) -> None:
    """The kit's options, checked where they are given: a wrong one otherwise surfaces
    deep in a replica's first command (a bool() of a database, in ``hello``)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a database name, not {type(name).__name__}")
    if clock is not None and not (
        callable(getattr(clock, "now", None)) and callable(getattr(clock, "monotonic", None))
    ):
        raise TypeError(
            f"clock must be a Clock (now() and monotonic(), e.g. FakeClock), not "
            f"{type(clock).__name__}"
        )
    for option, value in (("server_time", server_time), ("hello", hello)):
        if not isinstance(value, bool):
            raise TypeError(f"{option} must be True or False, not {type(value).__name__}")
    if not isinstance(wire_version, int) or isinstance(wire_version, bool):
        raise TypeError(f"wire_version must be an int, not {type(wire_version).__name__}")
    if not 0 <= wire_version <= 100:
        raise ValueError(f"wire_version must be a maxWireVersion (0 to 100), not {wire_version}")


class Replication:
    """Whether a majority of the replica set acknowledges writes (by default it does).

    While it does not (``lose_majority()``), a write whose write concern asks for more than
    the primary (``w="majority"``, ``w>1``, or no ``w``: the 5.0+ implicit default is
    majority) is applied, then waits, as on a server: with a ``wtimeout`` it fails with
    ``WTimeoutError`` (code 64, ``errInfo.wtimeout``) at once, the wait elided; without one
    it blocks until ``restore_majority()``. ``stalled`` counts writes blocked now and
    ``timed_out`` those failed so far; ``wait_until`` lets a test wait for either.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._majority = True
        self.stalled = 0
        self.timed_out = 0

    def lose_majority(self) -> None:
        with self._changed:
            self._majority = False
            self._changed.notify_all()

    def restore_majority(self) -> None:
        with self._changed:
            self._majority = True
            self._changed.notify_all()

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Block until ``ready()``, re-checked whenever a write stalls, times out or resumes."""
        with self._changed:
            self._changed.wait_for(ready)

    def acknowledge(self, concern: WriteConcern) -> None:
        """Called after a write applied: return when its write concern is satisfied."""
        document = concern.document
        w = document.get("w", "majority")
        if w in (0, 1):
            return
        with self._changed:
            if self._majority:
                return
            wtimeout = document.get("wtimeout")
            if not wtimeout:
                self.stalled += 1
                self._changed.notify_all()
                try:
                    self._changed.wait_for(lambda: self._majority)
                finally:
                    self.stalled -= 1
                    self._changed.notify_all()
                return
            self.timed_out += 1
            self._changed.notify_all()
        message = "waiting for replication timed out"
        error = {
            "code": 64,
            "codeName": "WriteConcernFailed",
            "errmsg": message,
            "errInfo": {
                "wtimeout": True,
                "writeConcern": {"w": w, "wtimeout": wtimeout, "provenance": "clientSupplied"},
            },
        }
        raise WTimeoutError(message, 64, error)


@dataclass(frozen=True, eq=False)
class _Server:
    """What every proxy of one client shares: the data, the lock, the clock and how the
    emulated server answers (see ``memory_database``)."""

    mongomock: Any
    lock: threading.RLock
    clock: Clock
    server_time: bool
    hello: bool
    wire_version: int
    codec_options: CodecOptions[Any]
    replication: Replication

    def adopt(self, value: Any, database: MemoryDatabase | None = None) -> Any:
        """Wrap what mongomock returned; the caller holds the lock.

        Lazy results (cursors, generators) are read in full now, under the lock.
        """
        if isinstance(value, _MongomockCollection):
            if database is None or database._mongomock.name != value.database.name:
                database = MemoryDatabase(self, value.database)
            return MemoryCollection(self, value, database)
        if isinstance(value, _MongomockDatabase):
            return MemoryDatabase(self, value)
        if isinstance(value, _MongomockClient):
            return MemoryClient(self)
        if isinstance(value, _MongomockCursor | _MongomockCommandCursor | GeneratorType):
            return _ListCursor(list(value))
        return value

    def call(self, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a mongomock method under the lock; proxies passed in are unwrapped."""
        args = tuple(_unwrap(arg) for arg in args)
        kwargs = {key: _unwrap(arg) for key, arg in kwargs.items()}
        with self.lock:
            return method(*args, **kwargs)


def _unwrap(value: Any) -> Any:
    if isinstance(value, MemoryClient | MemoryDatabase | MemoryCollection):
        return value._mongomock
    return value


def _decode(value: Any, codec: CodecOptions[Any]) -> Any:
    """``value`` as a client with ``codec`` reads it: encoded to BSON and decoded again,
    as pymongo decodes a server's reply (mongomock hands back naive dicts whatever the
    options). Nothing to do with the default options."""
    if codec == DEFAULT_CODEC_OPTIONS or value is None:
        return value
    if isinstance(value, _ListCursor):
        return _ListCursor([_decode(doc, codec) for doc in value._documents])
    if isinstance(value, list):
        return [_decode(item, codec) for item in value]
    if isinstance(value, Mapping):
        return bson.decode(bson.encode(value), codec_options=codec)
    return bson.decode(bson.encode({"v": value}), codec_options=codec)["v"]


class _DocumentTooLarge(DuplicateKeyError):
    """Raised inside mongomock when a write would store more than 16 MiB. A
    ``DuplicateKeyError``, so mongomock rolls the write back as it does for a unique index;
    the proxy then raises what the server (or pymongo) raises instead."""

    def __init__(self, size: int) -> None:
        super().__init__(f"document of {size} bytes", 17419)
        self.size = size

    def as_raised_for(self, operation: str) -> Exception:
        if operation.startswith("insert"):
            # pymongo refuses it before sending it, with this message.
            return DocumentTooLarge(
                f"BSON document too large ({self.size} bytes) - the connected server "
                f"supports BSON document sizes up to {MAX_BSON_SIZE} bytes."
            )
        message = f"Resulting document after update is larger than {MAX_BSON_SIZE}"
        if operation.startswith("find_one_and"):
            message = f"Plan executor error during findAndModify :: caused by :: {message}"
            details = {"ok": 0.0, "errmsg": message, "code": 17419, "codeName": "Location17419"}
            return OperationFailure(message, 17419, details)
        return WriteError(message, 17419, {"index": 0, "code": 17419, "errmsg": message})


class _Locked:
    """A mongomock method that runs under the client's lock and wraps what it returns.

    For a collection's method, ``collection`` is its proxy: documents returned are decoded
    with its codec options, and a write then waits for its write concern.
    """

    def __init__(
        self,
        server: _Server,
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
            with self._server.lock:
                result = self._server.call(self._method, args, kwargs)
                result = self._server.adopt(result, self._database)
        except _DocumentTooLarge as exc:
            raise exc.as_raised_for(name) from None
        collection = self._collection
        if collection is None:
            return result
        if name in _WRITES:
            self._server.replication.acknowledge(collection.write_concern)
        if name in _RETURNS_DOCUMENTS:
            return _decode(result, collection.codec_options)
        return result

    def __repr__(self) -> str:
        return f"<locked {self._method!r}>"


def _locked_attribute(
    server: _Server,
    target: Any,
    name: str,
    db: MemoryDatabase | None,
    collection: MemoryCollection | None = None,
) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    with server.lock:
        value = getattr(target, name)
        if callable(value) and not isinstance(value, _MongomockCollection):
            return _Locked(server, value, db, collection)
        return server.adopt(value, db)


class MemoryClient:
    """A mongomock client whose databases share one lock (duck-types ``MongoClient``)."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._mongomock = server.mongomock

    def __getitem__(self, name: str) -> MemoryDatabase:
        return self.get_database(name)

    def __getattr__(self, name: str) -> Any:
        return _locked_attribute(self._server, self._mongomock, name, None)

    @property
    def codec_options(self) -> CodecOptions[Any]:
        return self._server.codec_options

    def get_database(
        self,
        name: str | None = None,
        codec_options: CodecOptions[Any] | None = None,
        write_concern: WriteConcern | None = None,
        **options: Any,
    ) -> MemoryDatabase:
        # mongomock supports few codec options: the proxies apply them (see _decode).
        with self._server.lock:
            database = self._mongomock.get_database(name, **options)
        return MemoryDatabase(self._server, database, write_concern, codec_options)

    def close(self) -> None:
        """Nothing to release; the data stays reachable through existing proxies."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MemoryClient):
            return self._server is other._server
        return NotImplemented

    def __hash__(self) -> int:
        return id(self._server)

    def __repr__(self) -> str:
        return f"<memory client {id(self._server):#x}>"


class MemoryDatabase:
    """A mongomock database behind its client's lock (duck-types pymongo's ``Database``)."""

    def __init__(
        self,
        server: _Server,
        database: Any,
        write_concern: WriteConcern | None = None,
        codec_options: CodecOptions[Any] | None = None,
    ) -> None:
        self._server = server
        self._mongomock = database
        self._write_concern = write_concern
        self._codec_options = codec_options if codec_options is not None else server.codec_options

    @property
    def name(self) -> str:
        return cast(str, self._mongomock.name)

    @property
    def client(self) -> MemoryClient:
        return MemoryClient(self._server)

    @property
    def clock(self) -> Clock:
        """The server's clock, as reported by ``hello``."""
        return self._server.clock

    @property
    def write_concern(self) -> WriteConcern:
        # mongomock's Database has no such property (its __getattr__ would give a collection).
        return self._write_concern if self._write_concern is not None else WriteConcern()

    @property
    def codec_options(self) -> CodecOptions[Any]:
        return self._codec_options

    @property
    def replication(self) -> Replication:
        """Whether a majority acknowledges writes; a test can take it away."""
        return self._server.replication

    def __getitem__(self, name: str) -> MemoryCollection:
        return self.get_collection(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(
                f"MemoryDatabase has no attribute {name!r}; use database[{name!r}]"
            )
        if not hasattr(type(self._mongomock), name):
            return self.get_collection(name)
        return _locked_attribute(self._server, self._mongomock, name, self)

    def get_collection(
        self,
        name: str,
        codec_options: CodecOptions[Any] | None = None,
        read_preference: Any = None,
        write_concern: WriteConcern | None = None,
        read_concern: Any = None,
    ) -> MemoryCollection:
        with self._server.lock:
            collection = self._mongomock.get_collection(
                name,
                read_preference=read_preference,
                write_concern=self._write_concern if write_concern is None else write_concern,
                read_concern=read_concern,
            )
        return MemoryCollection(self._server, collection, self, codec_options)

    def create_collection(self, name: str, **options: Any) -> MemoryCollection:
        codec_options = options.pop("codec_options", None)
        with self._server.lock:
            collection = self._mongomock.create_collection(name, **options)
        return MemoryCollection(self._server, collection, self, codec_options)

    def list_collection_names(
        self, filter: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> list[str]:
        with self._server.lock:
            return list(self._mongomock.list_collection_names(filter, **kwargs))

    def list_collections(
        self, filter: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> _ListCursor:
        """What ``listCollections`` reports (mongomock has no such method); mongomock
        keeps no collection options, so ``options`` is empty."""
        with self._server.lock:
            names = list(self._mongomock.list_collection_names())
        infos = [
            {"name": name, "type": "collection", "options": {}, "info": {"readOnly": False}}
            for name in sorted(names)
        ]
        return _ListCursor([info for info in infos if filter_applies(filter or {}, info)])

    def drop_collection(self, name_or_collection: str | MemoryCollection) -> None:
        self._server.call(self._mongomock.drop_collection, (name_or_collection,), {})

    def with_options(
        self,
        codec_options: CodecOptions[Any] | None = None,
        read_preference: Any = None,
        write_concern: WriteConcern | None = None,
        read_concern: Any = None,
    ) -> MemoryDatabase:
        # mongomock refuses a write concern here; the proxy keeps it for its collections,
        # and the codec options, which mongomock mostly does not support.
        with self._server.lock:
            database = self._mongomock.with_options(
                read_preference=read_preference,
                read_concern=read_concern,
            )
        if write_concern is None:
            write_concern = self._write_concern
        if codec_options is None:
            codec_options = self._codec_options
        return MemoryDatabase(self._server, database, write_concern, codec_options)

    def command(
        self,
        command: str | Mapping[str, Any],
        value: Any = 1,
        *,
        check: bool = True,
        allowable_errors: Any = None,
        read_preference: Any = None,
        codec_options: Any = None,
        session: Any = None,
        comment: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``hello`` (``isMaster``) and ``ping`` answer like a server; others go to mongomock.

        The reply is decoded with ``codec_options``, or pymongo's defaults (not the
        database's: pymongo's ``Database.command`` does the same). The other keyword
        options of pymongo's ``Database.command`` are accepted and ignored; other keyword
        arguments are fields of the command, as with pymongo.
        """
        if isinstance(command, str):
            document: dict[str, Any] = {command: value, **kwargs}
        else:
            document = {**command, **kwargs}
        if not document:
            raise InvalidOperation("empty command")
        name = next(iter(document))
        if name in _HELLO:
            reply = self._hello(name)
        elif name == "ping":
            reply = {"ok": 1.0}
        else:
            with self._server.lock:
                reply = cast(dict[str, Any], self._mongomock.command(document))
        return cast(
            dict[str, Any],
            _decode(reply, codec_options if codec_options is not None else DEFAULT_CODEC_OPTIONS),
        )

    def _hello(self, name: str) -> dict[str, Any]:
        if name == "hello" and not self._server.hello:
            message = "no such command: 'hello'"
            raise OperationFailure(
                message,
                59,
                {"ok": 0.0, "errmsg": message, "code": 59, "codeName": "CommandNotFound"},
                self._server.wire_version,
            )
        reply: dict[str, Any] = {
            "isWritablePrimary": True,
            "ismaster": True,
            "maxWireVersion": self._server.wire_version,
            "ok": 1.0,
        }
        if self._server.server_time:
            now = self._server.clock.now().astimezone(UTC)
            # BSON dates hold milliseconds; pymongo decodes them as naive UTC by default.
            reply["localTime"] = now.replace(
                tzinfo=None, microsecond=now.microsecond // 1000 * 1000
            )
        return reply

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MemoryDatabase):
            return self._server is other._server and self.name == other.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash((id(self._server), self.name))

    def __bool__(self) -> NoReturn:
        raise NotImplementedError(
            "Database objects do not implement truth value testing or bool(). "
            "Please compare with None instead: database is not None"
        )

    def __iter__(self) -> NoReturn:
        raise TypeError("'MemoryDatabase' object is not iterable")

    def __repr__(self) -> str:
        return f"<memory database {self.name!r}>"


class MemoryCollection:
    """A mongomock collection whose every call runs under its client's lock.

    Duck-types pymongo's ``Collection``; methods not written out here are mongomock's,
    called under the lock, with cursors and generators read in full before it is released.
    """

    def __init__(
        self,
        server: _Server,
        collection: Any,
        database: MemoryDatabase,
        codec_options: CodecOptions[Any] | None = None,
    ) -> None:
        self._server = server
        self._mongomock = collection
        self._database = database
        self._codec_options = codec_options if codec_options is not None else database.codec_options
        with server.lock:
            _accelerate(collection)
            _limit_document_size(collection)

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
        return _locked_attribute(self._server, self._mongomock, name, self._database, self)

    def find(self, *args: Any, **kwargs: Any) -> MemoryCursor:
        """A cursor read in full, under the lock, when it is first iterated."""
        with self._server.lock:
            # Building a mongomock cursor validates the arguments; it reads no document.
            cursor = self._mongomock.find(*args, **kwargs)
        return MemoryCursor(self._server, cursor, self._codec_options)

    def create_index(self, keys: Any, **options: Any) -> str:
        """As the server does, refuse an index whose name or key pattern clashes with an
        existing index; an identical one is a no-op."""
        spec = _index_spec(keys, options)
        with self._server.lock:
            existing = list(self._mongomock.list_indexes())
            if _index_conflict(spec, existing, self._server.wire_version):
                name = cast(str, spec["name"])
            else:
                name = self._server.call(self._mongomock.create_index, (keys,), options)
            if spec.get("expireAfterSeconds") is not None:
                _expire_by_server_clock(self._mongomock._store, self._server.clock)
        self._server.replication.acknowledge(self.write_concern)
        return name

    def create_indexes(self, indexes: Any, **kwargs: Any) -> list[str]:
        return [
            self.create_index(model.document["key"], **_model_options(model)) for model in indexes
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


class _ListCursor:
    """Results already read: iterable once, like a pymongo cursor."""

    def __init__(self, documents: list[Any]) -> None:
        self._documents = documents
        self._position = 0

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Any:
        if self._position >= len(self._documents):
            raise StopIteration
        document = self._documents[self._position]
        self._position += 1
        return document

    next = __next__

    def to_list(self, length: int | None = None) -> list[Any]:
        end = len(self._documents) if length is None else self._position + length
        taken = self._documents[self._position : end]
        self._position += len(taken)
        return taken

    @property
    def alive(self) -> bool:
        return self._position < len(self._documents)

    def batch_size(self, batch_size: int) -> Self:
        return self

    def close(self) -> None:
        self._position = len(self._documents)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class MemoryCursor:
    """A ``find`` cursor: options are recorded, documents are read under the lock at once.

    ``sort``, ``skip``, ``limit`` (and ``batch_size``, ``hint``, ``max_time_ms``,
    ``allow_disk_use``) chain before the first read, as with pymongo; afterwards they raise
    ``InvalidOperation``. ``rewind()`` makes the next read run the query again.
    """

    def __init__(
        self, server: _Server, cursor: Any, codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS
    ) -> None:
        self._server = server
        self._mongomock = cursor
        self._codec_options = codec_options
        self._results: _ListCursor | None = None

    def _option(self, name: str, *args: Any) -> Self:
        if self._results is not None:
            raise InvalidOperation("cannot set options after executing query")
        with self._server.lock:
            getattr(self._mongomock, name)(*args)
        return self

    def sort(self, key_or_list: Any, direction: Any = None) -> Self:
        return self._option("sort", key_or_list, direction)

    def skip(self, skip: int) -> Self:
        if not isinstance(skip, int):
            raise TypeError("skip must be an integer")
        if skip < 0:
            raise ValueError("skip must be >= 0")
        return self._option("skip", skip)

    def limit(self, limit: int) -> Self:
        if not isinstance(limit, int):
            raise TypeError("limit must be an integer")
        return self._option("limit", limit)

    def batch_size(self, batch_size: int) -> Self:
        return self._option("batch_size", batch_size)

    def hint(self, index: Any) -> Self:
        return self._option("hint", index)

    def max_time_ms(self, max_time_ms: int | None) -> Self:
        return self._option("max_time_ms", max_time_ms)

    def allow_disk_use(self, allow_disk_use: bool) -> Self:
        return self._option("allow_disk_use", allow_disk_use)

    def _read(self) -> _ListCursor:
        if self._results is None:
            with self._server.lock:
                documents = list(self._mongomock)
            self._results = _ListCursor(_decode(documents, self._codec_options))
        return self._results

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> dict[str, Any]:
        return cast(dict[str, Any], next(self._read()))

    next = __next__

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not isinstance(index, int) or index < 0:
            raise IndexError("only non-negative integer indices are supported")
        documents = self._read()._documents
        if index >= len(documents):
            raise IndexError("no such item for Cursor instance")
        return cast(dict[str, Any], documents[index])

    def to_list(self, length: int | None = None) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._read().to_list(length))

    def rewind(self) -> Self:
        with self._server.lock:
            self._mongomock.rewind()
        self._results = None
        return self

    def clone(self) -> MemoryCursor:
        with self._server.lock:
            return MemoryCursor(self._server, self._mongomock.clone(), self._codec_options)

    def distinct(self, key: str) -> list[Any]:
        with self._server.lock:
            values = list(self._mongomock.clone().distinct(key))
        return cast(list[Any], _decode(values, self._codec_options))

    @property
    def alive(self) -> bool:
        return self._results is None or self._results.alive

    def close(self) -> None:
        if self._results is None:
            self._results = _ListCursor([])
        self._results.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "unread" if self._results is None else "read"
        return f"<memory cursor ({state})>"


# -- what a server refuses and mongomock does not -------------------------------------------

_IDENTIFYING = ("key", "unique", "sparse", "partialFilterExpression", "collation")
"""What tells two indexes apart on MongoDB 5.0+ (the index "signature")."""
_IDENTIFYING_BEFORE_5 = ("key", "collation")
"""Before 5.0 (wire version 13), two indexes on one key pattern could not differ in
uniqueness, sparseness or partial filter."""
_NOT_COMPARED = frozenset({"name", "v", "ns", "background"})


def _index_spec(keys: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The index pymongo's ``create_index(keys, **options)`` asks the server for."""
    if isinstance(keys, str):
        pairs = [(keys, 1)]
    elif isinstance(keys, Mapping):
        pairs = list(keys.items())
    else:
        pairs = [(item, 1) if isinstance(item, str) else tuple(item) for item in keys]
    spec = {k: v for k, v in options.items() if k not in ("session", "comment")}
    spec["key"] = dict(pairs)
    spec.setdefault("name", "_".join(f"{field}_{direction}" for field, direction in pairs))
    return spec


def _model_options(model: Any) -> dict[str, Any]:
    return {k: v for k, v in model.document.items() if k != "key"}


def _options(index: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of an index spec, with the defaults a server leaves out made explicit."""
    options = {k: v for k, v in index.items() if k not in _NOT_COMPARED}
    options["key"] = list(dict(index["key"]).items())
    for flag in ("unique", "sparse"):
        options[flag] = bool(options.get(flag, False))
    return options


def _index_conflict(
    spec: Mapping[str, Any], existing: list[Mapping[str, Any]], wire_version: int
) -> bool:
    """True when an identical index exists (nothing to build); raise the server's error
    when ``spec`` clashes with an index by name (86, or 85) or by signature (85)."""
    identifying = _IDENTIFYING if wire_version >= 13 else _IDENTIFYING_BEFORE_5

    def _signature(index: Mapping[str, Any]) -> tuple[Any, ...]:
        options = _options(index)
        return tuple(options.get(k) for k in identifying)

    def _other_options(index: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in _options(index).items() if k not in identifying}

    def fail(code: int, message: str) -> NoReturn:
        name = {85: "IndexOptionsConflict", 86: "IndexKeySpecsConflict"}[code]
        raise OperationFailure(
            message, code, {"ok": 0.0, "errmsg": message, "code": code, "codeName": name}
        )

    wanted = _signature(spec)
    for index in existing:
        if index.get("name") != spec["name"]:
            continue
        if _signature(index) != wanted:
            fail(
                86,
                "An existing index has the same name as the requested index. "
                f"Requested index: {dict(spec)}, existing index: {dict(index)}",
            )
        if _other_options(index) != _other_options(spec):
            fail(
                85,
                "An equivalent index already exists with the same name but different "
                f"options. Requested index: {dict(spec)}, existing index: {dict(index)}",
            )
        return True
    for index in existing:
        if _signature(index) != wanted:
            continue
        if _other_options(index) != _other_options(spec):
            fail(
                85,
                "An equivalent index already exists with a different name and options. "
                f"Requested index: {dict(spec)}, existing index: {dict(index)}",
            )
        fail(85, f"Index already exists with a different name: {index['name']}")
    return False


TTL_MONITOR_PERIOD = 60
"""Seconds between two passes of a server's TTL monitor (``ttlMonitorSleepSecs``)."""


def _expire_by_server_clock(store: Any, clock: Clock) -> None:
    """Make one mongomock collection's TTL indexes expire documents as a server does
    (once).

    mongomock deletes a TTL index's expired documents at every read, by the machine's wall
    clock; a server's TTL monitor deletes them by the server's clock, once a minute. Here
    they go by the database's clock (a test's ``FakeClock``), at its last whole minute: an
    expired document may outlive its expiry by up to a minute, as on a server, so a reader
    that must not see it has to judge the expiry itself.
    """
    if "_expire_documents" in vars(store):
        return

    def expire_documents(index: Mapping[str, Any]) -> None:
        try:
            expiry = int(index["expireAfterSeconds"])
        except (TypeError, ValueError):
            return
        keys = list(index["key"])
        if len(keys) != 1:
            return  # as on a server: a compound index expires nothing
        field = keys[0][0]
        now = clock.now().timestamp()
        monitor_pass = datetime.fromtimestamp(now - now % TTL_MONITOR_PERIOD, UTC)
        passed = monitor_pass.replace(tzinfo=None)  # mongomock stores naive UTC
        with store._rwlock.reader():
            expired = [
                doc["_id"]
                for doc in store._documents.values()
                if store._value_meets_expiry(doc.get(field), expiry, passed)
            ]
        for doc_id in expired:
            del store[doc_id]

    store._expire_documents = expire_documents


def _limit_document_size(collection: Any) -> None:
    """Make one mongomock collection refuse to store a document over 16 MiB (once).

    mongomock calls ``_ensure_uniques`` on every document it has just inserted or updated
    in place, and rolls the write back when it raises ``DuplicateKeyError``: the check
    rides on that, so a refused write changes nothing, as on the server.
    """
    if "_ensure_uniques" in vars(collection):
        return
    ensure_uniques = collection._ensure_uniques

    def checked(document: Mapping[str, Any]) -> None:
        size = len(bson.encode(document))
        if size > MAX_BSON_SIZE:
            raise _DocumentTooLarge(size)
        ensure_uniques(document)

    collection._ensure_uniques = checked


# -- faster paths for the queries the library sends ----------------------------------------
#
# mongomock judges every document with a general interpreter (~20 us each), and a sorted
# find copies and sorts every match; a claim on 2,000 documents took ~50 ms, which swamped
# what the benchmarks measure. These paths decide the common shapes natively and hand
# every document or query they cannot judge exactly back to mongomock, so the results are
# mongomock's, only sooner. They run under the client's lock like everything else.

filter_applies = cast(Callable[[Any, Any], bool], _untyped_filter_applies)
_naive_utc: Callable[[Any], Any] = _untyped_patch
_Verdict = bool | None  # None: not decided here; mongomock judges the document
_Test = Callable[[Mapping[str, Any]], _Verdict]
_MISSING = object()
_RANGES: dict[str, Callable[[Any, Any], bool]] = {
    "$lt": operator.lt,
    "$lte": operator.le,
    "$gt": operator.gt,
    "$gte": operator.ge,
}


def _accelerate(collection: Any) -> None:
    """Give one mongomock collection object the faster paths (once)."""
    if "_iter_documents" in vars(collection):
        return
    store = collection._store
    general_find_one = collection.find_one

    def iter_documents(spec: Any) -> Any:
        if store.is_empty:
            filter_applies(spec, {})  # mongomock validates the filter even then
            return iter(())
        key = spec.get("_id", None) if isinstance(spec, Mapping) else None
        if type(key) in (str, ObjectId):  # _id is unique: one lookup, not a scan
            candidates = [store[key]] if key in store else []
        else:
            candidates = list(store.documents)
        test = _compile(spec)
        if test is None:
            return (doc for doc in candidates if filter_applies(spec, doc))
        return (doc for doc in candidates if _judge(test, spec, doc))

    def find_one(filter: Any = None, *args: Any, **kwargs: Any) -> Any:
        sort = kwargs.get("sort")
        if (
            args
            or not sort
            or not isinstance(filter, Mapping)
            or set(kwargs)
            - {
                "sort",
                "projection",
            }
        ):
            return general_find_one(filter, *args, **kwargs)
        # As mongomock's cursor does: dates in the filter become naive UTC milliseconds.
        spec = _naive_utc(filter)
        first = _first_sorted(list(iter_documents(spec)), sort)
        if first is _MISSING:
            return general_find_one(filter, *args, **kwargs)
        if first is None:
            return None
        return general_find_one({"_id": first["_id"]}, projection=kwargs.get("projection"))

    collection._iter_documents = iter_documents
    collection.find_one = find_one


def _judge(test: _Test, spec: Any, doc: Mapping[str, Any]) -> bool:
    verdict = test(doc)
    return bool(filter_applies(spec, doc)) if verdict is None else verdict


def _compile(spec: Any) -> _Test | None:
    """A native test for filters made of string equalities and ``$ne``, date ranges, ``$not``
    of a date range, ``$or`` and ``$and`` on top-level fields (a claim's shape); None
    otherwise."""
    if not isinstance(spec, Mapping) or not spec:
        return None
    tests: list[_Test] = []
    for key, value in spec.items():
        if key in ("$or", "$and"):
            if not isinstance(value, list) or not value:
                return None
            parts = [_compile(part) for part in value]
            if any(part is None for part in parts):
                return None
            tests.append(_either(parts) if key == "$or" else _both(parts))  # type: ignore[arg-type]
            continue
        if not isinstance(key, str) or not key or key.startswith("$") or "." in key:
            return None
        if type(value) is str:
            tests.append(_equals(key, value))
            continue
        if not isinstance(value, Mapping) or len(value) != 1:
            return None
        ((op, operand),) = value.items()
        if op == "$ne" and type(operand) is str:
            tests.append(_differs(key, operand))
            continue
        negate = op == "$not"
        if negate:
            if not isinstance(operand, Mapping) or len(operand) != 1:
                return None
            ((op, operand),) = operand.items()
        compare = _RANGES.get(op)
        if compare is None or type(operand) is not datetime:
            return None
        tests.append(_range(key, compare, operand, negate))
    return _both(tests)


def _equals(key: str, wanted: str) -> _Test:
    def test(doc: Mapping[str, Any]) -> _Verdict:
        value = doc.get(key, _MISSING)
        if type(value) is str:
            return value == wanted
        return False if value is _MISSING else None

    return test


def _differs(key: str, unwanted: str) -> _Test:
    def test(doc: Mapping[str, Any]) -> _Verdict:
        value = doc.get(key, _MISSING)
        if value is _MISSING or type(value) is str:
            return value != unwanted
        return None  # arrays and other types: mongomock's rules

    return test


def _range(key: str, compare: Callable[[Any, Any], bool], bound: datetime, negate: bool) -> _Test:
    naive = bound.tzinfo is None

    def test(doc: Mapping[str, Any]) -> _Verdict:
        value = doc.get(key, _MISSING)
        if type(value) is not datetime or (value.tzinfo is None) != naive:
            return None  # missing, arrays, other types: mongomock's rules
        return compare(value, bound) != negate

    return test


def _both(tests: list[_Test]) -> _Test:
    def test(doc: Mapping[str, Any]) -> _Verdict:
        verdict: _Verdict = True
        for part in tests:
            outcome = part(doc)
            if outcome is False:
                return False
            if outcome is None:
                verdict = None
        return verdict

    return test


def _either(tests: list[_Test]) -> _Test:
    def test(doc: Mapping[str, Any]) -> _Verdict:
        verdict: _Verdict = False
        for part in tests:
            outcome = part(doc)
            if outcome is True:
                return True
            if outcome is None:
                verdict = None
        return verdict

    return test


def _first_sorted(docs: list[Mapping[str, Any]], sort: Any) -> Any:
    """The first of ``docs`` in ``sort`` order (stable, as mongomock sorts), None when there
    are none, ``_MISSING`` when a sort key is not a date of one kind in every document."""
    if not docs:
        return None
    if not isinstance(sort, list | tuple):
        return _MISSING
    ordered = docs
    for item in reversed(sort):
        if not isinstance(item, list | tuple) or len(item) != 2:
            return _MISSING
        key, direction = item
        if not isinstance(key, str) or key.startswith("$") or "." in key:
            return _MISSING
        if direction not in (1, -1):
            return _MISSING
        values = [doc.get(key, _MISSING) for doc in ordered]
        if any(type(v) is not datetime for v in values):
            return _MISSING
        if len({v.tzinfo is None for v in values}) != 1:
            return _MISSING
        ranked = sorted(range(len(ordered)), key=values.__getitem__, reverse=direction < 0)
        ordered = [ordered[i] for i in ranked]
    return ordered[0]
