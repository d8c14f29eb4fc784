"""The ``orchestrator`` command's subcommands, on Click (the ``cli`` extra).

Click gives what the conventions of well-liked command lines ask for with little code:
``--version``, help with defaults and environment variables shown, typed and range-checked
options (a bad value is refused before anything runs, exit status 2), and case-insensitive
choices. ``orchestrator.cli.main.main`` runs it and turns every error into one line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import signal
import threading
import warnings
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import click
from pymongo.database import Database
from pymongo.errors import ConfigurationError, InvalidURI
from pymongo.uri_parser import parse_uri
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator import AsyncOrchestrator, Orchestrator, StopReport
from orchestrator.cli.graph import mermaid
from orchestrator.cli.loading import CommandError, Engine, load_orchestrator
from orchestrator.core.extras import DISTRIBUTION
from orchestrator.core.redact import redact, visible
from orchestrator.core.replicas import REPLICAS_COLLECTION, ReplicaRecord
from orchestrator.core.settings import DEFAULT_DATABASE
from orchestrator.demo.run import DemoOptions
from orchestrator.demo.run import run as run_demo
from orchestrator.mongo import check_reachable, check_reachable_async, connect
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

EXIT_FAILED = 1  # the command ran and found something wrong (demo invariants)
EXIT_ERROR = 2  # the command could not run: bad input, unreachable database

DEFAULT_CONNECT_TIMEOUT = 5.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

EPILOG = """\b
Environment:
  MONGODB_URI  the server's URI, when --uri is not given (status, unlock, retry,
               web; demo: a real server instead of the in-memory store)
\b
Exit status:
  0    success
  1    the command ran and found something wrong (a demo invariant failed,
       a worker stopped with steps still running)
  2    bad input or an unreachable database: one line on stderr, never a traceback
  130  interrupted (Ctrl-C)
"""

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 100}


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


def _check_log_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A log file whose directory is missing is an input error, not a traceback later."""
    if value is None:
        return None
    parent = value.parent
    if not parent.is_dir():
        raise click.BadParameter(f"{value}: directory {str(parent)!r} does not exist")
    if value.is_dir():
        raise click.BadParameter(f"{value} is a directory")
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


@click.group(context_settings=CONTEXT, epilog=EPILOG)
@click.version_option(
    package_name=DISTRIBUTION, prog_name="orchestrator", message="%(prog)s %(version)s"
)
def main() -> None:
    """Multi-step work on MongoDB documents, run safely by every replica.

    \b
    Examples:
      orchestrator demo
      orchestrator status --uri mongodb://localhost:27017
      orchestrator run myapp.workers:orch
    """


# -- demo ------------------------------------------------------------------------------------

_DEMO = DemoOptions()


@main.command(epilog=EPILOG, short_help="Run the gateway demo with several replicas and audit it.")
@click.option(
    "--gateways", type=click.IntRange(min=1), default=_DEMO.gateways, help="Gateways to create."
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 32),
    default=_DEMO.replicas,
    help="Replicas, as AsyncOrchestrators on this process's event loop.",
)
@click.option(
    "--processes",
    type=click.IntRange(0, 32),
    default=_DEMO.processes,
    metavar="N",
    help="Run the replicas as N OS processes instead (needs a real server); 0: tasks here.",
)
@click.option(
    "--delete-fraction",
    type=click.FloatRange(0, 1),
    default=_DEMO.delete_fraction,
    help="Share of the gateways deleted once provisioned.",
)
@click.option(
    "--cert-delay",
    type=click.FloatRange(min=0),
    default=_DEMO.cert_delay,
    help="Seconds before a certificate is Ready.",
)
@click.option(
    "--fail-rate",
    type=click.FloatRange(0, 0.5, max_open=True),
    default=_DEMO.fail_rate,
    help="Share of service calls that fail and are retried.",
)
@click.option("--seed", type=int, default=_DEMO.seed, help="Seed of the faults and deletions.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEMO.timeout,
    help="Seconds for the whole run, setup included; then it stops and reports.",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_check_log_file,
    help="Write the replicas' logs here.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="Serve the replicas' Prometheus metrics at http://127.0.0.1:PORT/metrics during "
    "the run (0: a free port, printed).",
)
@database_options(default_db=_DEMO.database)
def demo(
    gateways: int,
    replicas: int,
    processes: int,
    delete_fraction: float,
    cert_delay: float,
    fail_rate: float,
    seed: int,
    timeout: float,
    log_file: Path | None,
    metrics_port: int | None,
    uri: str | None,
    db: str,
    connect_timeout: float,
) -> int:
    """Provision and delete gateways with several replicas, then audit the result.

    Runs on the embedded in-memory store unless MONGODB_URI or --uri names a server.

    \b
    Example:
      orchestrator demo --gateways 300 --replicas 5 --cert-delay 2 --seed 7
    """
    options = DemoOptions(
        gateways=gateways,
        replicas=replicas,
        delete_fraction=delete_fraction,
        cert_delay=cert_delay,
        fail_rate=fail_rate,
        seed=seed,
        uri=uri or None,
        database=db,
        timeout=timeout,
        log_file=log_file,
        processes=processes,
        connect_timeout=connect_timeout,
        metrics_port=metrics_port,
    )
    return run_demo(options, Console())


# -- run -------------------------------------------------------------------------------------


@main.command("run", epilog=EPILOG, short_help="Run one replica as a standalone worker.")
@click.argument("target")
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0),
    default=10.0,
    help="Seconds to let running steps finish on SIGTERM or Ctrl-C.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO",
    help="The orchestrator's log level (the scheduler's own INFO lines only at DEBUG).",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0, min_open=True, max=300),
    default=DEFAULT_CONNECT_TIMEOUT,
    help="Seconds to reach the target's server before giving up with the reason.",
)
def run_worker(target: str, stop_timeout: float, log_level: str, connect_timeout: float) -> int:
    """Run one replica as a standalone worker until SIGTERM or Ctrl-C.

    TARGET is module:attribute, an Orchestrator or AsyncOrchestrator, or a function of no
    arguments returning one; the current directory is importable. An AsyncOrchestrator
    runs on an event loop of its own (asyncio.run).

    \b
    Example:
      orchestrator run myapp.workers:orch --log-level debug
    """
    orch = load_orchestrator(target)
    if not orch.handlers:
        raise CommandError(f"{target} has no handlers registered: nothing to run")
    level = log_level.upper()
    to_stderr = logging.StreamHandler()
    to_stderr.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s replica=%(replica)s %(message)s",
            defaults={"replica": orch.replica_id},
        )
    )
    logging.basicConfig(level=level, handlers=[to_stderr])
    # APScheduler logs every job run at INFO: chatter about the orchestrator's own tick.
    logging.getLogger("apscheduler").setLevel(logging.DEBUG if level == "DEBUG" else "WARNING")
    if isinstance(orch, AsyncOrchestrator):
        report = asyncio.run(_serve_async(orch, stop_timeout, connect_timeout))
    else:
        report = _serve_threaded(orch, stop_timeout, connect_timeout)
    click.echo(
        f"replica {orch.replica_id} stopped: {len(report.released)} unstarted lease(s) "
        f"handed back, {len(report.still_running)} step(s) still running"
    )
    return 0 if not report.still_running else EXIT_FAILED


def _running(orch: Engine) -> None:
    click.echo(
        f"replica {orch.replica_id} running {len(orch.handlers)} handlers; "
        "SIGTERM or Ctrl-C stops it"
    )


def _serve_threaded(orch: Orchestrator, stop_timeout: float, connect_timeout: float) -> StopReport:
    """Until SIGTERM or SIGINT, which only set events (all a signal handler may do)."""
    check_reachable(orch.db, connect_timeout)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        orch.request_stop()  # safe in a signal handler: sets two events
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        orch.start()
        _running(orch)
        while not stop.wait(1.0):
            pass
        return orch.stop(stop_timeout)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _serve_async(
    orch: AsyncOrchestrator, stop_timeout: float, connect_timeout: float
) -> StopReport:
    """Until SIGTERM or SIGINT, received by the loop itself (``add_signal_handler``), so
    the stop runs on the loop the orchestrator's tasks run on. A step still running after
    the stop timeout is cancelled when ``asyncio.run`` ends (an ``async def`` step) or
    left on its daemon thread (a ``def`` step); either way its lease is left to expire."""
    await check_reachable_async(orch.db, connect_timeout)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        await orch.start()
        _running(orch)
        await stop.wait()
        return await orch.stop(stop_timeout)
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


# -- status, unlock, retry -------------------------------------------------------------------


@main.command(epilog=EPILOG, short_help="Documents per collection and phase, and latest errors.")
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


@main.command(epilog=EPILOG, short_help="Make a document claimable at once.")
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


@main.command(epilog=EPILOG, short_help="Reset a document's attempts and send it back to a phase.")
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


# -- web -------------------------------------------------------------------------------------


@main.command(epilog=EPILOG, short_help="Serve the operator's web page.")
@database_options(default_db=None)
@click.option(
    "--host",
    default="127.0.0.1",
    help="Address to listen on. The page has no authentication of its own: keep it on "
    "loopback, or mount orchestrator.web.operator_app in an app that authenticates.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, help="Port; 0: any free port.")
@click.option(
    "--refresh",
    type=click.FloatRange(1, 3600),
    default=5.0,
    help="Seconds between the page's reloads of itself.",
)
@click.option(
    "--errors", type=click.IntRange(0, 1000), default=10, help="Latest errors per collection."
)
@click.option(
    "--replicas-collection",
    default=REPLICAS_COLLECTION,
    help="Where the replicas record themselves (their replicas_collection setting).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="WARNING",
    help="The web server's log level (each request logged at DEBUG).",
)
def web(
    uri: str | None,
    db: str | None,
    connect_timeout: float,
    host: str,
    port: int,
    refresh: float,
    errors: int,
    replicas_collection: str,
    log_level: str,
) -> int:
    """Serve the operator's page: counts per collection and phase, the live replicas, the
    latest errors, a document's lease and error, and unlock and retry (each confirmed first).

    Runs until Ctrl-C. To put it behind your application's authentication instead, mount
    it: app.mount("/ops", orchestrator.web.operator_app(database)).

    \b
    Example:
      orchestrator web --uri mongodb://localhost:27017/orchestrator --port 8080
    """
    # The web extra, imported here so that its absence is named, not a traceback.
    from orchestrator.web.serve import WebOptions, serve  # noqa: PLC0415

    if not uri:
        raise CommandError("no database: set MONGODB_URI or pass --uri")
    options = WebOptions(
        uri=uri,
        database=db,
        host=host,
        port=port,
        connect_timeout=connect_timeout,
        refresh=refresh,
        errors=errors,
        replicas_collection=replicas_collection,
        log_level=log_level,
    )
    serve(options, _serving)
    return 0


def _serving(url: str, database: str, loopback: bool) -> None:
    """Say where the page is, and warn when more than this machine can reach it."""
    click.echo(f"serving the operator's page for database {database!r} at {url} (Ctrl-C stops it)")
    if not loopback:
        click.echo(
            f"orchestrator web: warning: {url} is reachable from other machines and the page "
            "has no authentication of its own: anyone who reaches it can unlock and retry",
            err=True,
        )


# -- graph -----------------------------------------------------------------------------------


@main.command(epilog=EPILOG, short_help="The registered phases as a Mermaid diagram.")
@click.argument("target")
def graph(target: str) -> int:
    """The registered phases and transitions as a Mermaid stateDiagram-v2.

    TARGET is module:attribute, an Orchestrator or AsyncOrchestrator, or a function of no
    arguments returning one.

    \b
    Example:
      orchestrator graph myapp.workers:orch > phases.mmd
    """
    orch = load_orchestrator(target)
    if not orch.handlers:
        raise CommandError(f"{target} has no handlers registered")
    click.echo(mermaid(orch.handlers), nl=False)
    return 0


# -- helpers ---------------------------------------------------------------------------------


def open_database(uri: str | None, db: str | None, timeout: float) -> Database[Document]:
    """The database named by ``--uri``/``$MONGODB_URI`` and ``--db``, reachable now."""
    if not uri:
        raise CommandError("no database: set MONGODB_URI or pass --uri")
    return connect(uri, db, timeout=timeout)


def _operations(uri: str | None, db: str | None, timeout: float, collection: str) -> Operations:
    database = open_database(uri, db, timeout)
    operations = Operations(database)
    if collection not in operations.collections():
        raise CommandError(f"unknown collection {collection!r} in database {database.name!r}")
    return operations


__all__ = ["EXIT_ERROR", "EXIT_FAILED", "main", "open_database"]
