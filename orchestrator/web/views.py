"""How the page shows what it reads: the templates and their filters (times, durations,
any stored value as text), and what the live replicas tell about a document or a pause
(``Fleet``): which handler a ``failedBy`` mark names and where it leaves documents,
which phases some replica handles, which pauses each replica honours, which replica has
gone silent.

Nothing here reads the database: every view is made from a status report already read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import RELAXED_JSON_OPTIONS
from jinja2 import Environment, PackageLoader, StrictUndefined

from orchestrator.core import replicas as records
from orchestrator.core.audit import AuditEntry
from orchestrator.core.documents import Document, parse_id_json
from orchestrator.core.history import HISTORY_FIELD
from orchestrator.core.in_house import InHouse
from orchestrator.core.replicas import HandlerInfo, ReplicaRecord
from orchestrator.core.resource import EPOCH, EXPIRY_FIELD, LEASE_FIELDS, TRACE_FIELD
from orchestrator.operations import LeaseState, OperatorError, Pause, Row, Status
from orchestrator.operations.rules import cancelled_phase

__all__ = [
    "LEASE_ROWS",
    "Badge",
    "Fleet",
    "HandlerRow",
    "Missing",
    "environment",
    "error_view",
    "other_fields",
    "text",
    "when",
]

MAX_FIELDS_SHOWN = 20_000
"""Characters of a document's other fields shown on its page (a document may be 16 MiB)."""

LEASE_ROWS = (
    ("phase", "phase"),
    ("lockedBy", "replica (last holder)"),
    ("lockToken", "lease token"),
    ("lockedAt", "lease taken or renewed at (migrating: the in-house pods' lease)"),
    ("lockedUntil", "lease until"),
    ("attempts", "attempts in this phase"),
    ("relocks", "relocks in this phase"),
    ("failedBy", "failed by (handler)"),
    ("claimPriority", "claim priority (- is 0)"),
    ("updatedAt", "phase entered or updated at"),
    ("createdAt", "created at"),
    (TRACE_FIELD, "trace context (stored at submit)"),
    (EXPIRY_FIELD, "deleted by the server from (its phase's retention)"),
)
SHOWN_FIELDS = frozenset(
    {"_id", "updatedAt", HISTORY_FIELD, *(name for name, _ in LEASE_ROWS), *LEASE_FIELDS}
)
"""Fields the document page shows in their own places; the rest are the application's."""


def environment() -> Environment:
    """The page's templates: autoescaped, and failing on any name they were not given."""
    env = Environment(
        loader=PackageLoader("orchestrator.web", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["text"] = text
    env.filters["seconds"] = _seconds
    env.filters["ago"] = _ago
    env.filters["took"] = _took
    env.filters["plain_ref"] = plain_ref
    return env


def plain_ref(ref: str) -> str:
    """A document's id as an audit entry records it (Extended JSON) shown as the page
    shows ids; as recorded when it does not parse."""
    try:
        return text(parse_id_json(ref))
    except OperatorError:
        return ref


# -- what the live replicas tell --------------------------------------------------------------


@dataclass(frozen=True)
class Badge:
    """A lease state as the page shows it: ``name`` (also its CSS class; the lease state
    the command line and the JSON API name it by) and what it means for the document, in
    a sentence; ``moving``: whether it changes by itself (its page reloads itself)."""

    name: str
    note: str
    moving: bool = False


@dataclass
class HandlerRow:
    """A handler as the live replicas publish it, with the replicas that run it."""

    collection: str
    phase: str | None
    name: str
    failed_phase: str
    replicas: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Fleet:
    """The live replicas of a status report, and the pauses in force, as the page reads
    them (``at``: the report's time, the server's)."""

    at: datetime
    replicas: list[ReplicaRecord]
    pauses: list[Pause]

    @classmethod
    def of(cls, status: Status) -> Fleet:
        return cls(status.at, list(status.replicas), list(status.pauses))

    def handler(self, mark: str) -> HandlerInfo | None:
        """The handler a ``failedBy`` mark names: by its key, or by its name (a list row
        shows the name where a live replica publishes it)."""
        for record in self.replicas:
            for handler in record.handlers:
                if mark in (handler.key, handler.name):
                    return handler
        return None

    def handlers(self) -> list[HandlerRow]:
        """Every handler some live replica runs, by collection, phase and name."""
        rows: dict[tuple[str, str, str], HandlerRow] = {}
        for record in self.replicas:
            for h in record.handlers:
                row = rows.setdefault(
                    (h.collection, h.phase or "", h.name),
                    HandlerRow(h.collection, h.phase, h.name, h.failed_phase),
                )
                row.replicas.append(record.replica_id)
        return [rows[k] for k in sorted(rows)]

    def cancelled_phase(self) -> str:
        """Where a cancel sends documents (the live replicas' setting)."""
        return cancelled_phase(self.replicas)

    def keys(self, collection: str) -> list[tuple[str, ...]]:
        """The business keys the live replicas declare for ``collection``."""
        return records.business_keys(self.replicas, collection)

    def names(self) -> dict[str, str]:
        """Handler keys to ``module:function`` names."""
        return records.handler_names(self.replicas)

    def in_house(self) -> InHouse:
        """The in-house pods' leases the live replicas honour, by which a document only an
        in-house lease holds is leased (``InHouse.honoured_by``)."""
        return InHouse.honoured_by(self.replicas)

    def stale(self, record: ReplicaRecord) -> bool:
        """Silent past two record intervals (``ReplicaRecord.stale``), as of the report."""
        return record.stale(self.at)

    def honour(self, pause: Pause) -> tuple[list[str], list[str]]:
        """The live replicas that honour ``pause`` (it is in their record), and those
        that do not yet (they read pauses at their next heartbeat)."""
        shown = pause.scope.describe()
        yes = [r.replica_id for r in self.replicas if shown in r.paused]
        return yes, [r.replica_id for r in self.replicas if shown not in r.paused]

    def pause_of(self, collection: str, phase: str | None) -> Pause | None:
        """The pause that keeps documents of ``collection`` in ``phase`` from being
        claimed: of the collection, of the phase, or of the handler of that phase."""
        names = {h.name for h in self.handlers() if h.collection == collection and h.phase == phase}
        for pause in self.pauses:
            scope = pause.scope
            if scope.collection != collection or scope.phase not in (None, phase):
                continue
            if scope.handler is None or scope.handler in names:
                return pause
        return None

    def badge(self, collection: str, row: Row) -> Badge:
        """``row``'s lease state, knowing what the lease fields alone do not tell: that a
        free document a handler gave up on stays where it is, that nothing claims in a
        paused or unhandled phase."""
        leased = self._lease_badge(row)
        if leased is not None:
            return leased
        if row.failed_by is not None:
            handler = self.handler(row.failed_by)
            if handler is None or handler.failed_phase == row.phase:
                name = handler.name if handler is not None else row.failed_by
                return Badge("failed", f"{name} gave up; it stays here until retried")
        if row.phase is None:
            return Badge("no phase", "it has no phase: no handler claims it")
        pause = self.pause_of(collection, row.phase)
        if pause is not None:
            return Badge(
                "paused", f"{pause.scope.describe()} is paused: nothing claims it until resumed"
            )
        handled, any_phase = records.handled_phases(self.replicas, collection)
        if row.phase in handled or any_phase:
            return Badge("free", "a handler of its phase may claim it now", moving=True)
        return Badge("free", f"no live replica handles phase {row.phase}: it rests there")

    def _lease_badge(self, row: Row) -> Badge | None:
        """``row``'s badge when a lease or a wait names it (leased, overdue, waiting);
        None when it is free of both."""
        if row.state is LeaseState.LEASED:
            return Badge(
                "leased",
                f"held by {row.holder}'s live lease until {when(row.until, self.at)}",
                moving=True,
            )
        if row.state is LeaseState.OVERDUE:
            return Badge(
                "overdue",
                f"{row.holder}'s lease ran out unreleased (it died or is stuck): any replica "
                "may take it over",
                moving=True,
            )
        if row.state is LeaseState.WAITING and row.wait is not None:
            return Badge(
                "waiting", f"{row.wait}; looked at again by {when(row.until, self.at)}", moving=True
            )
        if row.state is LeaseState.WAITING:
            return Badge(
                "waiting",
                f"sitting out a relock or retry, or a later start set at submit, until"
                f" {when(row.until, self.at)}",
                moving=True,
            )
        return None

    def takeover(self, entry: AuditEntry) -> dict[str, Any]:
        """A take-over as the page says it: whose lease, on which document, by whom."""
        ref = entry.documents[0] if entry.documents else None
        shown = plain_ref(ref) if ref else "?"
        return {
            "at": entry.at,
            "by": entry.by,
            "from": entry.taken_from or "?",
            "collection": entry.collection,
            "ref": ref,
            "id": shown,
            "phase": entry.scope.get("phase"),
        }


# -- values -----------------------------------------------------------------------------------


class Missing:
    """A field the document does not have (shown as ``-``)."""

    def __str__(self) -> str:
        return "-"


MISSING = Missing()


def error_view(error: Any) -> dict[str, Any] | None:
    """An error record's parts; a malformed one (not a document) shown as it is."""
    if error is None:
        return None
    if not isinstance(error, dict):
        return {"type": "?", "message": text(error), "at": None, "phase": None, "trace": None}
    trace = error.get("traceback")
    return {
        "type": text(error.get("type", "?")),
        "message": text(error.get("message", "")),
        "at": error.get("at"),
        "phase": error.get("phase"),
        "trace": None if trace is None else text(trace),
    }


def other_fields(doc: Document) -> str:
    """The application's own fields, as relaxed Extended JSON, cut to ``MAX_FIELDS_SHOWN``."""
    rest = {name: value for name, value in doc.items() if name not in SHOWN_FIELDS}
    if not rest:
        return ""
    try:
        shown = json_util.dumps(
            rest, indent=2, ensure_ascii=False, json_options=RELAXED_JSON_OPTIONS
        )
    except (TypeError, ValueError, BSONError):
        shown = repr(rest)
    if len(shown) > MAX_FIELDS_SHOWN:
        more = len(shown) - MAX_FIELDS_SHOWN
        shown = shown[:MAX_FIELDS_SHOWN] + f"\n... ({more} more characters)"
    return shown


def totals(status: Status) -> dict[str, dict[str, int]]:
    """Per collection: documents, leased, overdue, waiting, retrying and failed over its
    phases."""
    out: dict[str, dict[str, int]] = {}
    counted = ("count", "leased", "overdue", "waiting", "retrying", "failed")
    for row in status.phases:
        total = out.setdefault(row.collection, dict.fromkeys(counted, 0))
        for name in total:
            total[name] += getattr(row, name)
    return out


def phases_of(status: Status, collection: str) -> Mapping[str, int]:
    """The phases of ``collection`` and their document counts."""
    return {row.phase: row.count for row in status.phases if row.collection == collection}


def text(value: Any) -> str:
    """A value as text: strings as they are, ids and the rest by ``str``."""
    return value if isinstance(value, str) else str(value)


def when(value: Any, now: datetime | None = None) -> str:
    """A stored time as UTC with how far it is from ``now``; anything else as text (a
    malformed ``lockedUntil`` is shown, not hidden)."""
    if not isinstance(value, datetime):
        return text(value) if value is not None and value is not MISSING else "-"
    at = value if value.tzinfo else value.replace(tzinfo=UTC)
    shown = f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if at == EPOCH.replace(tzinfo=UTC):
        return f"{shown} (released)"
    if now is None:
        return shown
    seconds = (at - now).total_seconds()
    if abs(seconds) < 1:
        return f"{shown} (now)"
    span = _span(abs(seconds))
    return f"{shown} (in {span})" if seconds > 0 else f"{shown} ({span} ago)"


def _seconds(value: float) -> str:
    """A duration setting as the status command shows it: ``30s``, ``0.5s``."""
    return f"{value:g}s"


def _took(value: float | None) -> str:
    """A step's duration: ``0.25 s``, ``3 min``."""
    if value is None:
        return "?"
    return f"{value:.3g} s" if value < 120 else _span(value)


def _ago(value: datetime | None, now: datetime) -> str:
    """How long ago ``value`` was, by the server's time: ``12 s``, ``3 min``."""
    if value is None:
        return "?"
    return _span(max((now - value).total_seconds(), 0.0))


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"
