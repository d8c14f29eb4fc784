"""``python -m orchestrator.demo.chaos``: many replicas, many faults, then the invariants.

The command line: the run's size, seed and fault rate; its figures as a table or JSON;
exit status 1 when an invariant fails.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from orchestrator.demo.chaos.harness import Chaos
from orchestrator.demo.chaos.invariants import Figures
from orchestrator.demo.chaos.workload import ChaosConfig


def _table(figures: Figures, config: ChaosConfig) -> Table:
    table = Table(title=f"chaos run (seed {config.seed}, fault rate {config.rate:g})")
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right")
    rows: list[tuple[str, Any]] = [
        ("replicas (crashed and replaced)", f"{figures.replicas} ({figures.restarts})"),
        ("resources (+ bad input documents)", f"{figures.resources} (+{figures.bad_inputs})"),
        ("simulated seconds / rounds", f"{figures.simulated_seconds:g} / {figures.rounds}"),
        ("steps with side effects completed", figures.steps),
        ("claims", figures.claims),
        ("submits retried by the API after a store error", figures.submit_retries),
        ("largest clock skew of a replica (s)", figures.max_skew),
    ]
    rows += [(f"  fault: {kind}", count) for kind, count in figures.faults.items()]
    rows += [
        ("faults injected, total", sum(figures.faults.values())),
        ("bad inputs tried", figures.bad_inputs),
        ("resources Ready", figures.ready),
        ("resources Failed as expected", figures.failed_expected),
        ("resources Failed by injected faults", figures.failed_by_faults),
        ("resources lost", figures.resources_lost),
        (
            "stale writes attempted / landed",
            f"{figures.stale_writes_attempted} / {figures.stale_writes_landed}",
        ),
        (
            "steps run twice (of them interrupted by a fault)",
            f"{figures.steps_run_twice} ({figures.steps_run_twice_interrupted})",
        ),
        ("loops alive", f"{figures.loops_alive}/{figures.loops_expected}"),
        ("exceptions escaped a tick", figures.unhandled_exceptions),
        ("passwords in documents or logs", figures.credentials_leaked),
        ("log records", ", ".join(f"{k} {v}" for k, v in figures.log_records.items())),
        ("wall seconds", figures.wall_seconds),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.demo.chaos", description=__doc__.split("\n\n")[0]
    )
    defaults = ChaosConfig()
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--resources", type=int, default=defaults.resources)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration,
        help="simulated seconds of arrivals and faults (a soak run: 86400)",
    )
    parser.add_argument("--rate", type=float, default=defaults.rate, help="base fault rate")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.replicas < 2 or args.resources < 1 or args.duration <= 0:
        parser.error("needs --replicas >= 2, --resources >= 1 and --duration > 0")
    if not 0 <= args.rate <= 0.2:
        parser.error("--rate must be within [0, 0.2]")
    config = ChaosConfig(
        replicas=args.replicas,
        resources=args.resources,
        seed=args.seed,
        duration=args.duration,
        rate=args.rate,
    )
    figures = Chaos(config).run()
    if args.json:
        print(json.dumps({**asdict(figures), "ok": figures.ok}, indent=2, default=str))
    else:
        console = Console()
        console.print(_table(figures, config))
        for violation in figures.violations:
            console.print(f"[red]invariant failed:[/red] {violation}", markup=True)
        console.print("[green]all invariants hold[/green]" if figures.ok else "")
    return 0 if figures.ok else 1


__all__ = ["main"]
