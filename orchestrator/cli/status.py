"""``orchestrator status``: what operators ask first. Documents per collection and phase
(leased, overdue, waiting, retrying, failed), the latest errors (each document's full id and
business key), the live replicas, the pauses in force and who honours them, and the
latest leases taken over from dead replicas; the schedules in a line."""

from __future__ import annotations

import json
from datetime import datetime

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG
from orchestrator.cli.listing import Listing, console, error_cell, phase_cell, plain_id, shown, when
from orchestrator.core.redact import visible
from orchestrator.core.replicas import ReplicaRecord
from orchestrator.core.retention import describe
from orchestrator.operations import Filter, LeaseState, Operations, Status
from orchestrator.operations.filters import MAX_LIMIT


@click.command(epilog=EPILOG, short_help="Documents per collection and phase, and latest errors.")
@click.option(
    "--collection",
    "-c",
    "collections",
    multiple=True,
    help="Only this collection (repeatable).  [default: every collection]",
)
@click.option(
    "--errors",
    type=click.IntRange(0, MAX_LIMIT),
    default=5,
    help="Latest errors per collection.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@operations_options
def status(collections: tuple[str, ...], errors: int, as_json: bool, connection: Connection) -> int:
    """Documents per collection and phase: leased, overdue, waiting, retrying (the latest
    attempt failed; it is tried again), failed (its handler gave up on it: it stays in
    the failed phase until retried); the latest errors of each, given up on and still
    retrying apart, each with the document's full id and business key; the live replicas; the
    pauses in force and which live replicas honour each; the latest leases taken over
    from dead replicas; the schedules (how many, paused, failing).

    Each replica records itself while it runs (refreshed every few seconds with its
    heartbeat) and is listed until its record expires (at most 40 s after it was killed).
    Replicas whose lock timeout, in-house lock timeout (legacy_lock_timeout, during a
    migration), tick, concurrency, library version, handlers' limits or schedules' specs
    differ are flagged with a warning line; the exit status stays 0, since a rolling
    upgrade differs on purpose for a while (--json lists them under "disagreements" for scripts).

    \b
    Example:
      MONGODB_URI=mongodb://localhost:27017 orchestrator status -c gateways
    """
    database, operations = connection.open()
    report = operations.status(list(collections) or None, errors=errors)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return 0
    _print_status(database.name, operations, report, errors)
    return 0


def _print_status(name: str, operations: Operations, status: Status, errors: int) -> None:
    """Every value read from the database goes in as ``Text``, printed verbatim: a phase
    or a message holding ``[b]`` or ``[/items/0]`` is no markup."""
    out = console()
    # Eight columns in 80: the listings' light frame, one space between columns.
    table = Table(
        title=Text(f"{name} at {when(status.at)} UTC"),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    for column in ("collection", "phase"):
        table.add_column(column, overflow="fold")
    for column in ("documents", "leased now", "overdue", "waiting", "retrying", "failed"):
        table.add_column(column, justify="right", min_width=len(column.split()[0]))
    for row in status.phases:
        table.add_row(
            shown(row.collection),
            shown(row.phase),
            str(row.count),
            str(row.leased),
            _warn(row.overdue),
            str(row.waiting),
            str(row.retrying),
            _warn(row.failed),
        )
    if not status.phases:
        table.add_row("(no documents with a phase)", "", "", "", "", "", "", "")
    out.print(table)
    if not status.server_time:
        out.print(
            "[yellow]warning:[/] the server reports no time (hello without localTime): leases "
            "were judged by this machine's clock, and the replicas judge them by theirs"
        )
    for note in status.notes:
        out.print(f"[yellow]warning:[/] {escape(visible(note))}", soft_wrap=True)
    _print_errors(out, operations, status, errors)
    _print_replicas(out, status)
    _print_retention(out, status)
    _print_pauses(out, status)
    _print_takeovers(out, status)
    _print_schedules(out, status)


def _print_schedules(out: Console, status: Status) -> None:
    """The schedules in a line (``orchestrator schedules`` lists them); the specs live
    replicas disagree on are among the disagreements above."""
    summary = status.schedules
    if summary is None or not summary.count:
        return
    line = f"schedules: {summary.count}, paused {summary.paused}, failing "
    failing = f"[red]{summary.failing}[/]" if summary.failing else "0"
    out.print(f"{line}{failing} (orchestrator schedules lists them)")


def _print_errors(out: Console, operations: Operations, status: Status, errors: int) -> None:
    """The latest errors of each collection that has some, as ``find --state failed`` and
    ``--state retrying`` list them (given up on, then still being retried): whole ids,
    business keys, handler names."""
    for collection in dict.fromkeys(error.collection for error in status.errors):
        for state, what in ((LeaseState.FAILED, "given up"), (LeaseState.RETRYING, "retrying")):
            page = operations.browse(Filter(collection, state=state), limit=errors)
            if not page.rows:
                continue
            listing = Listing(
                title=f"{what} in {collection} (all: orchestrator find -c {collection} "
                f"--state {state.value})",
                headers=("phase", "last error"),
            )
            for row in page.rows:
                listing.add_row(row, phase_cell(row), error_cell(row))
            listing.print(out)


REPLICA_COLUMNS = (
    "replica",
    "host",
    "pid",
    "engine",
    "version",
    "last seen",
    "lock timeout",
    "tick",
    "concurrency",
    "steps now",
)


def _print_replicas(out: Console, status: Status) -> None:
    """A table when every cell fits the terminal whole; else one block per replica, its id
    on a line of its own: a replica's id is what every other tool names it by, and a
    table of ten columns folded into 80 cuts ids, headers and values mid-word."""
    if not status.replicas:
        out.print("no live replicas (none has recorded itself within its expiry)")
        return
    rows = [[Text.from_markup(cell) for cell in _replica_cells(r, status)] for r in status.replicas]
    widths = [
        max(len(header), *(row[i].cell_len for row in rows))
        for i, header in enumerate(REPLICA_COLUMNS)
    ]
    if sum(widths) + len(widths) - 1 <= out.width:
        table = Table(
            title="live replicas", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0)
        )
        for header in REPLICA_COLUMNS:
            right = header in {"pid", "last seen", "lock timeout", "tick", "concurrency"}
            table.add_column(header, justify="right" if right else "left", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        out.print(table)
    else:
        out.print("live replicas:")
        for row in rows:
            out.print(Text("  ").append_text(row[0]), soft_wrap=True)
            for header, cell in zip(REPLICA_COLUMNS[1:], row[1:], strict=True):
                out.print(Text(f"      {header}: ").append_text(cell), soft_wrap=True)
    for disagreement in status.disagreements:
        out.print(f"[yellow]warning:[/] {escape(visible(disagreement.message))}", soft_wrap=True)


def _replica_cells(replica: ReplicaRecord, status: Status) -> list[str]:
    """A replica's cells as markup, every stored value escaped: a record is written by
    whoever can write the collection."""
    return [
        escape(visible(replica.replica_id)),
        escape(visible(replica.host)),
        str(replica.pid),
        escape(visible(replica.engine)),
        escape(visible(replica.version)),
        f"{replica.seen_ago(status.at):.0f}s ago"
        + (" [red](stale)[/]" if replica.stale(status.at) else ""),
        f"{replica.lock_timeout:g}s" + _in_house(replica),
        f"{replica.tick:g}s",
        str(replica.max_concurrency),
        _steps_now(replica, status.at),
    ]


def _print_retention(out: Console, status: Status) -> None:
    """How long the live replicas keep documents of each retained phase: the server
    deletes them that long after they entered it (within a minute or so)."""
    kept = status.retention()
    if not kept:
        return
    out.print("retention (deleted by the server this long after entering the phase):")
    for collection, phases in kept.items():
        out.print(Text(f"    {visible(collection)}: {visible(describe(phases))}"), soft_wrap=True)


def _in_house(replica: ReplicaRecord) -> str:
    """The in-house pods' lock timeout a replica honours during a migration, if any."""
    timeout = replica.legacy_lock_timeout
    return "" if timeout is None else f" (in-house {timeout:g}s)"


def _print_pauses(out: Console, status: Status) -> None:
    """Each pause, and which live replicas honour it (they read the pauses at their
    heartbeat: one that does not yet will within its heartbeat interval)."""
    if not status.pauses:
        return
    out.print("paused (each replica honours a pause from its next heartbeat on):")
    for pause in status.pauses:
        described = pause.scope.describe()
        since = f" since {when(pause.at)} UTC" if pause.at else ""
        honouring = [r.replica_id for r in status.replicas if described in r.paused]
        waiting = [r.replica_id for r in status.replicas if described not in r.paused]
        out.print(
            shown(f"  {described}: by {pause.by}{since}, why: {pause.why or '-'}"), soft_wrap=True
        )
        line = f"    honoured by: {', '.join(honouring) or 'no live replica yet'}"
        if waiting:
            line += f"; not yet by: {', '.join(waiting)}"
        out.print(shown(line), soft_wrap=True)


def _print_takeovers(out: Console, status: Status) -> None:
    """Leases whose holder never released them (it died, stalled or lost the database),
    taken over by another replica: the latest first."""
    if not status.takeovers:
        return
    out.print("leases taken over from dead replicas, latest first:")
    for entry in status.takeovers:
        documents = ", ".join(f"{entry.collection}/{plain_id(d)}" for d in entry.documents)
        phase = entry.scope.get("phase")
        out.print(
            shown(
                f"  {when(entry.at)}  {documents}"
                + (f" ({phase})" if phase else "")
                + f": {entry.by} took it over from {entry.taken_from or '?'}"
            ),
            soft_wrap=True,
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


__all__ = ["status"]
