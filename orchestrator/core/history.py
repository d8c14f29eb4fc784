"""A document's history: what each step and each operator did to it, kept on the document.

Every releasing write of a step, and every operator's action, carries one entry in the
same update (``$push`` with ``$slice``), so a history costs no round trip: the last
``Settings.history`` entries stay, the oldest fall off. A step's entry says who ran it,
when it was claimed, how long it took, what it did and what it raised (with a bounded,
redacted traceback); an operator's says who acted, when, what and why.

The field may hold anything a document's writer put there: a value that is not a list is
replaced whole by the first entry, never pushed onto (the server would refuse the write,
and with it the step's outcome). Entries are read back tolerantly (``Entry.read``).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.redact import redact

HISTORY_FIELD = "orchestratorHistory"
"""The document's history. Not ``history``: an application's documents (an invoice's
payments, say) may have a field of that name."""

DEFAULT_HISTORY = 20
MAX_HISTORY = 1000
DEFAULT_TRACEBACK = 4000
"""Characters of a traceback kept (its end: the innermost frames and the error)."""


class EntryKind(StrEnum):
    """Who left an entry."""

    STEP = "step"
    OPERATOR = "operator"


CLAIM_PROJECTION: dict[str, Any] = {HISTORY_FIELD: {"$slice": -1}}
"""What a claim reads of the history: its last entry at most (a list's shape is all the
release needs to know; anything else comes back as it is), so a claim's reply does not
grow with the history, nor its decoding on every step."""

LIST_SHAPE: dict[str, Any] = {
    "$or": [{HISTORY_FIELD: {"$exists": False}}, {HISTORY_FIELD: {"$type": "array"}}]
}
"""A history an entry can be pushed onto (absent, or a list): what an operator's write,
which has not read the field, is fenced on; ``OTHER_SHAPE`` is the rest, set whole."""
OTHER_SHAPE: dict[str, Any] = {HISTORY_FIELD: {"$exists": True, "$not": {"$type": "array"}}}


ABSENT: Any = object()
"""The field's value when the document has none (``doc.get(HISTORY_FIELD, ABSENT)``)."""


def push(entry: Mapping[str, Any], keep: int, current: Any) -> dict[str, Any]:
    """The update clause recording ``entry`` in a history of at most ``keep`` entries,
    given the field's ``current`` value (as read at the claim, or by the operator): pushed
    onto a list (or a field that is ``ABSENT``), set whole over anything else, null
    included (a server refuses ``$push`` onto it). Merged into a write's own update."""
    if current is not ABSENT and not isinstance(current, list):
        return {"$set": {HISTORY_FIELD: [dict(entry)]}}
    return {"$push": {HISTORY_FIELD: {"$each": [dict(entry)], "$slice": -keep}}}


def merge(update: Mapping[str, Any], clause: Mapping[str, Any]) -> dict[str, Any]:
    """A new update: ``update`` with ``clause``'s operators added (their fields never
    overlap: the history field is the history's alone). ``update`` is left as it was, so
    it stays the write without the entry; the operators' fields the clause does not
    touch are shared with it, not copied."""
    merged = dict(update)
    for operator, fields in clause.items():
        merged[operator] = {**update.get(operator, {}), **fields}
    return merged


_STEP = EntryKind.STEP.value


def step_entry(  # noqa: PLR0913  one keyword per stored field of a step's entry
    *,
    replica: str,
    claimed_at: datetime,
    now: datetime,
    outcome: str,
    phase: Any,
    to: Any,
    error: Mapping[str, Any] | None = None,
    taken_from: str | None = None,
) -> dict[str, Any]:
    """A step's entry: ``claimed_at`` and ``now`` by the replica's estimate of the server's
    clock, ``phase`` the phase it was claimed in, ``to`` the one it left the document in;
    ``taken_from``: the replica whose expired lease this step's claim took over."""
    entry: dict[str, Any] = {
        "kind": _STEP,
        "at": bson_time(claimed_at),
        "took": round(max((now - claimed_at).total_seconds(), 0.0), 3),
        "by": replica,
        "outcome": outcome,
        "phase": phase,
        "to": to,
    }
    if error is not None:
        entry["error"] = dict(error)
    if taken_from is not None:
        entry["tookOverFrom"] = taken_from
    return entry


def operator_entry(
    *, action: str, by: str, why: str, at: datetime, phase: Any, to: Any
) -> dict[str, Any]:
    """An operator's entry: ``by`` whoever acted (the command line's user, or what the
    application mounting the page says), ``why`` their reason."""
    return {
        "kind": EntryKind.OPERATOR.value,
        "at": bson_time(at),
        "by": by,
        "action": action,
        "why": why,
        "phase": phase,
        "to": to,
    }


def trace_text(exc: BaseException, limit: int) -> str | None:
    """``exc``'s traceback, redacted, its last ``limit`` characters (None: keep none)."""
    if limit <= 0:
        return None
    text = redact("".join(traceback.format_exception(exc)))
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


@dataclass(frozen=True)
class Entry:
    """One entry as tools show it, whatever the stored value held: every part as text or
    None. ``what``: a step's outcome, or an operator's action."""

    kind: str
    at: datetime | None
    by: str
    what: str
    phase: str | None
    to: str | None
    took: float | None = None
    why: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    taken_from: str | None = None

    @classmethod
    def read(cls, value: Any) -> Entry:
        if not isinstance(value, Mapping):
            return cls(kind="?", at=None, by="", what=_text(value), phase=None, to=None)
        error = value.get("error")
        error = error if isinstance(error, Mapping) else {}
        at, took = value.get("at"), value.get("took")
        return cls(
            kind=_text(value.get("kind", "?")),
            at=as_utc(at) if isinstance(at, datetime) else None,
            by=_text(value.get("by", "")),
            what=_text(value.get("outcome", value.get("action", "?"))),
            phase=_maybe(value.get("phase")),
            to=_maybe(value.get("to")),
            took=float(took)
            if isinstance(took, int | float) and not isinstance(took, bool)
            else None,
            why=_maybe(value.get("why")),
            error_type=_maybe(error.get("type")),
            error_message=_maybe(error.get("message")),
            traceback=_maybe(error.get("traceback")),
            taken_from=_maybe(value.get("tookOverFrom")),
        )

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["at"] = self.at.isoformat() if self.at is not None else None
        return data


def entries(doc: Mapping[str, Any]) -> list[Entry]:
    """A document's history, oldest first (as stored); none when the field is absent or
    no list."""
    value = doc.get(HISTORY_FIELD)
    return [Entry.read(item) for item in value] if isinstance(value, list) else []


def latest_first(doc: Mapping[str, Any]) -> list[Entry]:
    """A document's history as every tool shows it (the command line, the page, its JSON
    API, ``Operations.history``): the latest entry first, as the audit trail and the
    latest errors are."""
    return entries(doc)[::-1]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _maybe(value: Any) -> str | None:
    return None if value is None else _text(value)


__all__ = [
    "ABSENT",
    "CLAIM_PROJECTION",
    "DEFAULT_HISTORY",
    "DEFAULT_TRACEBACK",
    "HISTORY_FIELD",
    "LIST_SHAPE",
    "MAX_HISTORY",
    "OTHER_SHAPE",
    "Entry",
    "EntryKind",
    "entries",
    "latest_first",
    "merge",
    "operator_entry",
    "push",
    "step_entry",
    "trace_text",
]
