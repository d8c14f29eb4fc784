"""The sync store's names where the rest of the package imports them from.

The store itself is ``orchestrator.mongo``: ``Store`` is generated from ``AsyncStore``
(``orchestrator/mongo/_async/store.py``), and what both share without I/O is in
``orchestrator.mongo.common``. This module only re-exports, so that importers need not
know that layout.
"""

from __future__ import annotations

from orchestrator.mongo._sync.store import Store, connect
from orchestrator.mongo.common import (
    COMMAND_NOT_FOUND,
    INDEX_CONFLICT_CODES,
    MIN_SERVER_VERSION,
    MIN_WIRE_VERSION,
    TOO_LARGE_CODES,
    WRITE_CONCERN_FAILED,
    Document,
    DocumentTooLarge,
    check_server,
    driver_errors,
    is_transient,
    is_write_timeout,
)

__all__ = [
    "COMMAND_NOT_FOUND",
    "INDEX_CONFLICT_CODES",
    "MIN_SERVER_VERSION",
    "MIN_WIRE_VERSION",
    "TOO_LARGE_CODES",
    "WRITE_CONCERN_FAILED",
    "Document",
    "DocumentTooLarge",
    "Store",
    "check_server",
    "connect",
    "driver_errors",
    "is_transient",
    "is_write_timeout",
]
