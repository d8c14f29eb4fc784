"""What a read hands back: results read in full under the lock, decoded as a client would.

A mongomock cursor reads documents lazily, so iterating it after the lock is released
would race with writers. ``MemoryCursor`` records a ``find``'s options and reads every
document at once, under the lock, on first use; ``ListCursor`` holds results already read.
``decode`` gives documents as pymongo decodes a server's reply with the client's codec
options, which mongomock ignores.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, cast

import bson
from bson.codec_options import DEFAULT_CODEC_OPTIONS, CodecOptions
from pymongo.errors import InvalidOperation

from orchestrator.testing.memory.indexes import check_hint

if TYPE_CHECKING:
    from orchestrator.testing.memory.server import Server

__all__ = ["ListCursor", "MemoryCursor", "decode"]


def decode(value: Any, codec: CodecOptions[Any]) -> Any:
    """``value`` as a client with ``codec`` reads it: encoded to BSON and decoded again,
    as pymongo decodes a server's reply (mongomock hands back naive dicts whatever the
    options). Nothing to do with the default options."""
    if codec == DEFAULT_CODEC_OPTIONS or value is None:
        return value
    if isinstance(value, ListCursor):
        return ListCursor([decode(doc, codec) for doc in value._documents])
    if isinstance(value, list):
        return [decode(item, codec) for item in value]
    if isinstance(value, Mapping):
        return bson.decode(bson.encode(value), codec_options=codec)
    return bson.decode(bson.encode({"v": value}), codec_options=codec)["v"]


class ListCursor:
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
        self, server: Server, cursor: Any, codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS
    ) -> None:
        self._server = server
        self._mongomock = cursor
        self._codec_options = codec_options
        self._results: ListCursor | None = None

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
        with self._server.lock:
            check_hint(index, list(self._mongomock.collection.list_indexes()))
        return self._option("hint", index)

    def max_time_ms(self, max_time_ms: int | None) -> Self:
        return self._option("max_time_ms", max_time_ms)

    def allow_disk_use(self, allow_disk_use: bool) -> Self:
        return self._option("allow_disk_use", allow_disk_use)

    def _read(self) -> ListCursor:
        if self._results is None:
            with self._server.lock:
                documents = list(self._mongomock)
            self._results = ListCursor(decode(documents, self._codec_options))
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
        return cast(list[Any], decode(values, self._codec_options))

    @property
    def alive(self) -> bool:
        return self._results is None or self._results.alive

    def close(self) -> None:
        if self._results is None:
            self._results = ListCursor([])
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
