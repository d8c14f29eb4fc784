"""Documents as the operators' commands print them: each id whole, whatever the terminal's
width (an id is for copying into the next command), with its business key beside it.

A table's document column never wraps nor shrinks; the other columns fold to fit. When
even that cannot fit (a narrow terminal, a long id), each document is printed as a block
of lines instead. Every value read from the database goes in as ``Text``, verbatim (no
markup) and visible (control characters written out as escapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from orchestrator.core.redact import visible
from orchestrator.operations import Filter, LeaseState, OperatorError, Row, parse_id_json

TABLE_ROOM = 40
"""Columns the cells beside a document's id need to read as a table; fewer: blocks."""

MESSAGE_SHOWN = 200
"""Characters of an error message a list shows (``history`` and ``--json`` show it all)."""

Cell = str | tuple[str, ...]
"""A cell of a listing: a line, or lines (the first the value, the others about it)."""


def console() -> Console:
    """The terminal (its width, else ``$COLUMNS``, else 80), without rich's highlighting
    of numbers and paths in values that are data."""
    return Console(highlight=False)


def shown(value: object) -> Text:
    """A value read from the database: verbatim (no markup), visible."""
    return Text(visible(value if isinstance(value, str) else str(value)))


def when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}" if at is not None else ""


def state_of(row: Row) -> str:
    """The lease state as an operator reads it: who holds it; ``failed`` when its handler
    gave up on it (its ``failedBy`` mark keeps that handler off it: only an operator's
    retry moves it on)."""
    if row.failed_by is not None:
        return "failed"
    if row.state in (LeaseState.LEASED, LeaseState.OVERDUE) and row.holder:
        return f"{row.state.value} ({row.holder})"
    return row.state.value


def error_of(row: Row) -> str:
    if row.error_type is None and row.error_message is None:
        return ""
    message = row.error_message or ""
    if len(message) > MESSAGE_SHOWN:
        message = message[: MESSAGE_SHOWN - 3] + "..."
    return f"{row.error_type or '?'}: {message}"


def phase_cell(row: Row, phase: str | None = None) -> tuple[str, str, str]:
    """Its phase (or ``phase``: a move), lease state and attempts, a line each."""
    attempts = f"{row.attempts} attempt" + ("" if row.attempts == 1 else "s")
    return ((row.phase or "") if phase is None else phase, state_of(row), attempts)


def error_cell(row: Row) -> tuple[str, ...]:
    """Its last error, when, and the handler that gave up on it (or that it is retrying)."""
    lines = [error_of(row)]
    if row.error_at is not None:
        lines.append(f"at {when(row.error_at)}")
    if row.failed_by is not None:
        lines.append(f"{row.failed_by} gave up")
    elif row.failure is LeaseState.RETRYING:
        lines.append("retrying")
    return tuple(lines)


def tree_lines(row: Row) -> tuple[str, ...]:
    """Its parent, what it waits for and its step's progress, a line each (none when it
    has none of them)."""
    lines = []
    if row.owner is not None:
        lines.append(f"child of {row.owner}")
    if row.wait is not None:
        lines.append(row.wait)
    if row.progress is not None:
        lines.append(row.progress)
    return tuple(lines)


@dataclass
class Listing:
    """Documents, each with cells under ``headers`` (the document column comes first)."""

    title: str
    headers: Sequence[str]
    rows: list[tuple[str, str | None, list[Cell]]] = field(default_factory=list)

    def add(self, doc_id: str, key: str | None, *cells: Cell) -> None:
        self.rows.append((doc_id, key, list(cells)))

    def add_row(self, row: Row, *cells: Cell) -> None:
        self.add(row.id, row.key, *cells)

    def print(self, out: Console) -> None:
        widest = max((len(visible(i)) for i, _, _ in self.rows), default=0)
        if widest + TABLE_ROOM <= out.width:
            out.print(self._table())
        else:
            self._blocks(out)

    def _table(self) -> Table:
        table = Table(
            title=Text(self.title),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            leading=1,
        )
        table.add_column("document", no_wrap=True)
        for header in self.headers:
            table.add_column(header, overflow="fold")
        for doc_id, key, cells in self.rows:
            document = Text(visible(doc_id), no_wrap=True)
            table.add_row(Group(document, _dim(key)) if key else document, *map(_lines, cells))
        return table

    def _blocks(self, out: Console) -> None:
        """One document a block: its id alone on a line, then each cell named."""
        out.print(Text(self.title))
        for doc_id, key, cells in self.rows:
            out.print(Text(visible(doc_id), no_wrap=True, overflow="ignore"), crop=False)
            if key:
                out.print(_dim(key))
            for header, cell in zip(self.headers, cells, strict=True):
                text = cell if isinstance(cell, str) else ", ".join(c for c in cell if c)
                if text:
                    out.print(Text("  ").append(f"{header}: ", style="dim").append(shown(text)))


def _lines(cell: Cell) -> Text | Group:
    if isinstance(cell, str):
        return shown(cell)
    first, *rest = cell
    return Group(shown(first), *(_dim(line) for line in rest if line))


def _dim(text: str) -> Text:
    return Text(visible(text), style="dim", overflow="fold")


def described(query: Filter) -> str:
    """``collection (name=value, ...)``: a filter as a line says it."""
    shown = query.describe()
    name = str(shown.pop("collection"))
    parts = [f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in shown.items()]
    return visible(name + (f" ({', '.join(parts)})" if parts else ""))


def plain_id(recorded: str) -> str:
    """An id the audit trail keeps as Extended JSON, as a list shows ids (as text)."""
    try:
        return str(parse_id_json(recorded))
    except OperatorError:
        return recorded


def document_name(collection: str, row_id: str, key: str | None) -> str:
    """``collection/id (key)``, as one line says which document."""
    return f"{collection}/{row_id}" + (f" ({key})" if key else "")


__all__ = [
    "Cell",
    "Listing",
    "console",
    "described",
    "document_name",
    "error_cell",
    "error_of",
    "phase_cell",
    "plain_id",
    "shown",
    "state_of",
    "tree_lines",
    "when",
]
