"""Sharded collections, as a mongos of MongoDB 7.0 answers for them.

``db.shard_collection("jobs", ("tenant",))`` makes the in-memory server stand for a mongos
in front of two shards, with ``jobs`` sharded on ``tenant``: its documents stay where they
are (one store), but every write is judged as a mongos judges it before it runs, so a
test sees the refusals a real cluster gives:

- a ``findAndModify`` (``find_one_and_update``/``_replace``/``_delete``) whose filter has no
  equality on the whole shard key: ShardKeyNotFound (61), as up to 7.0 (7.1 on Atlas and
  8.0 run it as a two-phase write across every shard instead);
- a single ``delete_one`` naming neither the shard key nor an exact ``_id``: 61; a single
  ``update_one``/``replace_one`` likewise: InvalidOptions (72), unless a replacement names
  the whole shard key; an upsert must name the shard key (61);
- a single write that names an exact ``_id`` but not the shard key runs on every shard, as
  on a server: it is allowed and recorded in ``broadcasts``, so a test can tell a write
  that targets one shard from one that reaches all of them.

``config.collections`` lists the collection with its key (as a mongos's config server
does), unless ``listed=False``; ``config_readable = False`` makes reading the ``config``
database fail with Unauthorized (13), as it does for a user with ``readWrite`` on its own
database only; ``collStats`` then says ``sharded``, as a mongos does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo.errors import OperationFailure, WriteError

__all__ = ["Sharding"]

SHARD_KEY_NOT_FOUND = 61
INVALID_OPTIONS = 72
UNAUTHORIZED = 13
SHARDS = 2
"""The shards a write that targets none is sent to (what its refusal counts)."""

_FIND_AND_MODIFY = frozenset({"find_one_and_update", "find_one_and_replace", "find_one_and_delete"})
_SINGLE_UPDATES = frozenset({"update_one", "replace_one"})


class Sharding:
    """Which collections of one emulated server are sharded, on what, and what the mongos
    in front of them did (one per ``memory_database`` client, under its lock)."""

    def __init__(self) -> None:
        self._keys: dict[str, tuple[str, ...]] = {}
        self.config_readable = True
        """False: reading the ``config`` database fails with Unauthorized (13)."""
        self.broadcasts: list[tuple[str, str]] = []
        """(namespace, operation) of each single write sent to every shard by its ``_id``."""

    @property
    def mongos(self) -> bool:
        """Whether the server stands for a mongos: once any collection is sharded."""
        return bool(self._keys)

    @property
    def active(self) -> bool:
        """Whether any call may be judged here (else the proxies skip it: their hot path)."""
        return bool(self._keys) or not self.config_readable

    def shard(self, namespace: str, key: Sequence[str]) -> tuple[str, ...]:
        fields = (key,) if isinstance(key, str) else tuple(key)
        if not fields or not all(isinstance(f, str) and f for f in fields):
            raise ValueError(f"a shard key is one or more field names, not {key!r}")
        self._keys[namespace] = fields
        return fields

    def key_of(self, namespace: str) -> tuple[str, ...] | None:
        return self._keys.get(namespace)

    def check_access(self, database: str) -> None:
        """Refuse a read or write of the ``config`` database when it is not readable."""
        if database == "config" and not self.config_readable:
            message = 'not authorized on config to execute command { find: "collections" }'
            raise OperationFailure(
                message,
                UNAUTHORIZED,
                {"ok": 0.0, "errmsg": message, "code": UNAUTHORIZED, "codeName": "Unauthorized"},
            )

    def collstats(self, namespace: str, count: int) -> dict[str, Any]:
        """``collStats``'s reply: a mongos adds ``sharded``."""
        reply: dict[str, Any] = {"ns": namespace, "count": count, "ok": 1.0}
        if self.mongos:
            reply["sharded"] = namespace in self._keys
        return reply

    def check_write(
        self, namespace: str, operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Refuse ``operation`` on ``namespace`` as a 7.0 mongos would, before it runs; note
        it in ``broadcasts`` when it would reach every shard."""
        key = self._keys.get(namespace)
        if key is None:
            return
        if operation not in _FIND_AND_MODIFY | _SINGLE_UPDATES | {"delete_one"}:
            return  # inserts carry their shard key (or null); multi writes may broadcast
        query = args[0] if args else kwargs.get("filter")
        equal = _equalities(query)
        if all(name in equal for name in key):
            return
        pattern = "{ " + ", ".join(f"{name}: 1" for name in key) + " }"
        if operation in _FIND_AND_MODIFY:
            message = "Query for sharded findAndModify must contain the shard key"
            raise OperationFailure(
                message,
                SHARD_KEY_NOT_FOUND,
                {
                    "ok": 0.0,
                    "errmsg": message,
                    "code": SHARD_KEY_NOT_FOUND,
                    "codeName": "ShardKeyNotFound",
                },
            )
        upsert = kwargs.get("upsert") or (len(args) > 2 and args[2] is True)
        if upsert:
            message = "Failed to target upsert by query :: could not extract exact shard key"
            raise _write_error(message, SHARD_KEY_NOT_FOUND)
        if "_id" in equal:
            self.broadcasts.append((namespace, operation))
            return
        if operation == "replace_one":
            replacement = args[1] if len(args) > 1 else kwargs.get("replacement")
            if isinstance(replacement, Mapping) and all(name in replacement for name in key):
                return  # targeted by the replacement's shard key
        if operation == "delete_one":
            message = (
                "A single delete on a sharded collection must contain an exact match on _id"
                " (and have the collection default collation) or contain the shard key (and"
                f" have the simple collation). Delete request: {{ q: {query!r}, limit: 1 }},"
                f" shard key pattern: {pattern}"
            )
            raise _write_error(message, SHARD_KEY_NOT_FOUND)
        message = (
            "A {multi:false} update on a sharded collection must contain an exact match on _id"
            " (and have the collection default collation) or target a single shard (and have"
            f" the simple collation), but this update targeted {SHARDS} shards. Update"
            f" request: {{ q: {query!r}, multi: false }}, shard key pattern: {pattern}"
        )
        raise _write_error(message, INVALID_OPTIONS)


def _write_error(message: str, code: int) -> WriteError:
    """A write command's error, as pymongo raises it for a single write."""
    return WriteError(message, code, {"index": 0, "code": code, "errmsg": message})


def _equalities(query: Any) -> dict[str, Any]:
    """The fields a filter pins by equality (a value, or ``$eq``), at its top level or in a
    top-level ``$and``: what a mongos extracts a shard key or an exact ``_id`` from."""
    found: dict[str, Any] = {}
    if not isinstance(query, Mapping):
        return found
    for name, value in query.items():
        if name == "$and" and isinstance(value, list):
            for part in value:
                for inner, pinned in _equalities(part).items():
                    found.setdefault(inner, pinned)
            continue
        if not isinstance(name, str) or name.startswith("$"):
            continue
        if isinstance(value, Mapping) and value and all(str(op).startswith("$") for op in value):
            if set(value) == {"$eq"}:
                found[name] = value["$eq"]
            continue
        if not isinstance(value, re.Pattern | list):
            found[name] = value
    return found
