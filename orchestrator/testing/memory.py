"""An in-memory MongoDB that stays correct when several threads share it.

Bare mongomock is not linearizable: its ``find_one_and_update`` finds a document, then
updates it by ``_id`` in a second step, so two threads can claim the same document. Here
mongomock sits behind proxies that run every operation of one client under a single lock,
and read cursors in full under it, so concurrent "replicas" see a consistent database.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import GeneratorType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self, cast

from bson import ObjectId
from mongomock import MongoClient as _MongomockClient
from mongomock.collection import Collection as _MongomockCollection
from mongomock.collection import Cursor as _MongomockCursor
from mongomock.command_cursor import CommandCursor as _MongomockCommandCursor
from mongomock.database import Database as _MongomockDatabase
from mongomock.filtering import filter_applies as _untyped_filter_applies
from mongomock.helpers import patch_datetime_awareness_in_document as _untyped_patch
from pymongo.errors import InvalidOperation
from pymongo.write_concern import WriteConcern

from orchestrator.clock import Clock, SystemClock

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = ["memory_database"]

_HELLO = frozenset({"hello", "isMaster", "ismaster"})


def memory_database(
    name: str = "orchestrator",
    *,
    clock: Clock | None = None,
    server_time: bool = True,
) -> Database[dict[str, Any]]:
    """A new, empty, thread-safe in-memory database (its own client), typed as pymongo's.

    ``clock`` is the server's clock: ``command("hello")`` reports its time as ``localTime``
    (naive UTC, to the millisecond, as pymongo returns it). With ``server_time=False`` the
    reply has no ``localTime``, like servers that give none. The proxy's ``clock``
    attribute is that clock; ``_mongomock`` is the underlying mongomock object.
    """
    server = _Server(
        mongomock=_MongomockClient(),
        lock=threading.RLock(),
        clock=clock if clock is not None else SystemClock(),
        server_time=server_time,
    )
    return cast("Database[dict[str, Any]]", MemoryClient(server)[name])


@dataclass(frozen=True, eq=False)
class _Server:
    """What every proxy of one client shares: the data, the lock and the clock."""

    mongomock: Any
    lock: threading.RLock
    clock: Clock
    server_time: bool

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


class _Locked:
    """A mongomock method that runs under the client's lock and wraps what it returns."""

    def __init__(self, server: _Server, method: Any, database: MemoryDatabase | None) -> None:
        self._server = server
        self._method = method
        self._database = database

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._server.lock:
            result = self._server.call(self._method, args, kwargs)
            return self._server.adopt(result, self._database)

    def __repr__(self) -> str:
        return f"<locked {self._method!r}>"


def _locked_attribute(server: _Server, target: Any, name: str, db: MemoryDatabase | None) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    with server.lock:
        value = getattr(target, name)
        if callable(value) and not isinstance(value, _MongomockCollection):
            return _Locked(server, value, db)
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

    def get_database(self, name: str | None = None, **options: Any) -> MemoryDatabase:
        with self._server.lock:
            database = self._mongomock.get_database(name, **options)
        return MemoryDatabase(self._server, database)

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
    ) -> None:
        self._server = server
        self._mongomock = database
        self._write_concern = write_concern

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
        codec_options: Any = None,
        read_preference: Any = None,
        write_concern: WriteConcern | None = None,
        read_concern: Any = None,
    ) -> MemoryCollection:
        with self._server.lock:
            collection = self._mongomock.get_collection(
                name,
                codec_options=codec_options,
                read_preference=read_preference,
                write_concern=self._write_concern if write_concern is None else write_concern,
                read_concern=read_concern,
            )
        return MemoryCollection(self._server, collection, self)

    def create_collection(self, name: str, **options: Any) -> MemoryCollection:
        with self._server.lock:
            collection = self._mongomock.create_collection(name, **options)
        return MemoryCollection(self._server, collection, self)

    def list_collection_names(
        self, filter: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> list[str]:
        with self._server.lock:
            return list(self._mongomock.list_collection_names(filter, **kwargs))

    def drop_collection(self, name_or_collection: str | MemoryCollection) -> None:
        self._server.call(self._mongomock.drop_collection, (name_or_collection,), {})

    def with_options(
        self,
        codec_options: Any = None,
        read_preference: Any = None,
        write_concern: WriteConcern | None = None,
        read_concern: Any = None,
    ) -> MemoryDatabase:
        # mongomock refuses a write concern here; the proxy keeps it for its collections.
        with self._server.lock:
            database = self._mongomock.with_options(
                codec_options=codec_options,
                read_preference=read_preference,
                read_concern=read_concern,
            )
        if write_concern is None:
            write_concern = self._write_concern
        return MemoryDatabase(self._server, database, write_concern)

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

        The keyword options of pymongo's ``Database.command`` are accepted and ignored;
        other keyword arguments are fields of the command, as with pymongo.
        """
        if isinstance(command, str):
            document: dict[str, Any] = {command: value, **kwargs}
        else:
            document = {**command, **kwargs}
        if not document:
            raise InvalidOperation("empty command")
        name = next(iter(document))
        if name in _HELLO:
            return self._hello()
        if name == "ping":
            return {"ok": 1.0}
        with self._server.lock:
            return cast(dict[str, Any], self._mongomock.command(document))

    def _hello(self) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "isWritablePrimary": True,
            "ismaster": True,
            "maxWireVersion": 21,
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

    def __init__(self, server: _Server, collection: Any, database: MemoryDatabase) -> None:
        self._server = server
        self._mongomock = collection
        self._database = database
        with server.lock:
            _accelerate(collection)

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

    def __getitem__(self, name: str) -> MemoryCollection:
        return self._database[f"{self.name}.{name}"]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(
                f"MemoryCollection has no attribute {name!r}; "
                f"use database[{self.name + '.' + name!r}]"
            )
        if not hasattr(type(self._mongomock), name):
            return self[name]
        return _locked_attribute(self._server, self._mongomock, name, self._database)

    def find(self, *args: Any, **kwargs: Any) -> MemoryCursor:
        """A cursor read in full, under the lock, when it is first iterated."""
        with self._server.lock:
            # Building a mongomock cursor validates the arguments; it reads no document.
            cursor = self._mongomock.find(*args, **kwargs)
        return MemoryCursor(self._server, cursor)

    def with_options(
        self,
        codec_options: Any = None,
        read_preference: Any = None,
        write_concern: WriteConcern | None = None,
        read_concern: Any = None,
    ) -> MemoryCollection:
        with self._server.lock:
            collection = self._mongomock.with_options(
                codec_options=codec_options,
                read_preference=read_preference,
                write_concern=write_concern,
                read_concern=read_concern,
            )
        return MemoryCollection(self._server, collection, self._database)

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

    def __init__(self, server: _Server, cursor: Any) -> None:
        self._server = server
        self._mongomock = cursor
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
                self._results = _ListCursor(list(self._mongomock))
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
            return MemoryCursor(self._server, self._mongomock.clone())

    def distinct(self, key: str) -> list[Any]:
        with self._server.lock:
            return list(self._mongomock.clone().distinct(key))

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
