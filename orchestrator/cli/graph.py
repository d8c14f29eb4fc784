"""``orchestrator graph``: the registered state machine as a Mermaid diagram, so users can
see what they built.

Transitions are those declared with ``to=`` on each handler, plus the move to its failed
phase; a handler that declares none is drawn as a note on its phase. The phases a
``when`` handler starts from come from its filter (``phase``, or ``phase: {$in: [...]}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import click

from orchestrator.cli.conventions import EPILOG, CommandError
from orchestrator.cli.loading import load_orchestrator
from orchestrator.core.registry import Handler


@click.command(epilog=EPILOG, short_help="The registered phases as a Mermaid diagram.")
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


def mermaid(handlers: Iterable[Handler]) -> str:
    """A ``stateDiagram-v2``, one composite state per collection."""
    by_collection: dict[str, list[Handler]] = {}
    for handler in handlers:
        by_collection.setdefault(handler.collection, []).append(handler)
    lines = ["stateDiagram-v2"]
    for collection, group in by_collection.items():
        lines.append(f"    state {_id(collection)} {{")
        lines.extend(f"        {line}" for line in _collection(collection, group))
        lines.append("    }")
    return "\n".join(lines) + "\n"


def _collection(collection: str, handlers: list[Handler]) -> list[str]:
    names: dict[str, str] = {}

    def node(phase: str) -> str:
        if phase not in names:
            names[phase] = _id(f"{collection}_{phase}")
        return names[phase]

    edges: list[str] = []
    notes: list[str] = []
    handled: set[str] = set()
    targets: set[str] = set()
    for handler in handlers:
        label = _short(handler.name)
        condition = _condition(handler.match)
        if condition:
            label = f"{label} [{condition}]"
        for source in _sources(handler.match):
            handled.add(source)
            if handler.to:
                for target in handler.to:
                    targets.add(target)
                    edges.append(f"{node(source)} --> {node(target)} : {label}")
            else:
                notes.append(f"note right of {node(source)} : {label}, no declared to=")
            if handler.failed_phase not in (*handler.to, source):
                targets.add(handler.failed_phase)
                edges.append(
                    f"{node(source)} --> {node(handler.failed_phase)} : "
                    f"after {handler.max_attempts} failed attempts"
                )
    lines = [f'state "{phase}" as {name}' for phase, name in names.items()]
    lines.extend(dict.fromkeys(edges))  # one edge per source, target and label
    lines.extend(f"{names[phase]} --> [*]" for phase in sorted(targets - handled))
    lines.extend(notes)
    return lines


def _sources(match: Mapping[str, Any]) -> list[str]:
    phase = match.get("phase")
    if isinstance(phase, str):
        return [phase]
    if isinstance(phase, Mapping) and isinstance(phase.get("$in"), list | tuple):
        return [p for p in phase["$in"] if isinstance(p, str)]
    return ["any phase"]


def _condition(match: Mapping[str, Any]) -> str:
    rest = {k: v for k, v in match.items() if k != "phase"}
    if not rest:
        return ""
    parts = [f"{k}={v}" if isinstance(v, str) else f"{k} {json.dumps(v)}" for k, v in rest.items()]
    # Mermaid ends a label at ':' and chokes on braces and quotes.
    return re.sub(r'[:{}"]', "", ", ".join(parts))


def _short(name: str) -> str:
    return name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def _id(text: str) -> str:
    return re.sub(r"\W", "_", text)


__all__ = ["graph", "mermaid"]
