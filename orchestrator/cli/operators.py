"""The operators' commands: ``status`` (documents per collection and phase, the latest
errors, the live replicas) and ``unlock`` and ``retry`` (one document, named by its id as
typed or as Extended JSON), on ``orchestrator.operations``."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from datetime import datetime

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.cli.connecting import database_options, open_database
from orchestrator.cli.conventions import EPILOG, CommandError
from orchestrator.core.redact import visible
from orchestrator.core.replicas import REPLICAS_COLLECTION, ReplicaRecord
from orchestrator.mongo.common import Document
from orchestrator.operations import (
    AmbiguousId,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    Operations,
    Status,
    error_phase,
    id_json,
    parse_id_json,
)


@click.command(epilog=EPILOG, short_help="Documents per collection and phase, and latest errors.")
@database_options(default_db=None)
@click.option(
    "--collection",
    "-c",
    "collections",
    multiple=True,
    help="Only this collection (repeatable).  [default: every collection]",
)
@click.option(
    "--errors", type=click.IntRange(min=0), default=5, help="Latest errors per collection."
)
@click.option(
    "--replicas-collection",
    default=REPLICAS_COLLECTION,
    help="Where the replicas record themselves (their replicas_collection setting).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(
    uri: str | None,
    db: str | None,
    connect_timeout: float,
    collections: tuple[str, ...],
    errors: int,
    replicas_collection: str,
    as_json: bool,
) -> int:
    """Documents per collection and phase: leased, overdue, waiting, failed; latest errors;
    the live replicas.

    Each replica records itself while it runs (refreshed every few seconds with its
    heartbeat) and is listed until its record expires (at most 40 s after it was killed).
    Replicas whose lock timeout, tick, concurrency or library version differ are flagged
    with a warning line; the exit status stays 0, since a rolling upgrade differs on
    purpose for a while (--json lists them under "disagreements" for scripts).

    \b
    Example:
      MONGODB_URI=mongodb://localhost:27017 orchestrator status -c gateways
    """
    database = open_database(uri, db, connect_timeout)
    operations = Operations(database, replicas_collection=replicas_collection)
    report = operations.status(list(collections) or None, errors=errors)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return 0
    _print_status(database.name, report)
    return 0


def _shown(value: str) -> Text:
    """A value read from the database, for a rich table: verbatim (no markup), visible."""
    return Text(visible(value))


def _print_status(name: str, status: Status) -> None:
    """Every value read from the database goes in as ``Text``, printed verbatim: a phase
    or a message holding ``[b]`` or ``[/items/0]`` is no markup."""
    console = Console()
    table = Table(title=Text(f"{name} at {status.at:%Y-%m-%d %H:%M:%S} UTC"))
    for column in ("collection", "phase", "documents", "leased now", "overdue", "waiting"):
        table.add_column(column, justify="left" if column in {"collection", "phase"} else "right")
    table.add_column("failed", justify="right")
    for row in status.phases:
        table.add_row(
            _shown(row.collection),
            _shown(row.phase),
            str(row.count),
            str(row.leased),
            _warn(row.overdue),
            str(row.waiting),
            _warn(row.failed),
        )
    if not status.phases:
        table.add_row("(no documents with a phase)", "", "", "", "", "", "")
    console.print(table)
    if not status.server_time:
        console.print(
            "[yellow]warning:[/] the server reports no time (hello without localTime): leases "
            "were judged by this machine's clock, and the replicas judge them by theirs"
        )
    if status.errors:
        errors = Table(title="latest errors")
        for column in ("collection", "id", "phase", "attempts", "at", "error"):
            errors.add_column(column)
        for error in status.errors:
            at = f"{error.at:%H:%M:%S}" if error.at else ""
            errors.add_row(
                _shown(error.collection),
                _shown(error.id),
                _shown(error.phase if error.phase is not None else ""),
                str(error.attempts),
                at,
                _shown(f"{error.type}: {error.message}"[:200]),
            )
        console.print(errors)
    _print_replicas(console, status)


def _print_replicas(console: Console, status: Status) -> None:
    if not status.replicas:
        console.print("no live replicas (none has recorded itself within its expiry)")
        return
    table = Table(title="live replicas")
    for column in ("replica", "host", "pid", "engine", "version", "last seen"):
        table.add_column(column, justify="right" if column in {"pid", "last seen"} else "left")
    for column in ("lock timeout", "tick", "concurrency"):
        table.add_column(column, justify="right")
    table.add_column("steps now")
    for replica in status.replicas:
        table.add_row(
            escape(visible(replica.replica_id)),  # written by whoever can write the collection
            escape(visible(replica.host)),
            str(replica.pid),
            escape(visible(replica.engine)),
            escape(visible(replica.version)),
            f"{replica.seen_ago(status.at):.0f}s ago",
            f"{replica.lock_timeout:g}s",
            f"{replica.tick:g}s",
            str(replica.max_concurrency),
            _steps_now(replica, status.at),
        )
    console.print(table)
    for disagreement in status.disagreements:
        console.print(
            f"[yellow]warning:[/] {escape(visible(disagreement.message))}", soft_wrap=True
        )


def _steps_now(replica: ReplicaRecord, now: datetime) -> str:
    """How many steps it ran at its last refresh, and the first few of them."""
    shown = [
        f"{s.collection}/{s.id} ({s.phase or '-'}, {max((now - s.since).total_seconds(), 0):.0f}s)"
        for s in replica.steps[:3]
    ]
    more = len(replica.steps) - len(shown)
    text = ", ".join(shown) + (f", +{more} more" if more else "")
    return escape(visible(f"{len(replica.steps)}: {text}") if shown else "0")


def _warn(value: int) -> str:
    return f"[red]{value}[/]" if value else "0"


ID_JSON_HELP = (
    'The document\'s id as Extended JSON, exactly: \'{"$numberInt": "42"}\' is the integer 42,'
    ' \'"42"\' the string, \'{"$oid": "..."}\' an ObjectId. Instead of ID, when ID names'
    " more than one document or an id has no typed form."
)


@click.command(epilog=EPILOG, short_help="Make a document claimable at once.")
@click.argument("doc_id", metavar="[ID]", required=False)
@click.option("--collection", "-c", required=True, help="The document's collection.")
@click.option("--id-json", metavar="JSON", help=ID_JSON_HELP)
@database_options(default_db=None)
def unlock(
    doc_id: str | None,
    collection: str,
    id_json: str | None,
    uri: str | None,
    db: str | None,
    connect_timeout: float,
) -> int:
    """Make a document claimable at once (a live holder's later writes raise LeaseLost).

    ID is the id as typed: a string, or an ObjectId's hex or an integer's digits, which
    name that value or the string alike (refused when both exist: then --id-json).

    \b
    Example:
      orchestrator unlock gw-01 -c gateways
    """
    operations = _operations(uri, db, connect_timeout, collection)
    doc = _the_document(operations, collection, doc_id, id_json)
    try:
        # Only the lease read above: a replica that claimed it meanwhile keeps its own.
        operations.unlock(collection, doc)
    except (DocumentChanged, DocumentNotFound):
        raise CommandError(
            f"{collection}/{doc['_id']} changed meanwhile; run unlock again"
        ) from None
    click.echo(
        visible(f"unlocked {collection}/{doc['_id']} (phase {doc.get('phase')}): claimable now")
    )
    return 0


@click.command(epilog=EPILOG, short_help="Reset a document's attempts and send it back to a phase.")
@click.argument("doc_id", metavar="[ID]", required=False)
@click.option("--collection", "-c", required=True, help="The document's collection.")
@click.option(
    "--phase",
    help="The phase to send it back to.  [default: the phase its last error happened in]",
)
@click.option(
    "--force",
    is_flag=True,
    help="Retry even while a replica holds a live lease on it: the holder's step goes on "
    "while another replica may claim the document and run its step too.",
)
@click.option("--id-json", metavar="JSON", help=ID_JSON_HELP)
@database_options(default_db=None)
def retry(
    doc_id: str | None,
    collection: str,
    phase: str | None,
    force: bool,
    id_json: str | None,
    uri: str | None,
    db: str | None,
    connect_timeout: float,
) -> int:
    """Reset a document's attempts and send it back to a phase.

    ID is the id as typed (see unlock --help). A document held by a live lease (a
    replica is in its step now) is refused unless --force.

    \b
    Example:
      orchestrator retry gw-01 -c gateways --phase Deleting
    """
    operations = _operations(uri, db, connect_timeout, collection)
    doc = _the_document(operations, collection, doc_id, id_json)
    if phase is None:
        phase = error_phase(doc)
        if phase is None:
            raise CommandError(
                f"{collection}/{doc['_id']} has no recorded error phase; pass --phase"
            )
    try:
        # Only if nobody moved it meanwhile: the phase and the lease read above are still so.
        retried = operations.retry(collection, doc, phase, force=force)
    except LeaseHeld:
        raise CommandError(
            f"{collection}/{doc['_id']} is held by a live lease of replica"
            f" {doc.get('lockedBy')!r} until {doc['lockedUntil']:%Y-%m-%d %H:%M:%S} UTC: a"
            " retry now lets another replica run its step while that one is still in it;"
            " wait for the lease to end, or pass --force"
        ) from None
    except (DocumentChanged, DocumentNotFound):
        raise CommandError(
            f"{collection}/{doc['_id']} changed meanwhile; run retry again"
        ) from None
    if not retried.server_time:
        click.echo(
            "orchestrator retry: warning: the server reports no time; "
            "updatedAt is stamped with this machine's clock",
            err=True,
        )
    click.echo(
        visible(
            f"retrying {collection}/{doc['_id']}: {retried.source} -> {retried.target}, "
            "attempts reset, claimable now"
            + (
                f" (the live lease of {doc.get('lockedBy')!r} was taken away)"
                if retried.lease_taken
                else ""
            )
        )
    )
    return 0


def _the_document(
    operations: Operations, collection: str, raw: str | None, exact: str | None
) -> Document:
    """The one document the operator names, by its id as typed (``raw``) or as Extended
    JSON (``exact``); an id typed as text that names two documents is refused, saying how
    to name each."""
    if exact is not None:
        if raw is not None:
            raise click.UsageError("give ID or --id-json, not both", click.get_current_context())
        try:
            return operations.document(collection, parse_id_json(exact))
        except DocumentNotFound:
            raise CommandError(f"no document {exact} in collection {collection!r}") from None
    if raw is None:
        raise click.UsageError(
            "which document? give its ID, or --id-json", click.get_current_context()
        )
    try:
        return operations.find(collection, raw)
    except DocumentNotFound:
        raise CommandError(f"no document {raw!r} in collection {collection!r}") from None
    except AmbiguousId as exc:
        raise CommandError(_ambiguous(collection, raw, exc.documents, "--id-json")) from None


def _ambiguous(collection: str, raw: str, docs: Iterable[Document], option: str) -> str:
    """Why ``raw`` is refused: the documents it names, each with the Extended JSON that
    names it alone, quoted for a shell, to give as ``option``."""
    forms = " or ".join(f"{option} {shlex.quote(id_json(doc['_id']))}" for doc in docs)
    return f"{raw!r} names more than one document in {collection!r}: say which with {forms}"


def _operations(uri: str | None, db: str | None, timeout: float, collection: str) -> Operations:
    database = open_database(uri, db, timeout)
    operations = Operations(database)
    if collection not in operations.collections():
        raise CommandError(f"unknown collection {collection!r} in database {database.name!r}")
    return operations


__all__ = ["retry", "status", "unlock"]
