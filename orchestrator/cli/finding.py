"""``orchestrator find``: the documents a filter selects, a page at a time, each query
served by an index (``orchestrator.operations.filters`` says which serves which filter)."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import click

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG
from orchestrator.cli.listing import (
    Listing,
    console,
    described,
    error_cell,
    phase_cell,
    tree_lines,
)
from orchestrator.cli.selecting import Selection, selection_options, the_document
from orchestrator.operations import Filter, Operations
from orchestrator.operations.filters import DEFAULT_LIMIT, MAX_LIMIT

COUNTED = 10_000
"""Documents ``find`` counts at most (through the index) to say how many match."""


@click.command(epilog=EPILOG, short_help="List the documents a filter selects, page by page.")
@selection_options(arguments="fields", metavar="[FIELD=VALUE]...", by_id=False)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=DEFAULT_LIMIT,
    help="Documents a page.",
)
@click.option("--after", metavar="CURSOR", help="The page after this cursor (find prints it).")
@click.option(
    "--owner",
    metavar="COLLECTION/ID",
    help="The children of this document (its collection, a slash, then its id or business "
    "key as typed): those it made with create_child, in the collection -c names.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: the page.")
@operations_options
def find(
    *,
    selection: Selection,
    limit: int,
    after: str | None,
    owner: str | None,
    as_json: bool,
    connection: Connection,
) -> int:
    """List the documents of a collection that a filter selects: id, business key, phase,
    lease state (and holder), attempts, last error, its parent and what it waits for;
    then the command of the next page.

    Filters combine (all must hold). FIELD=VALUE matches a field exactly: VALUE is
    Extended JSON when it parses as such (n=42 the integer, n='"42"' the string), else
    the text as typed; its FIELD must start an index (a collection scan is refused).
    Without --phase every phase is listed. Pages follow each other by key, never by
    skipping, so a page costs the same wherever it is. --owner lists a document's
    children (served by the index the replicas make on every collection they make
    children in); orchestrator history shows them with the parent.

    \b
    Examples:
      orchestrator find -c invoices --state failed --error TimeoutError
      orchestrator find -c invoices --key INV-1003
      orchestrator find -c invoices number=INV-1003 --json
      orchestrator find -c domains --owner gateways/gw-7
    """
    if selection.one:
        raise click.UsageError(
            f"{selection.doc_id!r} is no FIELD=VALUE: find one document by its business key "
            "with --key VALUE, or read it with: orchestrator history ID",
            click.get_current_context(),
        )
    operations = connection.operations(selection.collection)
    query = selection.filter(operations)
    if owner is not None:
        query = _children_of(operations, query, owner)
    page = operations.browse(query, after=after, limit=limit)
    if as_json:
        click.echo(json.dumps(page.to_dict(), indent=2))
        return 0
    total = operations.count(query, limit=COUNTED + 1)
    matching = f"more than {COUNTED}" if total > COUNTED else str(total)
    out = console()
    listing = Listing(
        title=f"{described(query)}: {matching} matching, {len(page.rows)} shown"
        + (" (after the cursor)" if after else ""),
        headers=("phase", "last error"),
    )
    for row in page.rows:
        listing.add_row(row, (*phase_cell(row), *tree_lines(row)), error_cell(row))
    if page.rows:
        listing.print(out)
    else:
        click.echo(f"{described(query)}: no documents" + (" after the cursor" if after else ""))
    click.echo(f"served by: {page.index}")
    if page.next:
        click.echo(f"next page: {_next_command(page.next)}")
    return 0


def _children_of(operations: Operations, query: Filter, owner: str) -> Filter:
    """``query`` narrowed to the children of the document ``owner`` names
    (``COLLECTION/ID``: split at the first slash, a child's id holding slashes itself)."""
    collection, slash, typed = owner.partition("/")
    if not slash or not collection or not typed:
        raise click.BadParameter(
            f"{owner!r} is no COLLECTION/ID (e.g. gateways/gw-7)", param_hint="--owner"
        )
    parent = the_document(operations, collection, typed, None)
    return replace(query, owner=(collection, parent["_id"]))


def _next_command(cursor: str) -> str:
    """This command again with ``--after cursor``: its filters and ``--db`` as given (not
    ``--uri``: it may hold a password)."""
    context = click.get_current_context()
    words = ["orchestrator", "find", *context.params["fields"], "-c", context.params["collection"]]
    if context.params["db"] is not None:
        words += ["--db", context.params["db"]]
    for phase in context.params["phases"]:
        words += ["--phase", phase]
    for option, name in (("--state", "state"), ("--error", "error_type"), ("--key", "key")):
        if context.params[name] is not None:
            words += [option, context.params[name]]
    if context.params["owner"] is not None:
        words += ["--owner", context.params["owner"]]
    if context.params["limit"] != DEFAULT_LIMIT:
        words += ["--limit", str(context.params["limit"])]
    words += ["--after", cursor]
    return shlex.join(words)


__all__ = ["find"]
