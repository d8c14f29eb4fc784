"""What a server does to stored documents that mongomock does differently or not at all.

(A dotted path through a value that is no document reads as missing on a server, as
``missing_through_scalars`` makes it in mongomock's filtering; ``every_type_name`` teaches
its ``$type`` the names it leaves unimplemented; ``union_with`` adds the ``$unionWith``
stage mongomock's aggregation lacks.)

Two rules are grafted onto each mongomock collection the proxies reach: a TTL index
expires documents by the server's clock, once a minute, as a server's TTL monitor does
(mongomock uses the machine's wall clock, at every read); and a write that would store a
document over 16 MiB is refused and changes nothing (mongomock stores it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import bson
from bson import MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.code import Code
from mongomock import aggregate as mongomock_aggregate
from mongomock import filtering
from pymongo.errors import DocumentTooLarge, DuplicateKeyError, OperationFailure, WriteError

from orchestrator.core.clock import Clock
from orchestrator.core.replicas import TTL_MONITOR_PERIOD
from orchestrator.testing.memory.accelerator import accelerate

__all__ = [
    "MAX_BSON_SIZE",
    "TTL_MONITOR_PERIOD",
    "OversizedDocument",
    "every_type_name",
    "expire_by_server_clock",
    "limit_document_size",
    "missing_through_scalars",
    "refuse_push_onto_non_arrays",
    "slice_projection",
    "union_with",
]

MAX_BSON_SIZE = 16 * 1024 * 1024
"""The largest document a server stores (``BSONObjMaxUserSize``)."""


class OversizedDocument(DuplicateKeyError):
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


def expire_by_server_clock(store: Any, clock: Clock) -> None:
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
        monitor_pass = datetime.fromtimestamp(now - now % int(TTL_MONITOR_PERIOD), UTC)
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


def limit_document_size(collection: Any) -> None:
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
            raise OversizedDocument(size)
        ensure_uniques(document)

    collection._ensure_uniques = checked


_PUSHING = frozenset({"update_one", "update_many", "find_one_and_update"})
_applies = cast(Callable[[Any, Any], bool], filtering.filter_applies)
_ABSENT = object()


def refuse_push_onto_non_arrays(collection: Any, name: str, args: Any, kwargs: Any) -> None:
    """Refuse, before anything changes, a ``$push`` onto a field that holds something other
    than an array in a document the write would change, as a server does (WriteError 2);
    mongomock raises a TypeError halfway through the update instead."""
    if name not in _PUSHING:
        return
    query = args[0] if args else kwargs.get("filter")
    update = args[1] if len(args) > 1 else kwargs.get("update")
    if not isinstance(update, Mapping) or not isinstance(update.get("$push"), Mapping):
        return
    fields = list(update["$push"])
    doc_id = query.get("_id") if isinstance(query, Mapping) else None
    store = collection._store
    if type(doc_id) in (str, ObjectId):
        # A write to one document by its id (as the accelerator reads one): alone.
        stored = store[doc_id] if doc_id in store else None  # noqa: SIM401 (a store has no get)
        docs: Any = [stored] if stored is not None and _applies(query, stored) else []
    else:
        docs = collection.find(query, limit=0 if name == "update_many" else 1)
        if name != "update_many" and kwargs.get("sort"):
            docs = docs.sort(kwargs["sort"])
    for doc in docs:
        for path in fields:
            value: Any = doc
            for part in path.split("."):
                value = value.get(part, _ABSENT) if isinstance(value, Mapping) else _ABSENT
            if value is not _ABSENT and not isinstance(value, list):
                raise WriteError(
                    f"The field '{path}' must be an array but is of type "
                    f"{type(value).__name__} in document {{_id: {doc.get('_id')!r}}}",
                    2,
                )


def missing_through_scalars() -> None:
    """Make a dotted path through a value that is no document (``lastError.at`` of a
    ``lastError`` that is a string, or null) read as missing, so ``{"lastError.at": null}``
    matches it, as on a server; mongomock finds no value at all there, so such a document
    matched nothing (once, for the process: mongomock's filtering is module-wide)."""
    if getattr(filtering.iter_key_candidates, "_server_rules", False):
        return
    original: Any = filtering.iter_key_candidates
    nothing: Any = vars(filtering)["NOTHING"]

    def candidates(key: str, doc: Any) -> Any:
        if key and not isinstance(doc, dict | list):
            return [nothing]
        return original(key, doc)

    candidates._server_rules = True  # type: ignore[attr-defined]
    filtering.iter_key_candidates = candidates


def every_type_name() -> None:
    """Make ``$type`` answer every BSON type name as a server does: mongomock raises
    NotImplementedError for minKey, timestamp, regex, javascript, maxKey... (a keyset
    page's condition names every type after its last value's), and counts a ``Code`` as a
    string. Symbol, dbPointer and undefined values read as other types in Python (str,
    DBRef, None), so none is stored as such. Once, for the process: mongomock's ``$type``
    names are module-wide."""
    names: dict[str, Any] = vars(filtering)["TYPE_MAP"]
    if names.get("minKey") is not None:
        return
    names.update(
        {
            "minKey": lambda v: isinstance(v, MinKey),
            "maxKey": lambda v: isinstance(v, MaxKey),
            "timestamp": lambda v: isinstance(v, Timestamp),
            "regex": lambda v: isinstance(v, Regex | re.Pattern),
            "javascript": lambda v: isinstance(v, Code) and v.scope is None,
            "javascriptWithScope": lambda v: isinstance(v, Code) and v.scope is not None,
            "string": lambda v: isinstance(v, str) and not isinstance(v, Code),
            "symbol": lambda v: False,
            "dbPointer": lambda v: False,
            "undefined": lambda v: False,
        }
    )


def union_with() -> None:
    """Teach mongomock's aggregation ``$unionWith`` (MongoDB 4.4): the documents so far,
    then those of the named collection through its own pipeline, as a server answers the
    orchestrator's probe of every collection in one read (once, for the process:
    mongomock's pipeline stages are module-wide)."""
    handlers: dict[str, Any] = vars(mongomock_aggregate)["_PIPELINE_HANDLERS"]
    if handlers.get("$unionWith") is not None:
        return

    def union(collection: Any, database: Any, options: Any) -> list[Any]:
        if isinstance(options, str):
            name, pipeline = options, []
        elif isinstance(options, Mapping) and isinstance(options.get("coll"), str):
            name, pipeline = options["coll"], list(options.get("pipeline", []))
        else:
            raise OperationFailure("$unionWith needs a collection name", 40414)
        other = database.get_collection(name)
        accelerate(other)  # its documents read as the proxies' are, the faster way
        return [*collection, *other.aggregate(pipeline)]

    handlers["$unionWith"] = union


def slice_projection(kwargs: dict[str, Any]) -> Any:
    """A projection of ``$slice`` alone, as a server reads it: every field returned, the
    sliced arrays cut, any other value of a sliced field returned as it is (mongomock
    returns only the sliced fields, and refuses a value that is no array). Takes such a
    projection out of ``kwargs``; returns what to apply to the document returned, or
    None when the projection is none of those."""
    projection = kwargs.get("projection")
    if not isinstance(projection, Mapping) or not projection:
        return None
    cuts = {}
    for field, spec in projection.items():
        if not (isinstance(spec, Mapping) and set(spec) == {"$slice"}):
            return None
        cuts[field] = spec["$slice"]
    del kwargs["projection"]

    def apply(doc: Any) -> Any:
        if not isinstance(doc, dict):
            return doc
        for field, count in cuts.items():
            value = doc.get(field)
            if isinstance(value, list) and isinstance(count, int):
                doc[field] = value[count:] if count < 0 else value[:count]
        return doc

    return apply
