"""``retry``, ``unlock`` and ``cancel``: an operator's action on one document (by its id,
business key or ``--id-json``) or on every document the browser's filters select.

Each applies only while a document is as it was read (its phase and lease; for a filter,
while it still matches), so what moved meanwhile is skipped, never acted on blindly. A
filter's action is previewed with ``--dry-run``; without ``--yes`` it shows the count and
asks on a terminal, and is refused elsewhere (a script says ``--yes``). Every action is
recorded, with who (this user at this host) and ``--why``, in the document's history and
the audit trail. A cancel reaches the documents each cancelled one owns, and theirs,
unless ``--children abandon``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from orchestrator.cli.connecting import Connection, operations_options
from orchestrator.cli.conventions import EPILOG, EXIT_FAILED, CommandError
from orchestrator.cli.listing import (
    Listing,
    console,
    described,
    document_name,
    error_cell,
    phase_cell,
)
from orchestrator.cli.selecting import Selection, row_of, selection_options, the_document
from orchestrator.core.documents import Document
from orchestrator.core.redact import visible
from orchestrator.operations import (
    MAX_CASCADE,
    Action,
    Bulk,
    Cancelled,
    Cascade,
    Children,
    DocumentChanged,
    DocumentNotFound,
    Filter,
    LeaseHeld,
    LeaseState,
    Moved,
    NoErrorPhase,
    Operations,
    Retried,
    UnhandledPhase,
    holder_name,
)

F = TypeVar("F", bound=Callable[..., Any])

SHOWN = 20
"""Documents a cancel's cascade lists (the audit trail has them all)."""

PAST = {Action.RETRY: "retried", Action.UNLOCK: "unlocked", Action.CANCEL: "cancelled"}
AFTER = {
    Action.RETRY: "attempts reset, claimable now",
    Action.UNLOCK: "claimable now",
    Action.CANCEL: "released, attempts reset",
}


def interactive() -> bool:
    """Whether an operator is there to confirm: stdin is a terminal."""
    return sys.stdin.isatty()


@dataclass(frozen=True)
class Order:
    """What the operator asked of the documents selected: ``action``, sending them ``to``
    a phase (None: the action's default), by ``force`` (a live lease taken, a phase no
    live replica handles accepted), only listed (``dry_run``), ``why``, and confirmed
    already (``yes``); a cancel's ``children``."""

    action: Action
    dry_run: bool
    why: str
    yes: bool
    to: str | None = None
    force: bool = False
    children: Children = Children.CANCEL


def _action_options(
    action: Action, phase_names: tuple[str, ...] = ("--phase",)
) -> Callable[[F], F]:
    """What every action takes: the documents (an ID, ``--id-json`` or the filters: one
    ``selection``), and ``--dry-run``, ``--why`` and ``--yes`` (with a retry's or
    cancel's ``--to`` and ``--force``: one ``order``)."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def run(*args: Any, dry_run: bool, why: str, yes: bool, **options: Any) -> Any:
            to, force = options.pop("to", None), options.pop("force", False)
            children = Children(options.pop("children", Children.CANCEL))
            order = Order(action, dry_run, why, yes, to, force, children)
            return command(*args, order=order, **options)

        decorated: Any = run
        for option in (
            operations_options,
            click.option(
                "--yes",
                "-y",
                is_flag=True,
                help="Act on what the filters select without asking (needed off a terminal).",
            ),
            click.option(
                "--why",
                metavar="REASON",
                default="",
                show_default=False,
                help="Why: recorded, with who you are, in each document's history and the "
                "audit trail.",
            ),
            click.option(
                "--dry-run",
                is_flag=True,
                help="Change nothing: list what would change, and what would be skipped and why.",
            ),
            selection_options(phase_names),
        ):
            decorated = option(decorated)
        result: F = decorated
        return result

    return decorate


@click.command(epilog=EPILOG, short_help="Send documents back to a phase, attempts reset.")
@click.option(
    "--phase",
    "--to",
    "to",
    metavar="PHASE",
    help="The phase to send them to.  [default: each document's error phase: that of its "
    "last error, else of the error before (a retried document retried again)]",
)
@click.option(
    "--force",
    is_flag=True,
    help="Take a live lease (the holder's step goes on while another replica may run it "
    "again; its writes then raise LeaseLost), and accept a phase no live replica handles "
    "(the documents sit there until one does).",
)
@_action_options(Action.RETRY, phase_names=("--from",))
def retry(*, selection: Selection, order: Order, connection: Connection) -> int:
    """Reset documents' attempts and send them back to a phase, claimable at once.

    Names one document (ID: its id as typed or its business key; or --id-json), or every
    document the filters select (as find lists them; --from is the phase they are in
    now, --phase where they go). A phase no live replica handles is refused, naming
    those they do; a document a replica holds by a live lease is refused (one) or
    skipped (a filter's). --force allows both. --state failed selects the documents
    a handler gave up on, never those the library is still retrying (--state retrying
    names those: retrying them resets their attempts).

    \b
    Examples:
      orchestrator retry INV-1003 -c invoices --why "card updated"
      orchestrator retry -c invoices --state failed --error TimeoutError --dry-run
      orchestrator retry -c invoices --from Failed --phase Charging --yes
    """
    return _carry_out(order, selection, connection)


@click.command(epilog=EPILOG, short_help="Make documents claimable at once.")
@_action_options(Action.UNLOCK)
def unlock(*, selection: Selection, order: Order, connection: Connection) -> int:
    """Release documents' leases: claimable at once, in the phase they are in (a live
    holder's later writes raise LeaseLost).

    Names one document (ID: its id as typed, an ObjectId's hex or an integer's digits
    naming that value or the string alike, or its business key; --id-json when both
    exist), or every document the filters select (as find lists them).

    \b
    Examples:
      orchestrator unlock gw-01 -c gateways
      orchestrator unlock -c gateways --state overdue --yes --why "pod-9 died"
    """
    return _carry_out(order, selection, connection)


@click.command(epilog=EPILOG, short_help="Stop documents' work: send them to the cancelled phase.")
@click.option(
    "--to",
    metavar="PHASE",
    help="Your own cancelling phase (a handler of which undoes the work), instead of the "
    "replicas' cancelled phase.  [default: their cancelled_phase setting, 'Cancelled']",
)
@click.option(
    "--force",
    is_flag=True,
    help="Accept a --to phase no live replica handles (the documents sit there until one does).",
)
@click.option(
    "--children",
    type=click.Choice([c.value for c in Children], case_sensitive=False),
    default=Children.CANCEL.value,
    help="What becomes of the documents each cancelled one owns (its children, theirs, and "
    "so on): cancel those a live replica's handler would still take up, or abandon them "
    "all as they are.",
)
@_action_options(Action.CANCEL)
def cancel(*, selection: Selection, order: Order, connection: Connection) -> int:
    """Send documents to the cancelled phase, released, attempts reset: no handler takes
    them up again.

    A step running on one is fenced as against any outside writer: it is not interrupted,
    but its lease is gone, so its next write (advance, relock, extend) raises LeaseLost
    and changes nothing. Names one document or every document the filters select, as
    retry does.

    The documents a cancelled one owns (made by its steps' create_child), and theirs in
    turn, are cancelled with it, each recorded as following its owner's cancel, unless
    in a phase no live replica handles (done with: left); --children abandon leaves
    them all. At most 10,000 are looked at, and the command says so when it stops there.

    \b
    Examples:
      orchestrator cancel INV-1003 -c invoices --why "customer withdrew"
      orchestrator cancel -c invoices --phase Charging --dry-run
      orchestrator cancel gw-1 -c gateways --children abandon --why "children adopted"
    """
    return _carry_out(order, selection, connection)


def _carry_out(order: Order, selection: Selection, connection: Connection) -> int:
    action, collection = order.action, selection.collection
    if not selection.one and not selection.filtered:
        raise click.UsageError(
            "which document? give its ID, or --id-json; or, for every document they "
            "select, filters: --state, --error, --key, FIELD=VALUE, "
            + ("--from" if action is Action.RETRY else "--phase"),
            click.get_current_context(),
        )
    operations = connection.operations(collection)
    if selection.one:
        doc = the_document(operations, collection, selection.doc_id, selection.exact)
        if not order.dry_run:
            return _one(operations, order, collection, doc)
        query = Filter(collection, fields=(("_id", doc["_id"]),))  # previewed as a filter's
    else:
        query = selection.filter(operations)
    if order.dry_run:
        _report(action, _bulk(operations, order, query, dry_run=True))
        return 0
    if not order.yes:
        if not interactive():
            raise CommandError(
                f"{action.value} of every document the filters select needs --yes (no "
                "terminal here to confirm on); --dry-run lists what it would change"
            )
        preview = _bulk(operations, order, query, dry_run=True)
        click.echo(_summary(action, preview))
        if not preview.changed:
            return 0
        count = len(preview.changed)
        if not click.confirm(f"{action.value} {_documents(count)} now?", default=False):
            click.echo("not confirmed: nothing was changed")
            return EXIT_FAILED
    _report(action, _bulk(operations, order, query, dry_run=False))
    _recorded(operations, order.why)
    return 0


def _bulk(operations: Operations, order: Order, query: Filter, *, dry_run: bool) -> Bulk:
    try:
        return operations.bulk(
            order.action,
            query,
            dry_run=dry_run,
            to=order.to,
            force=order.force,
            any_phase=order.force,
            children=order.children,
            why=order.why,
        )
    except UnhandledPhase as exc:
        raise CommandError(f"{exc}; --force sends them there all the same") from None


def _one(operations: Operations, order: Order, collection: str, doc: Document) -> int:
    action, to, force, why = order.action, order.to, order.force, order.why
    row = row_of(operations, collection, doc)
    name = document_name(collection, str(doc["_id"]), row.key if row else None)
    try:
        # Only while it is as read: a replica that claimed it meanwhile keeps its lease.
        if action is Action.UNLOCK:
            operations.unlock(collection, doc, why=why)
            click.echo(visible(f"unlocked {name} (phase {doc.get('phase')}): claimable now"))
        else:
            done: Moved
            if action is Action.RETRY:
                done = operations.retry(collection, doc, to, force=force, any_phase=force, why=why)
            else:
                done = operations.cancel(
                    collection, doc, to=to, any_phase=force, children=order.children, why=why
                )
            _said(name, doc, done)
    except LeaseHeld as held:
        raise CommandError(
            f"{name} is held by a live lease of {holder_name(held.holder)} until "
            f"{held.until:%Y-%m-%d %H:%M:%S} UTC: a retry now lets another replica "
            "run its step while that one is still in it; wait for the lease to end, or pass "
            "--force"
        ) from None
    except UnhandledPhase as exc:
        raise CommandError(f"{exc}; --force sends it there all the same") from None
    except NoErrorPhase as exc:
        raise CommandError(f"{exc}: pass --phase") from None
    except (DocumentChanged, DocumentNotFound):
        raise CommandError(f"{name} changed meanwhile; run {action.value} again") from None
    _recorded(operations, why)
    return 0


def _recorded(operations: Operations, why: str) -> None:
    click.echo(
        visible(f"recorded: by {operations.actor}") + (visible(f", why: {why}") if why else "")
    )


def _said(name: str, doc: Document, done: Moved) -> None:
    """What a retry or a cancel of one document did, said as what it is."""
    if not done.server_time:
        click.echo(
            f"orchestrator {done.action.value}: warning: the server reports no time; "
            "updatedAt is stamped with this machine's clock",
            err=True,
        )
    holder = doc.get("lockedBy")
    if isinstance(done, Retried):
        text = f"retrying {name}: {done.source} -> {done.target}, attempts reset, claimable now" + (
            f" (the live lease of {holder!r} was taken away)" if done.lease_taken else ""
        )
    else:
        text = f"cancelled {name}: {done.source} -> {done.target}, released, attempts reset" + (
            f"; replica {holder!r} was running a step on it, whose next write raises LeaseLost"
            if done.lease_taken
            else ""
        )
    click.echo(visible(text))
    if isinstance(done, Cancelled):
        _cascaded(done.cascade)


def _cascaded(cascade: Cascade) -> None:
    """What a cancel did to the documents the cancelled ones own."""
    if cascade.policy is Children.ABANDON:
        click.echo("the documents it owns, if any, are left as they are (--children abandon)")
        return
    for title, met, phase in (
        ("also cancelled, as owned by what was cancelled:", cascade.cancelled, "was"),
        ("left as they are (done with, or moving on each try):", cascade.left, "in"),
    ):
        if met:
            click.echo(title)
            for d in met[:SHOWN]:
                owned = f"  {d.collection}/{d.id} (owned by {d.owner})"
                click.echo(visible(f"{owned}, {phase} {d.phase}"))
            if len(met) > SHOWN:
                click.echo(f"  and {len(met) - SHOWN} more (the audit trail lists them)")
    if cascade.cut:
        click.echo(
            f"orchestrator cancel: warning: it stopped at {MAX_CASCADE} documents owned; "
            "those past them are not cancelled: cancel them with filters",
            err=True,
        )


def _report(action: Action, result: Bulk) -> None:
    """What a filter's action did (or would do): the documents, from and to where, the
    leases taken; those skipped, and why."""
    out = console()
    click.echo(_summary(action, result))
    if result.changed:
        listing = Listing(
            title="would change:" if result.dry_run else "changed:",
            headers=("phase, lease as read", "last error"),
        )
        for row in result.changed:
            to = result.target_of(row)
            moved = (row.phase or "") if to == row.phase else f"{row.phase} -> {to}"
            moved_row, lease, attempts = phase_cell(row, moved)
            if row.state is LeaseState.LEASED:  # a retry's only with --force
                lease += ": to be taken" if result.dry_run else ": taken"
            listing.add_row(row, (moved_row, lease, attempts), error_cell(row))
        listing.print(out)
    if result.skipped:
        skipped = Listing(
            title="would skip:" if result.dry_run else "skipped:", headers=("phase", "why")
        )
        for left in result.skipped:
            skipped.add_row(left.row, left.row.phase or "", left.why)
        skipped.print(out)
    if action is Action.CANCEL and not result.dry_run and result.changed:
        _cascaded(result.cascade)


def _summary(action: Action, result: Bulk) -> str:
    verb = f"would {action.value}" if result.dry_run else PAST[action]
    moves: dict[str, int] = {}
    for row in result.changed:
        to = result.target_of(row)
        move = f"{row.phase} -> {to}" if to != row.phase else f"in {row.phase}"
        moves[move] = moves.get(move, 0) + 1
    taken = sum(1 for row in result.changed if row.state is LeaseState.LEASED)
    text = f"{verb} {_documents(len(result.changed))} of {described(result.filter)}"
    if moves:
        text += ": " + "; ".join(f"{move}: {n}" for move, n in moves.items())
    if result.changed and not result.dry_run:
        text += f"; {AFTER[action]}"
    if taken:
        text += f"; {taken} live lease(s) {'to be ' if result.dry_run else ''}taken"
        text += " (the steps holding them: their next writes raise LeaseLost)"
    if result.skipped:
        text += f"; {len(result.skipped)} skipped"
    return visible(text)


def _documents(count: int) -> str:
    return f"{count} document" + ("" if count == 1 else "s")


__all__ = ["cancel", "interactive", "retry", "unlock"]
