"""What every subcommand of ``orchestrator`` shares, so that they agree: the exit statuses
and the error that means 2, the epilog that documents them with the environment, the help's
settings and the log levels. It imports no optional module: ``main`` reads it before Click
is known to be installed."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILED = 1  # the command ran and found something wrong (demo invariants), or not confirmed
EXIT_ERROR = 2  # the command could not run: bad input, unreachable database
EXIT_INTERRUPTED = 130

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

EPILOG = """\b
Environment:
  MONGODB_URI  the server's URI, when --uri is not given (the operators' commands
               and web; demo: a real server instead of the in-memory store)
\b
Exit status:
  0    success
  1    the command ran and found something wrong (a demo invariant failed,
       a worker stopped with steps still running), or an action on the
       documents a filter selects was not confirmed
  2    bad input or an unreachable database: one line on stderr, never a traceback
  130  interrupted (Ctrl-C)
"""

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 100}


class CommandError(Exception):
    """Bad input: printed as one line, exit status 2."""


def gathered(
    into: type[Any], name: str, renamed: Mapping[str, str] | None = None
) -> Callable[[F], F]:
    """Give ``command`` its options that are fields of the dataclass ``into`` (an option
    ``renamed`` to its field's name) as one ``into`` named ``name``: a command's settings
    reach it as the object they make, not as a parameter each. Innermost of the
    command's decorators, so that the options are declared on what it returns."""
    names = {field.name for field in dataclasses.fields(into)}
    renames = dict(renamed or {})

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def run(*args: Any, **options: Any) -> Any:
            given = {
                renames.get(option, option): options.pop(option)
                for option in list(options)
                if renames.get(option, option) in names
            }
            return command(*args, **{name: into(**given)}, **options)

        return cast(F, run)

    return decorate


__all__ = [
    "CONTEXT",
    "EPILOG",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "LOG_LEVELS",
    "CommandError",
    "gathered",
]
