"""The ``orchestrator`` command's entry point: the demo, a standalone worker, operators' tools.

It runs the Click commands of ``orchestrator.cli.commands`` and turns every failure an
operator can cause (a bad option, a wrong ``module:attribute``, an unreachable or
malformed URI, an unknown collection or document, an extra not installed) into one line on
stderr and exit status 2, never a traceback; URIs are printed with their password masked.
It imports no optional module itself, so a missing extra is named, not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from orchestrator.cli.conventions import EXIT_ERROR, EXIT_INTERRUPTED, CommandError
from orchestrator.core.distribution import EXTRA_OF_MODULE, install_hint
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.redact import redact, visible


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; the exit status (see ``orchestrator --help``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        extra = EXTRA_OF_MODULE.get(missing)
        if extra is None:
            raise
        if "demo" in args:
            extra = "demo"  # the command line and the in-memory store at once
        _error(
            "orchestrator",
            f"this command needs the '{extra}' extra (no module named {missing!r}): "
            f"{install_hint(extra)}",
        )
        return EXIT_ERROR


def _run(args: list[str]) -> int:
    import click  # noqa: PLC0415  (the cli extra: imported here so its absence is named)

    from orchestrator.cli import commands  # noqa: PLC0415

    where = "orchestrator"
    if args and args[0] in commands.main.commands:
        where = f"orchestrator {args[0]}"
    try:
        result = commands.main.main(args, prog_name="orchestrator", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        return EXIT_ERROR
    except click.UsageError as exc:
        path = exc.ctx.command_path if exc.ctx else where
        _error(path, f"{exc.format_message()} (see {path} --help)")
        return EXIT_ERROR
    except click.ClickException as exc:
        _error(where, exc.format_message())
        return exc.exit_code
    except (CommandError, OrchestratorError) as exc:
        _error(where, str(exc))
        return EXIT_ERROR
    except (click.Abort, KeyboardInterrupt):
        print(f"{where}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else 0


def _error(where: str, message: str) -> None:
    one_line = visible(" ".join(redact(message).split()))  # whatever the driver said
    print(f"{where}: error: {one_line}", file=sys.stderr)


__all__ = ["main"]
