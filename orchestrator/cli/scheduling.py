"""``orchestrator schedules``: the schedules (spec, next fire, last run and its outcome,
paused or not, missed fires), one with its recent runs (``show``), and the operators'
actions on one: ``pause``, ``resume``, ``trigger`` (one run now), ``backfill`` (the fire
times of a range), each recorded with who and why in the audit trail."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG
from orchestrator.cli.listing import console, shown, when
from orchestrator.core.redact import visible
from orchestrator.operations import Operations
from orchestrator.operations.schedule_report import MAX_RUNS, ScheduleRow

F = TypeVar("F", bound=Callable[..., Any])


def _acting(command: F) -> F:
    """``NAME``, ``--by`` and ``--why`` of an action on one schedule."""
    command = click.option(
        "--why", metavar="REASON", required=True, help="Why: recorded in the audit trail."
    )(command)
    command = click.option(
        "--by",
        metavar="WHO",
        help="Who acts, as the audit trail records it.  [default: this user at this host]",
    )(command)
    result: F = click.argument("name")(command)
    return result


def _moment(ctx: click.Context, param: click.Parameter, value: str) -> datetime:
    """An ISO 8601 time (``2026-01-01T02:00``, ``...Z``, ``...+01:00``); without a zone,
    UTC."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is no ISO 8601 time (2026-01-01T02:00:00Z)") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@click.group(
    epilog=EPILOG,
    invoke_without_command=True,
    short_help="The schedules: spec, next fire, last run; pause, trigger, backfill.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@operations_options
@click.pass_context
def schedules(ctx: click.Context, as_json: bool, connection: Connection) -> int:
    """The schedules, by name: spec, collection, overlap policy, next fire, last run and
    its outcome (and the phase its document is in now), paused or not, missed fires, who
    declared the stored spec, and whether live replicas disagree on it.

    The stored spec fires: a replica declaring another writes its own when it starts, so
    the replica started last wins; status flags replicas that disagree.

    \b
    Examples:
      orchestrator schedules
      orchestrator schedules show nightly-report
      orchestrator schedules pause nightly-report --why "month-end freeze"
      orchestrator schedules trigger nightly-report --why "rerun after the fix"
      orchestrator schedules backfill nightly-report --from 2026-03-01 --to 2026-03-07 \\
          --why "missed during the outage"
    """
    if ctx.invoked_subcommand is not None:
        return 0
    rows = connection.operations().schedules()
    if as_json:
        click.echo(json.dumps([row.to_dict() for row in rows], indent=2))
        return 0
    if not rows:
        click.echo(f"no schedules in {connection.schedules!r}")
        return 0
    table = Table(title="schedules (times UTC)")
    for column in ("name", "spec", "collection", "overlap", "next fire", "last run"):
        table.add_column(column)
    for column in ("started", "missed", "failed"):
        table.add_column(column, justify="right")
    table.add_column("notes")
    for row in rows:
        table.add_row(
            shown(row.name),
            shown(row.spec),
            shown(row.collection or "?"),
            shown(row.overlap or "?"),
            Text("paused", style="yellow") if row.paused else shown(when(row.next) or "-"),
            _last(row),
            str(row.counts.get("started", 0)),
            Text(str(row.missed), style="red" if row.missed else ""),
            Text(str(row.counts.get("failed", 0)), style="red" if row.failing else ""),
            _notes(row),
        )
    out = console()
    out.print(table)
    for row in rows:
        if row.disagreement is not None:
            out.print(Text(f"warning: {visible(row.disagreement.message)}", style="yellow"))
    return 0


@schedules.command(epilog=EPILOG, short_help="One schedule and its recent runs.")
@click.argument("name")
@click.option(
    "--runs", type=click.IntRange(1, MAX_RUNS), default=20, help="Runs, the newest fire first."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@operations_options
def show(name: str, runs: int, as_json: bool, connection: Connection) -> int:
    """One schedule, all its document says, and its latest runs (the documents it started,
    the newest fire first), each with its phase now.

    \b
    Example:
      orchestrator schedules show nightly-report --runs 50
    """
    row, found = connection.operations().schedule(name, runs=runs)
    if as_json:
        data = {**row.to_dict(), "runs": [run.to_dict() for run in found]}
        click.echo(json.dumps(data, indent=2))
        return 0
    out = console()
    policies = (
        f"overlap {row.overlap}, catch-up {row.catch_up:g}s, jitter {row.jitter:g}s"
        + (", coalesced" if row.coalesce else "")
        if row.overlap is not None and row.catch_up is not None and row.jitter is not None
        else "policies unknown"
    )
    lines = [
        f"schedule {row.name}: {row.spec} into {row.collection or '?'}, {policies}",
        f"  declared by: {row.declared_by or '?'}" + ("; PAUSED" if row.paused else ""),
        f"  next fire: {when(row.next) or '-'} UTC; requests pending: {row.pending}",
        "  counts: " + (", ".join(f"{k} {v}" for k, v in sorted(row.counts.items())) or "none"),
        f"  last: {_last(row).plain}",
    ]
    if row.last is not None and row.last.error:
        lines.append(f"  last error: {row.last.error}")
    for line in lines:
        out.print(shown(line), soft_wrap=True)
    for field, value in row.unreadable.items():
        out.print(shown(f"  unreadable {field}: {value}"), style="red", soft_wrap=True)
    if row.disagreement is not None:
        out.print(shown(f"warning: {row.disagreement.message}"), style="yellow", soft_wrap=True)
    table = Table(title=f"runs of {visible(row.name)}, newest fire first (times UTC)")
    for column in ("fire", "document", "phase", "updated", "last error"):
        table.add_column(column)
    for run in found:
        table.add_row(
            shown(when(run.fire) or "?"),
            shown(run.to_dict()["id"]),
            shown(run.phase or "?"),
            shown(when(run.updated)),
            shown(run.error or ""),
        )
    if not found:
        table.add_row("(none)", "", "", "", "")
    out.print(table)
    return 0


@schedules.command(epilog=EPILOG, short_help="Stop a schedule's fires until resumed.")
@_acting
@operations_options
def pause(name: str, by: str | None, why: str, connection: Connection) -> int:
    """Pause a schedule: no replica starts its fires until it is resumed (runs going on
    finish). Fires missed meanwhile start on resume inside its catch-up window; older ones
    are counted missed.

    \b
    Example:
      orchestrator schedules pause nightly-report --why "month-end freeze"
    """
    operations = connection.operations()
    done = operations.pause_schedule(name, by=by, why=why)
    _said(operations, by, f"paused schedule {name}" if done else f"{name} was paused already")
    return 0


@schedules.command(epilog=EPILOG, short_help="Let a paused schedule fire again.")
@_acting
@operations_options
def resume(name: str, by: str | None, why: str, connection: Connection) -> int:
    """Resume a paused schedule.

    \b
    Example:
      orchestrator schedules resume nightly-report --why "freeze over"
    """
    operations = connection.operations()
    done = operations.resume_schedule(name, by=by, why=why)
    _said(operations, by, f"resumed schedule {name}" if done else f"{name} was not paused")
    return 0


@schedules.command(epilog=EPILOG, short_help="Start one run of a schedule now.")
@_acting
@operations_options
def trigger(name: str, by: str | None, why: str, connection: Connection) -> int:
    """Start one run now (its fire time: the server's time), whatever the overlap policy
    says, at the schedule's next step on a replica that declares it: at once, unless a
    step holds it (then at its next one).

    \b
    Example:
      orchestrator schedules trigger nightly-report --why "rerun after the fix"
    """
    operations = connection.operations()
    done = operations.trigger(name, by=by, why=why)
    when_served = (
        "its next step starts it"
        if done.woken
        else f"a step holds it: it starts at its next step (by {when(done.until) or '?'} UTC)"
    )
    _said(operations, by, f"triggered {name}: {done.run}; {when_served}")
    return 0


@schedules.command(epilog=EPILOG, short_help="Start the fire times of a past range.")
@_acting
@click.option(
    "--from", "start", metavar="ISO-TIME", required=True, callback=_moment, help="The start."
)
@click.option(
    "--to", "end", metavar="ISO-TIME", required=True, callback=_moment, help="The end (included)."
)
@operations_options
def backfill(  # noqa: PLR0917  Click passes the options by keyword
    name: str, by: str | None, why: str, start: datetime, end: datetime, connection: Connection
) -> int:
    """Start every fire time of a schedule in [--from, --to] (ISO 8601; UTC without a
    zone) that has no document yet: those that ran are not run again; each starts whatever
    the overlap policy says, as a trigger does.

    \b
    Example:
      orchestrator schedules backfill nightly-report --from 2026-03-01 --to 2026-03-07 \\
          --why "missed during the outage"
    """
    operations = connection.operations()
    done = operations.backfill(name, start, end, by=by, why=why)
    _said(
        operations,
        by,
        f"backfill of {name} asked: {done.fires} fire times from {when(done.start)} to"
        f" {when(done.end)} UTC, those without a document start at its next step",
    )
    return 0


def _said(operations: Operations, by: str | None, what: str) -> None:
    click.echo(visible(f"{what}; recorded: by {by or operations.actor}"))


def _last(row: ScheduleRow) -> Text:
    """The last fire in a line: its time, outcome, and its document's phase now."""
    last = row.last
    if last is None:
        return Text("-")
    text = f"{when(last.fire) or '?'} {last.result or '?'}"
    if last.run is not None:
        text += f" ({last.phase})" if last.exists else " (document gone)"
    return Text(visible(text), style="red" if row.failing else "")


def _notes(row: ScheduleRow) -> Text:
    notes = []
    if row.pending:
        notes.append(f"{row.pending} request(s) pending")
    if row.disagreement is not None:
        notes.append("replicas disagree")
    notes += [f"unreadable {field}" for field in row.unreadable]
    return Text(visible("; ".join(notes)), style="yellow" if notes else "")


__all__ = ["schedules"]
