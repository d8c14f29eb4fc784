"""``orchestrator signal``: a named signal (with an optional JSON payload) sent to one
document, as a replica's ``signal`` sends it: into its inbox, waking it if it waits for
that name. Recorded, with who and ``--why``, in the audit trail.

This command is no replica: the document it wakes is due at once, and the next tick of a
replica whose handlers take it claims it and moves it on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from bson import json_util
from bson.errors import BSONError

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG
from orchestrator.cli.listing import document_name
from orchestrator.cli.selecting import ID_JSON_HELP, row_of, the_document
from orchestrator.core.redact import visible


def _payload(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``--payload`` as JSON (Extended JSON: ``{"$date": ...}`` is a date)."""
    if value is None:
        return None
    try:
        return json_util.loads(value)
    except (ValueError, TypeError, BSONError) as exc:
        raise click.BadParameter(f"not JSON: {' '.join(str(exc).split())}") from None


@click.command(epilog=EPILOG, short_help="Send a document a signal, waking it if it waits for it.")
@click.argument("words", metavar="[COLLECTION] ID NAME", nargs=-1)
@click.option(
    "--collection",
    "-c",
    metavar="COLLECTION",
    help="The document's collection (else the first argument).",
)
@click.option("--id-json", "exact", metavar="JSON", help=ID_JSON_HELP + " Then give no ID.")
@click.option(
    "--payload",
    metavar="JSON",
    callback=_payload,
    help="What the signal carries, as JSON: what the waiting handler reads "
    "(lease.signal(NAME).payload).  [default: null]",
)
@click.option(
    "--why", metavar="REASON", required=True, help="Why: recorded, with who you are, in the audit."
)
@operations_options
def signal(
    *,
    words: Sequence[str],
    collection: str | None,
    exact: str | None,
    payload: Any,
    why: str,
    connection: Connection,
) -> int:
    """Send the signal NAME to one document (ID: its id as typed or its business key; or
    --id-json), as a replica's orch.signal sends it.

    It goes into the document's inbox (its latest 20 signals). If the document waits for
    NAME (lease.wait_for) and no step holds it, it is woken: due at once, claimed by the
    next tick of a replica that handles its phase, which moves it on to its wait's
    phase. Otherwise a later wait for NAME finds it in the inbox.

    \b
    Examples:
      orchestrator signal certificates cert-7 dns-verified --why "TXT record checked"
      orchestrator signal -c orders ORD-1 approved --payload '{"by": "alice"}' --why ok
    """
    collection, raw, name = _named(words, collection, exact)
    operations = connection.operations(collection)
    doc = the_document(operations, collection, raw, exact)
    row = row_of(operations, collection, doc)
    shown = document_name(collection, str(doc["_id"]), row.key if row else None)
    delivered = operations.signal(collection, doc["_id"], name, payload, why=why)
    if delivered.woke:
        said = (
            f"signal {name!r} sent to {shown}: it was waiting for it, and is due now "
            "(a replica's next tick moves it on)"
        )
    else:
        said = (
            f"signal {name!r} sent to {shown}: it was not waiting for it; kept in its "
            f"inbox for a wait for {name!r} to find"
        )
    click.echo(visible(said))
    click.echo(visible(f"recorded: by {operations.actor}, why: {why}"))
    return 0


def _named(
    words: Sequence[str], collection: str | None, exact: str | None
) -> tuple[str, str | None, str]:
    """The collection, the id as typed (None with ``--id-json``) and the signal's name
    the arguments give: ``[COLLECTION] ID NAME``, the collection as ``-c`` or first."""
    wanted = [*(["COLLECTION"] if collection is None else []), *(["ID"] if exact is None else [])]
    wanted.append("NAME")
    if len(words) != len(wanted):
        raise click.UsageError(
            f"give {' '.join(wanted)} ({len(words)} argument(s) given)",
            click.get_current_context(),
        )
    given = dict(zip(wanted, words, strict=True))
    return collection or given["COLLECTION"], given.get("ID"), given["NAME"]


__all__ = ["signal"]
