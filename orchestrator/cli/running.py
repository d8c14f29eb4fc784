"""The commands that run until they end or are stopped: ``demo`` (the gateway workflow
run by several replicas, then audited), ``run`` (one replica as a standalone worker, until
SIGTERM or Ctrl-C) and ``web`` (the operator's page, until Ctrl-C)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.console import Console

from orchestrator import AsyncOrchestrator, Orchestrator, StopReport
from orchestrator.cli.connecting import DEFAULT_CONNECT_TIMEOUT, database_options
from orchestrator.cli.conventions import EPILOG, EXIT_FAILED, LOG_LEVELS, CommandError, gathered
from orchestrator.cli.loading import Engine, load_orchestrator
from orchestrator.core.names import REPLICAS_COLLECTION
from orchestrator.demo.run import DemoOptions
from orchestrator.demo.run import run as run_demo
from orchestrator.mongo import check_reachable, check_reachable_async

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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


# -- demo ------------------------------------------------------------------------------------

_DEMO = DemoOptions()


@click.command(epilog=EPILOG, short_help="Run the gateway demo with several replicas and audit it.")
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
@gathered(DemoOptions, "options", renamed={"db": "database"})
def demo(*, options: DemoOptions) -> int:
    """Provision and delete gateways with several replicas, then audit the result.

    Runs on the embedded in-memory store unless MONGODB_URI or --uri names a server.

    \b
    Example:
      orchestrator demo --gateways 300 --replicas 5 --cert-delay 2 --seed 7
    """
    options = dataclasses.replace(options, uri=options.uri or None)
    return run_demo(options, Console())


# -- run -------------------------------------------------------------------------------------


@click.command("run", epilog=EPILOG, short_help="Run one replica as a standalone worker.")
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


# -- web -------------------------------------------------------------------------------------


@click.command(epilog=EPILOG, short_help="Serve the operator's web page.")
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
@click.option(
    "--read-only",
    is_flag=True,
    help="Show everything, offer no action, and refuse every action posted (403, audited). "
    "Without it, whoever reaches the page may act.",
)
def web(**given: Any) -> int:
    """Serve the operator's page: counts per collection and phase, the live replicas, the
    latest errors, a document's lease and error, and unlock and retry (each confirmed first).

    Runs until Ctrl-C. Whoever reaches it may act, unless --read-only. To put it behind
    your application's authentication instead, mount it, saying who may act:
    app.mount("/ops", orchestrator.web.operator_app(database, permit=...)).

    \b
    Example:
      orchestrator web --uri mongodb://localhost:27017/orchestrator --port 8080
    """
    # The web extra, imported here so that its absence is named, not a traceback.
    from orchestrator.web.serve import WebOptions, serve  # noqa: PLC0415

    # Each option is a field of WebOptions (``--db`` its ``database``), made one object
    # here, where the web extra is known to be installed.
    options = WebOptions(database=given.pop("db"), **given)
    if not options.uri:
        raise CommandError("no database: set MONGODB_URI or pass --uri")
    serve(options, partial(_serving, read_only=options.read_only))
    return 0


def _serving(url: str, database: str, loopback: bool, *, read_only: bool) -> None:
    """Say where the page is, and warn when more than this machine can reach it and may
    act on it."""
    shown = " read-only" if read_only else ""
    click.echo(
        f"serving the operator's page{shown} for database {database!r} at {url} (Ctrl-C stops it)"
    )
    if not loopback and not read_only:
        click.echo(
            f"orchestrator web: warning: {url} is reachable from other machines and the page "
            "has no authentication of its own: anyone who reaches it can unlock and retry",
            err=True,
        )


__all__ = ["demo", "run_worker", "web"]
