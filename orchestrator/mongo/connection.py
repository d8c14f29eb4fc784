"""The server a store talks to and how: the oldest MongoDB it accepts, the database name it
checks, the primary whose clock it watches, and the options (client, codec, write concern)
both stores read and write with."""

from __future__ import annotations

import inspect
import math
from collections.abc import Hashable, Mapping
from datetime import UTC
from typing import Any

from bson.codec_options import CodecOptions, DatetimeConversion
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database
from pymongo.errors import PyMongoError
from pymongo.server_type import SERVER_TYPE
from pymongo.write_concern import WriteConcern

from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.core.redact import redact

MIN_SERVER_VERSION = "4.4"
MIN_WIRE_VERSION = 9
"""The oldest MongoDB the orchestrator runs on (the oldest PyMongo 4.14+ connects to)."""
_RELEASES = {6: "3.6", 7: "4.0", 8: "4.2"}

COMMAND_NOT_FOUND = 59
"""The server's answer to ``hello`` before MongoDB 4.4.2 (and 4.2.10, 4.0.21)."""


def check_server(reply: Mapping[str, Any]) -> None:
    """Refuse a server older than ``MIN_SERVER_VERSION``, judged by the ``maxWireVersion``
    of its ``hello`` (every server sends it)."""
    wire = reply.get("maxWireVersion")
    if isinstance(wire, int) and not isinstance(wire, bool) and wire < MIN_WIRE_VERSION:
        release = _RELEASES.get(wire, "older than 3.6")
        raise StoreError(
            f"MongoDB {MIN_SERVER_VERSION} or newer is required; this server is MongoDB "
            f"{release} (wire version {wire})"
        )


_BAD_DATABASE_CHARS = frozenset('/\\. "$*<>:|?\x00')


def database_kind(db: object) -> bool | None:
    """True for a database of PyMongo's async API (``AsyncDatabase``, its in-memory and
    fault-injecting stand-ins: their ``command`` is a coroutine function), False for a sync
    one, None for what is no database."""
    if isinstance(db, AsyncDatabase):
        return True
    if isinstance(db, Database):
        return False
    command = getattr(db, "command", None)
    if not callable(command) or not callable(getattr(db, "get_collection", None)):
        return None
    return inspect.iscoroutinefunction(command)


def primary_of(client: object) -> Hashable:
    """What names the server whose clock a replica measures, from what the driver already
    knows of its topology (no I/O): the replica set's primary and its election. A
    failover changes it, and with it, possibly, the clock ``hello`` reports. None when
    the client tells nothing (the in-memory store), or has no primary right now."""
    try:
        description = getattr(client, "topology_description", None)
        if description is None:
            return None
        servers = description.server_descriptions().values()
        return next(
            (
                (s.address, s.election_id, s.set_version)
                for s in servers
                if s.server_type == SERVER_TYPE.RSPrimary
            ),
            None,
        )
    except Exception:  # a proxy or fake client: nothing to watch
        return None


def check_database_name(name: object) -> None:
    """MongoDB's naming rules, checked before the first operation rather than by it."""
    if (
        not isinstance(name, str)
        or not name
        or len(name.encode("utf-8")) >= 64
        or _BAD_DATABASE_CHARS.intersection(name)
    ):
        raise ConfigError(
            f'invalid database name {name!r}: 1 to 63 bytes, none of / \\ . space " $ * < > : | ?'
        )


def write_concern(w: str | int, write_timeout: float) -> WriteConcern:
    """The store's write concern: ``w``, waiting at most ``write_timeout`` seconds
    (``wtimeout``), so a write raises a transient error instead of blocking while no
    majority is reachable."""
    if (
        not isinstance(write_timeout, int | float)
        or not math.isfinite(write_timeout)
        or write_timeout <= 0
    ):
        raise ConfigError(f"write_timeout must be a number of seconds > 0, not {write_timeout!r}")
    return WriteConcern(w=w, wtimeout=max(1, round(write_timeout * 1000)))


def codec_options(client: CodecOptions[Document]) -> CodecOptions[Document]:
    """Read what the library expects whatever the client's options (``tz_aware``,
    ``DATETIME_MS``): aware UTC datetimes, and a date outside ``datetime``'s range as
    ``bson.DatetimeMS`` rather than an error; documents as the client's document class."""
    return client.with_options(
        tz_aware=True, tzinfo=UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
    )


def unreachable(exc: PyMongoError) -> str:
    """The reason a server could not be reached, in one short line: the driver's message
    without its timeouts and topology description (hundreds of characters), redacted."""
    reason = str(exc).split(" (configured timeouts", 1)[0].split(", Timeout:", 1)[0]
    reason = " ".join(redact(reason).split())
    return reason[:200] if reason else type(exc).__name__


def client_options(timeout: float) -> dict[str, Any]:
    """The options ``connect`` opens a client with: server selection gives up after
    ``timeout`` seconds, so a command-line tool fails in seconds, not thirty."""
    return {"serverSelectionTimeoutMS": max(int(timeout * 1000), 1), "appname": "orchestrator"}
