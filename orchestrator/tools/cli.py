"""The ``orchestrator`` command: the demo, a standalone worker, and operators' tools.

Every failure an operator can cause (a wrong ``module:attribute``, an unreachable or
malformed URI, an unknown collection or document) ends in one line on stderr and a
non-zero exit status, never a traceback; URIs are printed with their password masked.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from types import FrameType
from typing import Any

from pymongo.database import Database

from orchestrator.core import queries
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.extras import DISTRIBUTION, EXTRA_OF_MODULE, install_hint
from orchestrator.core.redact import redact
from orchestrator.mongo import Store, connect
from orchestrator.mongo.common import Document
from orchestrator.runners.threaded import Orchestrator
from orchestrator.tools.graph import mermaid
from orchestrator.tools.status import collect

EXIT_FAILED = 1  # the command ran and found something wrong (demo invariants)
EXIT_ERROR = 2  # the command could not run: bad input, unreachable database


class CommandError(Exception):
    """Bad input: printed as one line, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """The command; an extra that is not installed is named in one line, exit status 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        return _main(args)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        extra = EXTRA_OF_MODULE.get(missing)
        if extra is None:
            raise
        if "demo" in args:
            extra = "demo"  # the command line and the in-memory store at once
        print(
            f"orchestrator: error: this command needs the '{extra}' extra "
            f"(no module named {missing!r}): {install_hint(extra)}",
            file=sys.stderr,
        )
        return EXIT_ERROR


def _main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except (CommandError, OrchestratorError) as exc:
        message = " ".join(redact(str(exc)).split())  # one line, whatever the driver said
        print(f"orchestrator {args.command}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"orchestrator {args.command}: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    # The demo and the tables need the extras: imported when a command runs (see main).
    from orchestrator.tools.demo import DemoOptions  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Multi-step work on MongoDB documents, run safely by every replica.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version(DISTRIBUTION)}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="provision and delete gateways with three replicas, then audit the result",
        description="Runs on the embedded in-memory store unless MONGODB_URI or --uri is given.",
    )
    defaults = DemoOptions()
    demo.add_argument("--gateways", type=int, default=defaults.gateways)
    demo.add_argument("--replicas", type=int, default=defaults.replicas)
    demo.add_argument(
        "--processes",
        type=int,
        default=defaults.processes,
        metavar="N",
        help="run the replicas as N OS processes instead of --replicas threads "
        "(needs MONGODB_URI or --uri)",
    )
    demo.add_argument("--delete-fraction", type=float, default=defaults.delete_fraction)
    demo.add_argument(
        "--cert-delay",
        type=float,
        default=defaults.cert_delay,
        help="seconds before a certificate is Ready (default %(default)s)",
    )
    demo.add_argument(
        "--fail-rate",
        type=float,
        default=defaults.fail_rate,
        help="share of service calls that fail and are retried (default %(default)s)",
    )
    demo.add_argument("--seed", type=int, default=defaults.seed)
    demo.add_argument("--timeout", type=float, default=defaults.timeout, help="per stage, s")
    demo.add_argument("--log-file", type=Path, help="write the replicas' logs here")
    _database_options(demo, default_db=defaults.database)
    demo.set_defaults(func=_demo)

    run = commands.add_parser(
        "run",
        help="run one replica as a standalone worker until SIGTERM or SIGINT",
    )
    run.add_argument("target", help="module:attribute, an Orchestrator or a function making one")
    run.add_argument(
        "--stop-timeout", type=float, default=10.0, help="seconds to let running steps finish"
    )
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    run.set_defaults(func=_run)

    status = commands.add_parser(
        "status", help="documents per collection and phase: leased, overdue, failed, errors"
    )
    _database_options(status)
    status.add_argument("--collection", "-c", action="append", help="only this (repeatable)")
    status.add_argument("--errors", type=int, default=5, help="latest errors per collection")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    unlock = commands.add_parser("unlock", help="make a document claimable at once")
    unlock.add_argument("id", help="the document's _id")
    unlock.add_argument("--collection", "-c", required=True)
    _database_options(unlock)
    unlock.set_defaults(func=_unlock)

    retry = commands.add_parser(
        "retry", help="reset a document's attempts and send it back to a phase"
    )
    retry.add_argument("id", help="the document's _id")
    retry.add_argument("--collection", "-c", required=True)
    retry.add_argument("--phase", help="default: the phase its last error happened in")
    _database_options(retry)
    retry.set_defaults(func=_retry)

    graph = commands.add_parser("graph", help="the registered phases as a Mermaid diagram")
    graph.add_argument("target", help="module:attribute, an Orchestrator or a function making one")
    graph.set_defaults(func=_graph)
    return parser


def _database_options(parser: argparse.ArgumentParser, default_db: str | None = None) -> None:
    parser.add_argument("--uri", help="MongoDB URI (default: $MONGODB_URI)")
    parser.add_argument(
        "--db",
        default=default_db,
        help="database name (default: the URI's, else 'orchestrator')"
        if default_db is None
        else "database name (default: %(default)s)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        help="seconds to reach the server before giving up (default %(default)s)",
    )


# -- commands -------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console  # noqa: PLC0415

    from orchestrator.tools.demo import DemoOptions  # noqa: PLC0415
    from orchestrator.tools.demo import run as run_demo  # noqa: PLC0415

    options = DemoOptions(
        gateways=args.gateways,
        replicas=args.replicas,
        delete_fraction=args.delete_fraction,
        cert_delay=args.cert_delay,
        fail_rate=args.fail_rate,
        seed=args.seed,
        uri=args.uri or os.environ.get("MONGODB_URI") or None,
        database=args.db,
        timeout=args.timeout,
        log_file=args.log_file,
        processes=args.processes,
    )
    return run_demo(options, Console())


def _run(args: argparse.Namespace) -> int:
    orch = load_orchestrator(args.target)
    if not orch.handlers:
        raise CommandError(f"{args.target} has no handlers registered: nothing to run")
    to_stderr = logging.StreamHandler()
    to_stderr.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s replica=%(replica)s %(message)s",
            defaults={"replica": orch.replica_id},
        )
    )
    logging.basicConfig(level=args.log_level, handlers=[to_stderr])
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        orch.request_stop()  # safe in a signal handler: sets two events
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        orch.start()
        print(
            f"replica {orch.replica_id} running {len(orch.handlers)} handlers; "
            "SIGTERM or Ctrl-C stops it",
            flush=True,
        )
        while not stop.wait(1.0):
            pass
        report = orch.stop(args.stop_timeout)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(
        f"replica {orch.replica_id} stopped: {len(report.released)} unstarted lease(s) "
        f"handed back, {len(report.still_running)} step(s) still running",
        flush=True,
    )
    return 0 if not report.still_running else EXIT_FAILED


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    db = open_database(args)
    status = collect(db, collections=args.collection, errors=args.errors)
    if args.json:
        print(json.dumps(status.to_dict(), indent=2))
        return 0
    console = Console()
    table = Table(title=f"{db.name} at {status.at:%Y-%m-%d %H:%M:%S} UTC")
    for column in ("collection", "phase", "documents", "leased now", "overdue", "waiting"):
        table.add_column(column, justify="left" if column in {"collection", "phase"} else "right")
    table.add_column("failed", justify="right")
    for row in status.phases:
        table.add_row(
            row.collection,
            row.phase,
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
                error.collection,
                error.id,
                error.phase or "",
                str(error.attempts),
                at,
                f"{error.type}: {error.message}"[:200],
            )
        console.print(errors)
    return 0


def _warn(value: int) -> str:
    return f"[red]{value}[/]" if value else "0"


def _unlock(args: argparse.Namespace) -> int:
    store = _operator_store(args)
    doc = store.operator_update(
        args.collection, queries.id_filter(args.id), queries.release_update()
    )
    if doc is None:
        raise CommandError(f"no document {args.id!r} in collection {args.collection!r}")
    print(f"unlocked {args.collection}/{doc['_id']} (phase {doc.get('phase')}): claimable now")
    return 0


def _retry(args: argparse.Namespace) -> int:
    store = _operator_store(args)
    query = queries.id_filter(args.id)
    doc = store.find_one(args.collection, query)
    if doc is None:
        raise CommandError(f"no document {args.id!r} in collection {args.collection!r}")
    phase = args.phase
    if phase is None:
        error = doc.get("lastError")
        phase = error.get("phase") if isinstance(error, dict) else None
        if not isinstance(phase, str) or not phase:
            raise CommandError(
                f"{args.collection}/{doc['_id']} has no recorded error phase; pass --phase"
            )
    if phase.startswith("$"):
        raise CommandError(f"{phase!r} is not a phase name")
    # updatedAt starts the phase's clock for the replicas' backoff: the server's time, as
    # every lease time is, not this machine's.
    now = store.server_time()
    if now is None:
        now = datetime.now(UTC)
        print(
            "orchestrator retry: warning: the server reports no time; "
            "updatedAt is stamped with this machine's clock",
            file=sys.stderr,
        )
    # Only if nobody moved it meanwhile: the phase read above is still the phase.
    guarded = {"_id": doc["_id"], "phase": doc.get("phase")}
    updated = store.operator_update(
        args.collection, guarded, queries.operator_retry_update(phase, now)
    )
    if updated is None:
        raise CommandError(f"{args.collection}/{doc['_id']} changed meanwhile; run retry again")
    print(
        f"retrying {args.collection}/{doc['_id']}: {doc.get('phase')} -> {phase}, "
        "attempts reset, claimable now"
    )
    return 0


def _graph(args: argparse.Namespace) -> int:
    orch = load_orchestrator(args.target)
    if not orch.handlers:
        raise CommandError(f"{args.target} has no handlers registered")
    print(mermaid(orch.handlers), end="")
    return 0


# -- helpers --------------------------------------------------------------------------------


def open_database(args: argparse.Namespace) -> Database[Document]:
    """The database named by ``--uri``/``$MONGODB_URI`` and ``--db``, reachable now."""
    uri = args.uri or os.environ.get("MONGODB_URI")
    if not uri:
        raise CommandError("no database: set MONGODB_URI or pass --uri")
    return connect(uri, args.db, timeout=args.connect_timeout)


def _operator_store(args: argparse.Namespace) -> Store:
    db = open_database(args)
    store = Store(db)
    if args.collection not in store.collection_names():
        raise CommandError(f"unknown collection {args.collection!r} in database {db.name!r}")
    return store


def load_orchestrator(target: str) -> Orchestrator:
    """``module:attribute``: an Orchestrator, or a function of no arguments returning one.

    The current directory is importable, as with ``python -m``.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise CommandError(f"expected module:attribute (e.g. myapp.workers:orch), not {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CommandError(
                f"cannot import {module_name!r}: no module named {exc.name!r}"
            ) from None
        raise CommandError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CommandError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise CommandError(f"module {module_name!r} has no attribute {attribute!r}")
        value = getattr(value, part)
    if not isinstance(value, Orchestrator) and callable(value):
        try:
            value = value()
        except OrchestratorError:
            raise
        except Exception as exc:
            raise CommandError(f"{target}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, Orchestrator):
        raise CommandError(f"{target} is a {type(value).__name__}, not an Orchestrator")
    return value


__all__ = ["CommandError", "load_orchestrator", "main"]
