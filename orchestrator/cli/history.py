"""``orchestrator history``: what happened to one document, as a timeline, the latest
entry first (as the page, the JSON API and the audit trail show it): each step a replica
ran on it and each operator's action,
from the bounded history the document carries (``orchestrator.core.history``); before it,
the document's place in its tree (``Operations.tree``): its parent, what it waits for, its
children and its inbox of signals."""

from __future__ import annotations

import json
import shlex
from typing import Any

import click

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG
from orchestrator.cli.listing import document_name, phase_cell, when
from orchestrator.cli.selecting import ID_JSON_HELP, collection_option, row_of, the_document
from orchestrator.core.documents import id_json_or_text
from orchestrator.core.redact import visible
from orchestrator.operations import Entry, Row
from orchestrator.operations.tree_report import CHILDREN_SHOWN, Tree


@click.command(epilog=EPILOG, short_help="A document's timeline: its steps and operators' actions.")
@click.argument("doc_id", metavar="[ID]", required=False)
@collection_option("The document's collection.")
@click.option("--id-json", "exact", metavar="JSON", help=ID_JSON_HELP)
@click.option(
    "--traceback", "tracebacks", is_flag=True, help="Show each failed step's traceback too."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (tracebacks included)."
)
@operations_options
def history(
    *,
    doc_id: str | None,
    collection: str,
    exact: str | None,
    tracebacks: bool,
    as_json: bool,
    connection: Connection,
) -> int:
    """A document's timeline, the latest entry first: each step (the replica, when it was claimed,
    how long it took, its outcome, the phase it left, its error) and each operator's
    action (who, what, why).

    ID is its id as typed, or its business key (see find --help); --id-json names it
    exactly. The document keeps its last entries only (the replicas' history setting,
    20 by default); the oldest fall off.

    \b
    Example:
      orchestrator history INV-1003 -c invoices --traceback
    """
    if doc_id is not None and exact is not None:
        raise click.UsageError("give ID or --id-json, not both", click.get_current_context())
    operations = connection.operations(collection)
    doc = the_document(operations, collection, doc_id, exact)
    entries = operations.history(collection, doc["_id"])
    row = row_of(operations, collection, doc)
    tree = operations.tree(collection, doc)
    if as_json:
        shown = {**_as_json(collection, doc["_id"], row, entries), "tree": tree.to_dict()}
        click.echo(json.dumps(shown, indent=2))
        return 0
    name = document_name(collection, str(doc["_id"]), row.key if row else None)
    click.echo(visible(name))
    if row is not None:
        phase, state, attempts = phase_cell(row)
        gave_up = f"; {row.failed_by} gave up on it" if row.failed_by else ""
        click.echo(visible(f"now: {phase}, {state}, {attempts}{gave_up}"))
        if row.expires_at is not None:
            click.echo(f"deleted by the server from {when(row.expires_at)} UTC (its retention)")
    for line in _tree_lines(tree, f"{collection}/{doc['_id']}"):
        click.echo(visible(line))
    if not entries:
        click.echo(
            "no history recorded: the replicas keep none (their history setting is 0), or "
            "nothing has happened to it since they began to"
        )
        return 0
    count = f"{len(entries)} entr" + ("y" if len(entries) == 1 else "ies")
    click.echo(f"history, latest first ({count}; times UTC):")
    for number, entry in zip(range(len(entries), 0, -1), entries, strict=True):
        click.echo(visible(f"#{number:<3} {when(entry.at) or '(no time)'}  {_line(entry)}"))
        detail = _detail(entry)
        if detail:
            click.echo(visible(f"     {detail}"))
        if tracebacks and entry.traceback:
            for line in entry.traceback.splitlines():
                click.echo(f"       {visible(line)}")
    return 0


def _tree_lines(tree: Tree, name: str) -> list[str]:
    """Its parent, its wait, its children and its inbox, as lines (none of what it lacks);
    ``name``: ``collection/id``, as ``find --owner`` takes it."""
    lines = []
    if tree.parent is not None:
        parent = tree.parent
        lines.append(f"parent: {parent.collection}/{parent.id} (its child {parent.name!r})")
    elif tree.parent_unreadable:
        lines.append("parent: unreadable (orchestratorOwner holds no owner)")
    if tree.waiting is not None:
        lines.append(tree.waiting.words())
    if tree.owns:
        counted = tree.counted
        lines.append(
            f"children ({counted.total} in {', '.join(tree.owns)}"
            + ("" if counted.ended is None else f"; {counted.ended} ended")
            + "):"
        )
        for child in tree.children:
            ended = {True: "ended", False: "going on", None: "ended?"}[child.ended]
            failed = " (failed)" if child.failed else ""
            phase = child.phase if child.phase is not None else "(no phase)"
            lines.append(f"  {child.collection}/{child.id}  {phase}  {ended}{failed}")
        for where in tree.cut:
            lines.append(
                f"  ... more in {where} than the {CHILDREN_SHOWN} listed: orchestrator find "
                f"-c {where} --owner {shlex.quote(name)} lists them all"
            )
        if counted.cut:
            lines.append(f"  not looked in: {', '.join(counted.cut)}")
    inbox = tree.inbox
    if inbox.signals or inbox.sent:
        lines.append(f"signals: {inbox.words()}; latest first:")
        for signal in inbox.signals:
            taken = "  (a wait took it)" if signal.taken else ""
            payload = f"  {signal.payload}" if signal.payload else ""
            lines.append(f"  {when(signal.at) or '(no time)'}  {signal.name}{payload}{taken}")
    return lines


def _line(entry: Entry) -> str:
    """Who did what: a step's replica and outcome, or an operator and their action."""
    moved = _moved(entry)
    if entry.kind == "step":
        took = f", took {entry.took:.3f}s" if entry.took is not None else ""
        return f"step by {entry.by}: {entry.what}, {moved}{took}"
    return f"{entry.by} ({entry.kind}): {entry.what}, {moved}"


def _moved(entry: Entry) -> str:
    if entry.to is None or entry.to == entry.phase:
        return entry.phase or ""
    return f"{entry.phase or '?'} -> {entry.to}"


def _detail(entry: Entry) -> str:
    parts = []
    if entry.error_type is not None or entry.error_message is not None:
        parts.append(f"{entry.error_type or '?'}: {entry.error_message or ''}")
    if entry.taken_from:
        parts.append(f"took over the expired lease of {entry.taken_from}")
    if entry.why:
        parts.append(f"why: {entry.why}")
    return "; ".join(parts)


def _as_json(collection: str, doc_id: Any, row: Row | None, entries: list[Entry]) -> dict[str, Any]:
    return {
        "collection": collection,
        "id": str(doc_id),
        "ref": id_json_or_text(doc_id),
        "document": row.to_dict() if row is not None else None,
        "order": "latest first",
        "entries": [entry.to_dict() for entry in entries],
    }


__all__ = ["history"]
