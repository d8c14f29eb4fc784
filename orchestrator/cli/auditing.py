"""``orchestrator audit``: the audit trail, latest first: every operator's action (who,
when, what, on which documents, why) and every lease a replica took over from a dead
one. Bounded in time (each entry expires, ``orchestrator.core.audit``)."""

from __future__ import annotations

import json

import click

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG
from orchestrator.cli.listing import plain_id, when
from orchestrator.core.redact import visible
from orchestrator.operations import AuditEntry

SHOWN_DOCUMENTS = 3
"""Ids an entry lists in the table (``--json`` has all those recorded)."""


@click.command(epilog=EPILOG, short_help="Operators' actions and take-overs, latest first.")
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=50, help="Entries, the latest first."
)
@click.option(
    "--key",
    metavar="KEY",
    help="Only the entries naming a document by this business key: FIELD=VALUE, or a "
    "value of the one-field key the live replicas declare.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@operations_options
def audit(limit: int, key: str | None, as_json: bool, connection: Connection) -> int:
    """The audit trail, latest first: each operator's retry, unlock, cancel, pause and
    resume (who, when, what, how many documents, each by id and business key, why), and
    each lease a replica took over after its holder died.

    \b
    Examples:
      orchestrator audit --limit 20
      orchestrator audit --key INV-1003
    """
    entries = connection.operations().audit(limit, key=key)
    if as_json:
        click.echo(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    if not entries:
        click.echo("the audit trail is empty" if key is None else f"no entry names {visible(key)}")
        return 0
    click.echo("audit trail, latest first (times UTC):")
    for entry in entries:
        click.echo(visible(f"{when(entry.at) or '(no time)'}  {entry.by}: {_what(entry)}"))
        if entry.why:
            click.echo(visible(f"    why: {entry.why}"))
        if entry.failed:
            click.echo(visible(f"    stopped part way: {entry.failed}"))
    return 0


def _what(entry: AuditEntry) -> str:
    """What was done, in a line: the action, its collection and scope (a filter, a pause's
    phase or handler), where documents went, how many and which."""
    ids = [plain_id(d) + (f" {key}" if key else "") for d, key in entry.named()]
    shown_ids = ", ".join(ids[:SHOWN_DOCUMENTS])
    if len(ids) > SHOWN_DOCUMENTS:
        shown_ids += f", +{len(ids) - SHOWN_DOCUMENTS} more"
    if entry.kind == "takeover":
        phase = entry.scope.get("phase")
        return (
            f"took over {entry.collection}/{shown_ids}"
            + (f" ({phase})" if phase else "")
            + f" from {entry.taken_from or '?'}, whose lease expired unreleased"
        )
    scope = {k: v for k, v in entry.scope.items() if v and k not in {"_id", "to", "collection"}}
    text = f"{entry.action} {entry.collection}"
    if scope:
        text += " (" + ", ".join(f"{k}={v}" for k, v in scope.items()) + ")"
    if entry.action in {"pause", "resume"}:
        return text
    if entry.scope.get("to"):
        text += f" -> {entry.scope['to']}"
    count = f"{entry.count} document" + ("" if entry.count == 1 else "s")
    return f"{text}: {count}" + (f" ({shown_ids})" if shown_ids else "")


__all__ = ["audit"]
