"""``--uri``, ``--db`` and ``--connect-timeout``, and the database they name: shared by
every command that connects, so each checks a URI and reaches a server alike; with the
library's own collections (``--replicas-collection`` and the like), the ``Operations``
of the operators' commands."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from pymongo.database import Database
from pymongo.errors import ConfigurationError, InvalidURI
from pymongo.uri_parser import parse_uri

from orchestrator.cli.conventions import CommandError
from orchestrator.core.documents import Document
from orchestrator.core.names import (
    AUDIT_COLLECTION,
    PAUSES_COLLECTION,
    REPLICAS_COLLECTION,
    SCHEDULES_COLLECTION,
)
from orchestrator.core.redact import redact
from orchestrator.core.settings import DEFAULT_DATABASE
from orchestrator.mongo import connect
from orchestrator.operations import Operations

DEFAULT_CONNECT_TIMEOUT = 5.0


def _check_uri(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a malformed URI at once, before any connection is tried (``notauri`` is not
    an unreachable server), and an unknown URI option, which the driver only warns of."""
    if value is None or value.startswith("mongodb+srv://"):
        return value  # an SRV URI is checked when it is resolved, by connect()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parse_uri(value)
    except (InvalidURI, ConfigurationError, ValueError, UserWarning) as exc:
        raise click.BadParameter(f"{redact(value)}: {redact(str(exc))}") from None
    return value


F = TypeVar("F", bound=Callable[..., Any])


def database_options(default_db: str | None) -> Callable[[F], F]:
    """``--uri``, ``--db`` and ``--connect-timeout``, shared by every command that connects."""

    def decorate(command: F) -> F:
        command = click.option(
            "--connect-timeout",
            type=click.FloatRange(min=0, min_open=True, max=300),
            default=DEFAULT_CONNECT_TIMEOUT,
            help="Seconds to reach the server before giving up with the reason.",
        )(command)
        command = click.option(
            "--db",
            default=default_db,
            show_default=True if default_db else f"the URI's database, else {DEFAULT_DATABASE!r}",
            help="Database name.",
        )(command)
        return click.option(
            "--uri",
            envvar="MONGODB_URI",
            show_envvar=True,
            callback=_check_uri,
            help="MongoDB URI.",
        )(command)

    return decorate


def open_database(uri: str | None, db: str | None, timeout: float) -> Database[Document]:
    """The database named by ``--uri``/``$MONGODB_URI`` and ``--db``, reachable now."""
    if not uri:
        raise CommandError("no database: set MONGODB_URI or pass --uri")
    return connect(uri, db, timeout=timeout)


@dataclass(frozen=True)
class Connection:
    """The database and the library's own collections an operators' command names."""

    uri: str | None
    db: str | None
    timeout: float
    replicas: str
    pauses: str
    audit: str
    schedules: str = SCHEDULES_COLLECTION

    def operations(self, collection: str | None = None) -> Operations:
        """``Operations`` on the database, reachable now; ``collection``: one it must have
        (a typo is refused, not answered with nothing)."""
        return self.open(collection)[1]

    def open(self, collection: str | None = None) -> tuple[Database[Document], Operations]:
        """The database, and ``Operations`` on it (as ``operations``)."""
        database = open_database(self.uri, self.db, self.timeout)
        operations = Operations(
            database,
            replicas_collection=self.replicas,
            pauses_collection=self.pauses,
            audit_collection=self.audit,
            schedules_collection=self.schedules,
        )
        if collection is not None and collection not in operations.collections():
            raise CommandError(f"unknown collection {collection!r} in database {database.name!r}")
        return database, operations


def operations_options(command: F) -> F:
    """The database options and the library's own collections (as the replicas'
    settings name them), given to ``command`` as one ``connection``."""

    @functools.wraps(command)
    def run(
        *args: Any,
        uri: str | None,
        db: str | None,
        connect_timeout: float,
        replicas_collection: str,
        pauses_collection: str,
        audit_collection: str,
        schedules_collection: str,
        **kwargs: Any,
    ) -> Any:
        connection = Connection(
            uri,
            db,
            connect_timeout,
            replicas_collection,
            pauses_collection,
            audit_collection,
            schedules_collection,
        )
        return command(*args, connection=connection, **kwargs)

    decorated: Any = run
    for name, default, setting in (
        ("--schedules-collection", SCHEDULES_COLLECTION, "schedules_collection"),
        ("--audit-collection", AUDIT_COLLECTION, "audit_collection"),
        ("--pauses-collection", PAUSES_COLLECTION, "pauses_collection"),
        ("--replicas-collection", REPLICAS_COLLECTION, "replicas_collection"),
    ):
        decorated = click.option(name, default=default, help=f"The replicas' {setting} setting.")(
            decorated
        )
    result: F = database_options(default_db=None)(decorated)
    return result


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "Connection",
    "database_options",
    "open_database",
    "operations_options",
]
