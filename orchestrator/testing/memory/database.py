"""The client and database proxies: pymongo's ``MongoClient`` and ``Database``, duck-typed.

Each holds its mongomock object and the ``Server`` it shares with every proxy of its
client. Methods written out here are those where mongomock answers unlike a server
(write concerns and codec options on a database, ``listCollections``, the ``hello`` and
``ping`` commands); any other is mongomock's, ``Locked``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, cast

from bson.codec_options import DEFAULT_CODEC_OPTIONS, CodecOptions
from pymongo.errors import InvalidOperation
from pymongo.write_concern import WriteConcern

from orchestrator.core.clock import Clock
from orchestrator.testing.memory.accelerator import filter_applies
from orchestrator.testing.memory.collection import MemoryCollection
from orchestrator.testing.memory.cursors import ListCursor, decode
from orchestrator.testing.memory.locked import locked_attribute

if TYPE_CHECKING:
    from orchestrator.testing.memory.replication import Replication
    from orchestrator.testing.memory.server import Server
    from orchestrator.testing.memory.sharding import Sharding

__all__ = ["MemoryClient", "MemoryDatabase"]

_HELLO = frozenset({"hello", "isMaster", "ismaster"})


class MemoryClient:
    """A mongomock client whose databases share one lock (duck-types ``MongoClient``)."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._mongomock = server.mongomock

    def __getitem__(self, name: str) -> MemoryDatabase:
        return self.get_database(name)

    def __getattr__(self, name: str) -> Any:
        return locked_attribute(self._server, self._mongomock, name, None)

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
        # mongomock supports few codec options: the proxies apply them (see decode).
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
        server: Server,
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

    @property
    def sharding(self) -> Sharding:
        """The sharded collections of its server, and the writes sent to every shard."""
        return self._server.sharding

    def shard_collection(
        self, name: str, key: str | Sequence[str], *, listed: bool = True
    ) -> MemoryCollection:
        """Answer from now on as a 7.0 mongos with collection ``name`` sharded on ``key``
        (see ``Sharding``); ``listed``: ``config.collections`` names it with its key, as
        a config server does (False: only ``collStats`` says it is sharded)."""
        namespace = f"{self.name}.{name}"
        with self._server.lock:
            fields = self._server.sharding.shard(namespace, key)
            if listed:
                self._server.mongomock["config"]["collections"].replace_one(
                    {"_id": namespace},
                    {"_id": namespace, "key": dict.fromkeys(fields, 1), "unique": False},
                    upsert=True,
                )
        return self.get_collection(name)

    def __getitem__(self, name: str) -> MemoryCollection:
        return self.get_collection(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(
                f"MemoryDatabase has no attribute {name!r}; use database[{name!r}]"
            )
        if not hasattr(type(self._mongomock), name):
            return self.get_collection(name)
        return locked_attribute(self._server, self._mongomock, name, self)

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
    ) -> ListCursor:
        """What ``listCollections`` reports (mongomock has no such method); mongomock
        keeps no collection options, so ``options`` is empty."""
        with self._server.lock:
            names = list(self._mongomock.list_collection_names())
        infos = [
            {"name": name, "type": "collection", "options": {}, "info": {"readOnly": False}}
            for name in sorted(names)
        ]
        return ListCursor([info for info in infos if filter_applies(filter or {}, info)])

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

    def command(  # noqa: PLR0913  PyMongo's Database.command signature
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
            reply = self._server.hello_reply(name)
        elif name == "ping":
            reply = {"ok": 1.0}
        elif name == "collStats":
            target = str(document[name])
            with self._server.lock:
                count = self._mongomock[target].count_documents({})
            reply = self._server.sharding.collstats(f"{self.name}.{target}", count)
        else:
            with self._server.lock:
                reply = cast(dict[str, Any], self._mongomock.command(document))
        return cast(
            dict[str, Any],
            decode(reply, codec_options if codec_options is not None else DEFAULT_CODEC_OPTIONS),
        )

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
