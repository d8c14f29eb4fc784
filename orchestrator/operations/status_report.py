"""What operators ask first, as a report: where the documents are, who holds them, what
failed, and which replicas are live. The types, and how a report's rows become them; the
reading is ``AsyncOperations.status``'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from bson.errors import BSONError

from orchestrator.core.audit import AuditEntry
from orchestrator.core.clock import as_utc
from orchestrator.core.documents import id_json
from orchestrator.core.pauses import Pause
from orchestrator.core.replicas import Disagreement, ReplicaRecord, retention_of
from orchestrator.core.retention import Retention, shown
from orchestrator.operations.filters import business_key
from orchestrator.operations.schedule_report import SchedulesSummary


@dataclass(frozen=True)
class PhaseCount:
    """``leased``: held by a live lease; ``overdue``: held past the lock timeout (its
    replica died or is stuck; claimable); ``waiting``: sitting out a relock or retry, or
    a later start set at submit (``not_before``); ``retrying``: whose latest attempt
    failed, tried again (no handler gave up on it); ``failed``: a handler gave up on it
    (it stays in the failed phase until an operator retries it)."""

    collection: str
    phase: str
    count: int
    leased: int
    overdue: int
    waiting: int
    retrying: int
    failed: int

    @classmethod
    def from_row(cls, collection: str, row: Mapping[str, Any]) -> PhaseCount:
        """A row of ``operators.status_pipeline`` (its ``_id`` is the phase)."""
        return cls(
            collection=collection,
            phase=str(row["_id"]),
            count=row["count"],
            leased=row["leased"],
            overdue=row["overdue"],
            waiting=row["waiting"],
            retrying=row["retrying"],
            failed=row["failed"],
        )


@dataclass(frozen=True)
class RecentError:
    """A document's last error as a report shows it: every part as text, whatever the
    stored fields hold (``lastError`` may be a string a migrated application wrote).
    ``id``: the document's id as text, for reading (the string ``"42"`` and the integer
    ``42`` read alike); ``ref``: its canonical Extended JSON, exact whatever its type
    (``documents.id_json``), for finding it again; None when the id cannot be encoded.
    ``key``: its business key (``filters.business_key``), shown beside the id."""

    collection: str
    id: str
    ref: str | None
    phase: str | None
    attempts: int
    type: str
    message: str
    at: datetime | None
    key: str | None = None

    @classmethod
    def from_document(
        cls, collection: str, doc: Mapping[str, Any], keys: Sequence[tuple[str, ...]] = ()
    ) -> RecentError:
        """From a document carrying ``lastError`` (``operators.ERRORS_PROJECTION``'s fields,
        and those of ``keys``, the collection's business keys)."""
        error = doc.get("lastError")
        if isinstance(error, dict):
            kind, message, at = error.get("type", "?"), error.get("message", ""), error.get("at")
        else:  # not an error record: shown as it is
            kind, message, at = "?", "" if error is None else error, None
        attempts, phase = doc.get("attempts"), doc.get("phase")
        try:
            ref: str | None = id_json(doc.get("_id"))
        except (TypeError, ValueError, BSONError):
            ref = None
        return cls(
            collection=collection,
            id=_text(doc.get("_id")),
            ref=ref,
            phase=None if phase is None else _text(phase),
            attempts=attempts
            if isinstance(attempts, int) and not isinstance(attempts, bool)
            else 0,
            type=_text(kind),
            message=_text(message),
            at=as_utc(at) if isinstance(at, datetime) else None,
            key=business_key(doc, keys),
        )


@dataclass(frozen=True)
class Status:
    """``server_time``: False when the server reported no time and this machine's clock
    judged the leases (then ``leased``/``overdue`` are only as right as that clock).
    ``replicas``: the live replicas; ``disagreements``: the settings they differ on."""

    at: datetime
    server_time: bool
    phases: list[PhaseCount] = field(default_factory=list)
    errors: list[RecentError] = field(default_factory=list)
    replicas: list[ReplicaRecord] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    takeovers: list[AuditEntry] = field(default_factory=list)
    """The latest leases taken over from replicas that died (or stalled), latest first."""
    notes: list[str] = field(default_factory=list)
    """What the report could not say, and why (a collection whose errors index the server
    refuses)."""
    handler_names: dict[str, str] = field(default_factory=dict)
    """Handler keys (what ``failedBy`` holds) to ``module:function`` names, as the live
    replicas publish them."""
    schedules: SchedulesSummary | None = None
    """How many schedules there are, paused, failing (None: not read)."""

    def counts(self) -> dict[str, dict[str, int]]:
        """``{collection: {phase: count}}``."""
        out: dict[str, dict[str, int]] = {}
        for row in self.phases:
            out.setdefault(row.collection, {})[row.phase] = row.count
        return out

    def retention(self) -> dict[str, Retention]:
        """Per collection the live replicas retain, how long each retained phase is kept
        (the retention most of them keep; ``disagreements`` names any other)."""
        names = sorted({c for record in self.replicas for c, _, _ in record.retention})
        return {name: retention_of(self.replicas, name) for name in names}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "at": self.at.isoformat(),
            "server_time": self.server_time,
            "phases": [asdict(row) for row in self.phases],
            "errors": [asdict(error) for error in self.errors],
            "replicas": [
                {
                    **r.to_dict(),
                    "seen_ago": round(r.seen_ago(self.at), 3),
                    "stale": r.stale(self.at),
                }
                for r in self.replicas
            ],
            "disagreements": [d.to_dict() for d in self.disagreements],
            "pauses": [p.to_dict() for p in self.pauses],
            "takeovers": [t.to_dict() for t in self.takeovers],
            "notes": list(self.notes),
            "retention": {
                name: {phase: {"seconds": s, "shown": shown(s)} for phase, s in kept.items()}
                for name, kept in self.retention().items()
            },
            "schedules": None if self.schedules is None else self.schedules.to_dict(),
        }
        for error in data["errors"]:
            error["at"] = error["at"].isoformat() if error["at"] is not None else None
        return data


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


__all__ = ["PhaseCount", "RecentError", "Status"]
