"""An in-memory MongoDB that stays correct when several threads share it.

Bare mongomock is not linearizable: its ``find_one_and_update`` finds a document, then
updates it by ``_id`` in a second step, so two threads can claim the same document. Here
mongomock sits behind proxies that run every operation of one client under a single lock,
and read cursors in full under it, so concurrent "replicas" see a consistent database.

Where mongomock is laxer than a server in ways the library must handle, the proxies
answer as a MongoDB 7.0 replica set does (see ``memory_database``): codec options,
conflicting indexes (codes 85 and 86), the 16 MiB document limit (code 17419), write
concerns that no majority acknowledges (code 64), and servers without ``hello`` (code 59).

This module is the entry: ``memory_database`` and its options. The pieces, one concept
each: ``server`` (what the proxies of one client share, and ``hello``), ``replication``
(write concerns), ``locked`` (mongomock's methods under the lock), ``database`` and
``collection`` (the proxies), ``cursors`` (results read under the lock, decoded),
``indexes`` (index builds a server refuses), ``server_rules`` (TTL expiry by the server's
clock, the document size limit) and ``accelerator`` (faster paths for the library's
queries).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

from bson.codec_options import DEFAULT_CODEC_OPTIONS, CodecOptions
from mongomock import MongoClient as _MongomockClient

from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.settings import DEFAULT_DATABASE
from orchestrator.testing.memory.collection import MemoryCollection
from orchestrator.testing.memory.cursors import MemoryCursor
from orchestrator.testing.memory.database import MemoryClient, MemoryDatabase
from orchestrator.testing.memory.locked import DOCUMENT_WRITES, INDEX_WRITES
from orchestrator.testing.memory.replication import Replication
from orchestrator.testing.memory.server import Server
from orchestrator.testing.memory.server_rules import MAX_BSON_SIZE
from orchestrator.testing.memory.sharding import Sharding

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = [
    "DOCUMENT_WRITES",
    "INDEX_WRITES",
    "MAX_BSON_SIZE",
    "MemoryClient",
    "MemoryCollection",
    "MemoryCursor",
    "MemoryDatabase",
    "Replication",
    "Sharding",
    "memory_database",
]


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
    - ``db.shard_collection(name, key)`` makes it answer as a 7.0 mongos with ``name``
      sharded on ``key``: writes naming no shard key are refused as a cluster refuses them
      (see ``Sharding``, ``db.sharding``).
    """
    _check_options(name, clock, server_time, hello, wire_version)
    if codec_options is not None and not isinstance(codec_options, CodecOptions):
        raise TypeError("codec_options must be a bson.codec_options.CodecOptions")
    server = Server(
        mongomock=_MongomockClient(),
        lock=threading.RLock(),
        clock=clock if clock is not None else SystemClock(),
        server_time=server_time,
        hello=hello,
        wire_version=wire_version,
        codec_options=codec_options if codec_options is not None else DEFAULT_CODEC_OPTIONS,
        replication=Replication(),
        sharding=Sharding(),
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
