"""The driver's errors, classified once for both stores: what may be retried, what was too
large, what a sharded collection refused; ``driver_errors`` turns them into the library's
(``StoreError``, ``ShardKeyRequired``), so no layer above sees pymongo's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from bson.errors import BSONError
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
    WTimeoutError,
)
from pymongo.errors import DocumentTooLarge as DriverDocumentTooLarge

from orchestrator.core import sharding
from orchestrator.core.errors import StoreError
from orchestrator.core.outages import DatabaseWatch
from orchestrator.core.redact import redact

WRITE_CONCERN_FAILED = 64
TOO_LARGE_CODES = frozenset({10334, 17419, 17420})
"""BSONObjectTooLarge; an update's, an upsert's result over 16 MiB (Location17419/17420)."""
SHARD_KEY_NOT_FOUND = 61
"""A sharded collection's refusal, before MongoDB 8.0 (7.1 on Atlas), of a findAndModify,
a single delete or an upsert whose filter does not name the whole shard key."""
INVALID_OPTIONS = 72
"""InvalidOptions: among others, a sharded collection's refusal of a single update that
names neither its ``_id`` nor its shard key."""
DUPLICATE_KEY = 11000
"""An insert refused by a unique index: a limit's slot another replica made first."""


class DocumentTooLarge(StoreError):
    """The server refused a write because the document would exceed 16 MiB: nothing of
    it was applied."""


def is_write_timeout(exc: PyMongoError) -> bool:
    """The write applied on the primary, but too few members acknowledged it within
    ``wtimeout``: no majority is reachable now (an election, a partition)."""
    if isinstance(exc, WTimeoutError):
        return True
    if isinstance(exc, WriteConcernError):
        info = (exc.details or {}).get("errInfo")
        return exc.code == WRITE_CONCERN_FAILED or (
            isinstance(info, Mapping) and bool(info.get("wtimeout"))
        )
    return False


def is_transient(exc: PyMongoError) -> bool:
    """Network trouble and elections: the same operation may succeed when retried."""
    return isinstance(exc, AutoReconnect | ConnectionFailure) or exc.has_error_label(
        "RetryableWriteError"
    )


def _too_large(exc: Exception) -> bool:
    if isinstance(exc, DriverDocumentTooLarge):
        return True
    return isinstance(exc, OperationFailure) and exc.code in TOO_LARGE_CODES


def untargeted(exc: PyMongoError) -> bool:
    """The server refused a write because it names no shard key of a sharded collection."""
    if not isinstance(exc, OperationFailure):
        return False
    if exc.code == SHARD_KEY_NOT_FOUND:
        return True
    return exc.code == INVALID_OPTIONS and "sharded collection" in str(exc)


Sharded = tuple[str, Sequence[str] | None]
"""A write's collection, and the shard key it names (None: not known where it is sent)."""


@contextmanager
def driver_errors(
    action: str, sharded: Sharded | None = None, watch: DatabaseWatch | None = None
) -> Iterator[None]:
    """Driver errors raised inside leave as ``StoreError`` saying what ``action`` failed,
    with ``transient`` set when retrying may help, so no layer above sees pymongo's.

    ``sharded``: a write to that collection, naming that shard key; the server's refusal
    of it for want of the shard key leaves as ``ShardKeyRequired`` (a ``ConfigError``
    naming the fix), never as a ``StoreError`` to retry: retrying cannot help.

    ``watch``: told what the operation found (an answer, or a transient failure), so a
    replica says once that the database is unreachable, and once that it is back."""
    epoch = 0 if watch is None else watch.epoch
    try:
        yield
    except PyMongoError as exc:
        error = _store_error(action, exc)
        if watch is not None:
            # A server's refusal (a duplicate key, a write it rejects) is an answer too: it
            # ends an outage as a success does; a transient failure may begin one.
            if error.transient:
                watch.failed(epoch, action, error)
            elif isinstance(exc, OperationFailure):
                watch.answered(epoch)
        if sharded is not None and untargeted(exc):
            details = exc.details if isinstance(exc, OperationFailure) else None
            said = (details or {}).get("errmsg") or str(exc)
            raise sharding.refused(sharded[0], sharded[1], redact(str(said))) from exc
        raise error from exc
    except BSONError as exc:  # DocumentTooLarge and unencodable values are not PyMongoErrors
        if _too_large(exc):
            raise DocumentTooLarge(f"{action} refused: {redact(str(exc))}") from exc
        raise StoreError(f"{action} failed: {redact(str(exc))}") from exc
    if watch is not None:
        watch.answered(epoch)


def _store_error(action: str, exc: PyMongoError) -> StoreError:
    """The library's error for the driver's ``exc``, raised while doing ``action``."""
    if _too_large(exc):
        return DocumentTooLarge(
            f"{action} refused: the document would exceed MongoDB's 16 MiB limit"
            f" ({redact(str(exc))})"
        )
    if is_write_timeout(exc):
        return StoreError(
            f"{action}: no majority acknowledged the write within the write timeout"
            " (it may have applied on the primary)",
            transient=True,
        )
    return StoreError(f"{action} failed: {redact(str(exc))}", transient=is_transient(exc))
