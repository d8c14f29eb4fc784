"""``orchestrator pause`` and ``resume``: a collection, a phase of it or one handler,
paused on every replica. Each replica reads the pauses at its heartbeat, so a pause takes
hold within one heartbeat interval everywhere (running steps finish; nothing new of it
is claimed), and each publishes the pauses it honours (``status`` shows which)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG, CommandError
from orchestrator.cli.selecting import collection_option
from orchestrator.core.redact import visible
from orchestrator.core.replicas import MAX_REFRESH, ReplicaRecord, refresh_interval
from orchestrator.operations import Scope, UnhandledScope

F = TypeVar("F", bound=Callable[..., Any])


def _scope_options(command: F) -> F:
    command = click.option(
        "--handler",
        metavar="MODULE:FUNCTION",
        help="Only this handler (its name as status and find show it).",
    )(command)
    command = click.option("--phase", metavar="PHASE", help="Only this phase's handlers.")(command)
    result: F = collection_option("The collection whose work to pause.")(command)
    return result


@click.command(epilog=EPILOG, short_help="Stop every replica claiming a collection's work.")
@_scope_options
@click.option("--why", metavar="REASON", required=True, help="Why: recorded, and shown by status.")
@click.option(
    "--force",
    is_flag=True,
    help="Pause what no live replica has (a collection, phase or handler): it holds for "
    "replicas started later.",
)
@operations_options
def pause(
    *,
    collection: str,
    phase: str | None,
    handler: str | None,
    why: str,
    force: bool,
    connection: Connection,
) -> int:
    """Pause a collection's work, one phase of it, or one handler, on every replica.

    Each replica reads the pauses at its heartbeat: within one heartbeat interval (its
    lock timeout / 6, at most 10 s) none claims anything the pause covers. Steps already
    running finish. status shows the pauses, who paused and why, and which live replicas
    honour each; resume ends one.

    A collection, phase or handler no live replica has (a typo, most likely) is refused,
    naming what they have; --force pauses it all the same (it holds for replicas started
    later).

    \b
    Example:
      orchestrator pause -c invoices --phase Charging --why "bank maintenance until 14:00"
    """
    scope = Scope(collection, phase, handler)
    operations = connection.operations(collection)
    live = operations.replicas()
    try:
        done = operations.pause(scope, force=force, why=why)
    except UnhandledScope as exc:
        raise CommandError(f"{exc}; --force pauses it all the same") from None
    if not done:
        [held] = [p for p in operations.pauses() if p.scope == scope]
        since = f" since {held.at:%Y-%m-%d %H:%M:%S} UTC" if held.at else ""
        click.echo(visible(f"{scope.describe()} was paused already, by {held.by}{since}"))
        return 0
    click.echo(
        visible(f"paused {scope.describe()}, by {operations.actor}, why: {why}")
        + f"; every replica stops claiming it within {_interval(live)}, running steps finish"
    )
    return 0


@click.command(epilog=EPILOG, short_help="End a pause: the replicas claim its work again.")
@_scope_options
@click.option("--why", metavar="REASON", default="", show_default=False, help="Why: recorded.")
@operations_options
def resume(
    collection: str, phase: str | None, handler: str | None, why: str, connection: Connection
) -> int:
    """End the pause of a collection, phase or handler (named as it was paused): every
    replica claims its work again within one heartbeat interval.

    \b
    Example:
      orchestrator resume -c invoices --phase Charging
    """
    scope = Scope(collection, phase, handler)
    operations = connection.operations()
    if not operations.resume(scope, why=why):
        paused = "; ".join(p.scope.describe() for p in operations.pauses()) or "none"
        raise CommandError(
            f"{scope.describe()} is not paused (a pause is resumed as it was paused: "
            f"collection, phase and handler alike); the pauses in force: {paused}"
        )
    click.echo(
        visible(f"resumed {scope.describe()}, by {operations.actor}")
        + f"; every replica claims its work again within {_interval(operations.replicas())}"
    )
    return 0


def _interval(live: list[ReplicaRecord]) -> str:
    """One heartbeat interval of the slowest live replica."""
    if not live:
        return f"one heartbeat interval (at most {MAX_REFRESH:g}s; no replica is live now)"
    slowest = max(refresh_interval(r.lock_timeout) for r in live)
    return f"one heartbeat interval ({slowest:g}s on the live replicas)"


__all__ = ["pause", "resume"]
