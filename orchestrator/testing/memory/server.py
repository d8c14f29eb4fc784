"""The emulated server: what every proxy of one client shares, and how it answers.

One ``Server`` stands for one ``MongoClient``'s server: mongomock's data, the one lock
that makes it linearizable, the server's clock, and the options of ``memory_database``
that make it answer as a given MongoDB would (``hello``, the wire version, the codec
options). Whatever mongomock hands back passes through ``adopt``, so no mongomock object
escapes its lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC
from types import GeneratorType
from typing import Any

from bson.codec_options import CodecOptions
from mongomock import MongoClient as _MongomockClient
from mongomock.collection import Collection as _MongomockCollection
from mongomock.collection import Cursor as _MongomockCursor
from mongomock.command_cursor import CommandCursor as _MongomockCommandCursor
from mongomock.database import Database as _MongomockDatabase
from pymongo.errors import OperationFailure

from orchestrator.core.clock import Clock
from orchestrator.testing.memory.collection import MemoryCollection
from orchestrator.testing.memory.cursors import ListCursor
from orchestrator.testing.memory.database import MemoryClient, MemoryDatabase
from orchestrator.testing.memory.replication import Replication
from orchestrator.testing.memory.sharding import Sharding

__all__ = ["Server"]


@dataclass(frozen=True, eq=False)
class Server:
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
    sharding: Sharding

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
            return ListCursor(list(value))
        return value

    def call(self, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a mongomock method under the lock; proxies passed in are unwrapped."""
        args = tuple(_unwrap(arg) for arg in args)
        kwargs = {key: _unwrap(arg) for key, arg in kwargs.items()}
        with self.lock:
            return method(*args, **kwargs)

    def hello_reply(self, name: str) -> dict[str, Any]:
        """The reply to ``hello`` (or ``isMaster``, by ``name``): a primary of this wire
        version, with the server clock's time unless the server gives none."""
        if name == "hello" and not self.hello:
            message = "no such command: 'hello'"
            raise OperationFailure(
                message,
                59,
                {"ok": 0.0, "errmsg": message, "code": 59, "codeName": "CommandNotFound"},
                self.wire_version,
            )
        reply: dict[str, Any] = {
            "isWritablePrimary": True,
            "ismaster": True,
            "maxWireVersion": self.wire_version,
            "ok": 1.0,
        }
        if self.server_time:
            now = self.clock.now().astimezone(UTC)
            # BSON dates hold milliseconds; pymongo decodes them as naive UTC by default.
            reply["localTime"] = now.replace(
                tzinfo=None, microsecond=now.microsecond // 1000 * 1000
            )
        return reply


def _unwrap(value: Any) -> Any:
    if isinstance(value, MemoryClient | MemoryDatabase | MemoryCollection):
        return value._mongomock
    return value
