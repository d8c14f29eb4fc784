"""The in-memory MongoDB behind PyMongo's async API, for async replicas in tests.

Not a second in-memory implementation: every object here is a facade over a proxy of
``memory``, and every operation is that proxy's, run under its one lock when it is
awaited. So the async database answers exactly as ``memory_database`` does (the same
linearizable history, ``hello`` from the same clock, the same server errors), and
``async_view`` lets async and sync replicas share one database in a test.

Which methods are coroutines follows the installed PyMongo's async classes
(``AsyncCollection``, ``AsyncDatabase``, ``AsyncMongoClient``, ``AsyncCursor``,
``AsyncCommandCursor``), so code that runs here awaits what it must await on a server.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Self, cast

from bson.codec_options import CodecOptions
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.command_cursor import AsyncCommandCursor
from pymongo.asynchronous.cursor import AsyncCursor
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.asynchronous.mongo_client import AsyncMongoClient

from orchestrator.core.clock import Clock
from orchestrator.core.settings import DEFAULT_DATABASE
from orchestrator.testing.memory import (
    MemoryClient,
    MemoryCollection,
    MemoryCursor,
    MemoryDatabase,
    Replication,
    memory_database,
)
from orchestrator.testing.memory.cursors import ListCursor

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = ["async_memory_database", "async_view"]


def async_memory_database(
    name: str = DEFAULT_DATABASE,
    *,
    clock: Clock | None = None,
    server_time: bool = True,
    hello: bool = True,
    wire_version: int = 21,
    codec_options: CodecOptions[Any] | None = None,
) -> AsyncDatabase[dict[str, Any]]:
    """A new, empty in-memory database (its own client), typed as PyMongo's async one.

    The options are ``memory_database``'s, and so is its behaviour: linearizable under
    one lock, ``hello`` reporting ``clock``, a MongoDB 7.0 replica set's errors. For a
    test that runs sync replicas too, make a ``memory_database`` and ``async_view`` it.
    """
    return async_view(
        memory_database(
            name,
            clock=clock,
            server_time=server_time,
            hello=hello,
            wire_version=wire_version,
            codec_options=codec_options,
        )
    )


def async_view(db: Database[Any]) -> AsyncDatabase[dict[str, Any]]:
    """The async view of a ``memory_database()``: the same data, lock and clock, so async
    and sync replicas in one test share one database."""
    if not isinstance(db, MemoryDatabase):
        raise TypeError(
            f"async_view takes a database made by memory_database(), not {type(db).__name__}"
        )
    return cast("AsyncDatabase[dict[str, Any]]", AsyncMemoryDatabase(db))


def _coroutines(cls: type) -> frozenset[str]:
    """The public methods of one of PyMongo's async classes that are coroutines."""
    return frozenset(
        name
        for name in dir(cls)
        if not name.startswith("_") and inspect.iscoroutinefunction(getattr(cls, name))
    )


async def _round_trip() -> None:
    """Give the event loop a turn, as sending a request to a server does: other tasks
    run between two operations of one task, so concurrent tasks interleave at each
    database call. The operation itself then runs at once, under the lock."""
    await asyncio.sleep(0)


class _Facade:
    """The async face of one sync proxy (``_sync``).

    Methods that are coroutines in PyMongo's class (``_coroutines``) become coroutine
    functions that run the proxy's method when awaited; other attributes are the
    proxy's, with what they return wrapped in its async facade.
    """

    _coroutines: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, sync: Any) -> None:
        self._sync = sync

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._sync, name)
        if name in self._coroutines:
            return self._coroutine(name, value)
        if callable(value) and not isinstance(value, MemoryCollection):
            return self._synchronous(value)
        return self._adopt(value)

    def _coroutine(self, name: str, method: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        async def operation(*args: Any, **kwargs: Any) -> Any:
            await _round_trip()
            return self._adopt(method(*_unwrap_all(args), **_unwrap_kwargs(kwargs)))

        operation.__name__ = name
        return operation

    def _synchronous(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._adopt(method(*_unwrap_all(args), **_unwrap_kwargs(kwargs)))

        return call

    def _adopt(self, value: Any) -> Any:
        """What a proxy returned, as the async API returns it (the facade itself for a
        method that returns its own object, such as a cursor's ``sort``)."""
        if value is self._sync:
            return self
        for proxied, facade in _FACADES:
            if isinstance(value, proxied):
                return facade(value)
        return value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Facade) and type(other) is type(self):
            return bool(self._sync == other._sync)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._sync)

    def __repr__(self) -> str:
        return f"<async {self._sync!r}>"


def _unwrap(value: Any) -> Any:
    return value._sync if isinstance(value, _Facade) else value


def _unwrap_all(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_unwrap(arg) for arg in args)


def _unwrap_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: _unwrap(value) for key, value in kwargs.items()}


class AsyncMemoryClient(_Facade):
    """Duck-types ``AsyncMongoClient`` over a ``MemoryClient``."""

    _coroutines = _coroutines(AsyncMongoClient)
    _sync: MemoryClient

    def __getitem__(self, name: str) -> AsyncMemoryDatabase:
        return self.get_database(name)

    def get_database(self, name: str | None = None, **options: Any) -> AsyncMemoryDatabase:
        return AsyncMemoryDatabase(self._sync.get_database(name, **options))

    async def close(self) -> None:
        """Nothing to release; the data stays reachable through existing facades."""
        await _round_trip()

    aclose = close


class AsyncMemoryDatabase(_Facade):
    """Duck-types ``AsyncDatabase`` over a ``MemoryDatabase``."""

    _coroutines = _coroutines(AsyncDatabase)
    _sync: MemoryDatabase

    @property
    def name(self) -> str:
        return self._sync.name

    @property
    def client(self) -> AsyncMemoryClient:
        return AsyncMemoryClient(self._sync.client)

    @property
    def clock(self) -> Clock:
        """The server's clock, as reported by ``hello``."""
        return self._sync.clock

    @property
    def replication(self) -> Replication:
        """Whether a majority acknowledges writes; a test can take it away. A write
        without ``wtimeout`` waits for the majority on the event loop's thread: the
        stores always set one."""
        return self._sync.replication

    def __getitem__(self, name: str) -> AsyncMemoryCollection:
        return self.get_collection(name)

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> AsyncMemoryCollection:
        return AsyncMemoryCollection(self._sync.get_collection(name, *args, **kwargs))

    def with_options(self, *args: Any, **kwargs: Any) -> AsyncMemoryDatabase:
        return AsyncMemoryDatabase(self._sync.with_options(*args, **kwargs))

    def __bool__(self) -> NoReturn:
        raise NotImplementedError(
            "Database objects do not implement truth value testing or bool(). "
            "Please compare with None instead: database is not None"
        )


class AsyncMemoryCollection(_Facade):
    """Duck-types ``AsyncCollection`` over a ``MemoryCollection``."""

    _coroutines = _coroutines(AsyncCollection)
    _sync: MemoryCollection

    @property
    def name(self) -> str:
        return self._sync.name

    @property
    def full_name(self) -> str:
        return self._sync.full_name

    @property
    def database(self) -> AsyncMemoryDatabase:
        return AsyncMemoryDatabase(self._sync.database)

    def __getitem__(self, name: str) -> AsyncMemoryCollection:
        return AsyncMemoryCollection(self._sync[name])

    def find(self, *args: Any, **kwargs: Any) -> AsyncMemoryCursor:
        """A cursor; nothing is read until it is iterated (``to_list``, ``async for``)."""
        return AsyncMemoryCursor(self._sync.find(*args, **kwargs))

    def with_options(self, *args: Any, **kwargs: Any) -> AsyncMemoryCollection:
        return AsyncMemoryCollection(self._sync.with_options(*args, **kwargs))

    def __bool__(self) -> NoReturn:
        raise NotImplementedError(
            "Collection objects do not implement truth value testing or bool(). "
            "Please compare with None instead: collection is not None"
        )


class _AsyncIterator(_Facade):
    """An async cursor over a sync one: iterated with ``async for`` or ``await next()``."""

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        await _round_trip()
        try:
            return next(self._sync)
        except StopIteration:
            raise StopAsyncIteration from None

    async def next(self) -> Any:
        return await self.__anext__()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._sync.close()


class AsyncMemoryCursor(_AsyncIterator):
    """Duck-types ``AsyncCursor`` over a ``MemoryCursor``: ``sort``, ``skip``, ``limit``...
    chain before the first read; the documents are read under the lock at once."""

    _coroutines = _coroutines(AsyncCursor)
    _sync: MemoryCursor


class AsyncMemoryCommandCursor(_AsyncIterator):
    """Duck-types ``AsyncCommandCursor`` over results already read (``aggregate``,
    ``list_indexes``, ``list_collections``)."""

    _coroutines = _coroutines(AsyncCommandCursor)
    _sync: ListCursor

    async def try_next(self) -> Any:
        """The next document, or None when there is none."""
        await _round_trip()
        return next(self._sync, None)


_FACADES: tuple[tuple[type, Callable[[Any], _Facade]], ...] = (
    (MemoryCollection, AsyncMemoryCollection),
    (MemoryDatabase, AsyncMemoryDatabase),
    (MemoryClient, AsyncMemoryClient),
    (MemoryCursor, AsyncMemoryCursor),
    (ListCursor, AsyncMemoryCommandCursor),
)
"""Each in-memory object a proxy may return, and the async facade ``_adopt`` wraps it in."""
