"""``--uri``, ``--db`` and ``--connect-timeout``, and the database they name: shared by
every command that connects, so each checks a URI and reaches a server alike."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pymongo.database import Database
from pymongo.errors import ConfigurationError, InvalidURI
from pymongo.uri_parser import parse_uri

from orchestrator.cli.conventions import CommandError
from orchestrator.core.redact import redact
from orchestrator.core.settings import DEFAULT_DATABASE
from orchestrator.mongo import connect
from orchestrator.mongo.common import Document

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


__all__ = ["DEFAULT_CONNECT_TIMEOUT", "database_options", "open_database"]
