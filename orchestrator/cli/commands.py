"""The ``orchestrator`` command: the Click group (the ``cli`` extra) of every subcommand.

Click gives what the conventions of well-liked command lines ask for with little code:
``--version``, help with defaults and environment variables shown, typed and range-checked
options (a bad value is refused before anything runs, exit status 2), and case-insensitive
choices. ``orchestrator.cli.main.main`` runs it and turns every error into one line.

The subcommands, by what they serve: ``running`` (``demo``, ``run``, ``web``); the
operators' ``status``, ``finding`` (``find``), ``history``, ``acting`` (``retry``,
``unlock``, ``cancel``), ``signalling`` (``signal``), ``pausing`` (``pause``,
``resume``), ``scheduling`` (``schedules``) and ``auditing`` (``audit``); and ``graph``.
What they share is in ``conventions``, ``connecting``, ``selecting`` (which documents)
and ``listing`` (how they are printed).
"""

from __future__ import annotations

import click

from orchestrator.cli.acting import cancel, retry, unlock
from orchestrator.cli.auditing import audit
from orchestrator.cli.conventions import CONTEXT, EPILOG
from orchestrator.cli.finding import find
from orchestrator.cli.graph import graph
from orchestrator.cli.history import history
from orchestrator.cli.pausing import pause, resume
from orchestrator.cli.running import demo, run_worker, web
from orchestrator.cli.scheduling import schedules
from orchestrator.cli.signalling import signal
from orchestrator.cli.status import status
from orchestrator.core.distribution import DISTRIBUTION


@click.group(
    context_settings=CONTEXT,
    epilog=EPILOG,
    commands=[
        demo,
        run_worker,
        status,
        find,
        history,
        retry,
        unlock,
        cancel,
        signal,
        pause,
        resume,
        schedules,
        audit,
        web,
        graph,
    ],
)
@click.version_option(
    package_name=DISTRIBUTION, prog_name="orchestrator", message="%(prog)s %(version)s"
)
def main() -> None:
    """Multi-step work on MongoDB documents, run safely by every replica.

    \b
    Examples:
      orchestrator demo
      orchestrator status --uri mongodb://localhost:27017
      orchestrator find -c invoices --state failed
      orchestrator run myapp.workers:orch
    """


__all__ = ["main"]
