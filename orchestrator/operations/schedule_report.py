"""What operators see of the schedules, read from their documents without I/O: one row per
schedule (its spec in a line, its policies, next fire, last run and its outcome, counts,
who declared the stored spec, whether live replicas disagree on it), a schedule's recent
runs, and what a trigger or backfill did.

A schedule's document may hold anything (another writer, an old version, a hand edit):
every field is read leniently, a value that is no value of its kind reads as absent and
is named in ``unreadable`` (with what it holds, shortened), so a tool lists the schedule
anyway and shows the garbage as such.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from orchestrator.core.clock import as_utc
from orchestrator.core.documents import Document, id_json_or_text
from orchestrator.core.errors import ConfigError
from orchestrator.core.queries.schedules import fire_of
from orchestrator.core.redact import redact
from orchestrator.core.replicas import Disagreement
from orchestrator.core.schedules import SCHEDULED_FIELD, FireResult, ScheduleState, spec_of

__all__ = [
    "MAX_RUNS",
    "Backfilled",
    "LastRun",
    "ScheduleRow",
    "ScheduleRun",
    "SchedulesSummary",
    "Triggered",
]

MAX_RUNS = 500
"""Runs one schedule's listing shows at most."""
SHOWN_GARBAGE = 60
"""Characters of an unreadable field's value a row keeps."""


@dataclass(frozen=True)
class LastRun:
    """A schedule's latest fire as its last step recorded it, and the phase its run
    document is in now (None: it started none, or the document is gone: ``exists``)."""

    fire: datetime | None
    at: datetime | None
    result: str | None
    run: Any
    error: str | None
    phase: str | None = None
    exists: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "fire": _iso(self.fire),
            "at": _iso(self.at),
            "result": self.result,
            "run": None if self.run is None else _id_text(self.run),
            "error": self.error,
            "phase": self.phase,
            "exists": self.exists,
        }


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as its document says it. ``spec``: its fire times in a line
    (``FireTimes.describe``), or why the stored spec is unreadable; ``next``: its next fire;
    ``pending``: operators' requests its next step serves; ``disagreement``: the live
    replicas declaring it with different specs (None: they agree, or one declares it)."""

    name: str
    spec: str
    collection: str | None
    overlap: str | None
    catch_up: float | None
    coalesce: bool | None
    jitter: float | None
    next: datetime | None
    paused: bool
    last: LastRun | None
    counts: dict[str, int]
    declared_by: str | None
    pending: int
    disagreement: Disagreement | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    """Fields holding what they cannot hold: field name to its value, shortened."""

    @property
    def failing(self) -> bool:
        """Its latest fire failed (its function raised, or returned no document)."""
        return self.last is not None and self.last.result == FireResult.FAILED.value

    @property
    def missed(self) -> int:
        return self.counts.get(FireResult.MISSED.value, 0)

    def with_run(self, doc: Document | None) -> ScheduleRow:
        """This row with its last run's document as it is now (None: gone)."""
        if self.last is None or self.last.run is None:
            return self
        phase = None if doc is None else doc.get("phase")
        last = LastRun(
            self.last.fire,
            self.last.at,
            self.last.result,
            self.last.run,
            self.last.error,
            phase if isinstance(phase, str) else None,
            doc is not None,
        )
        return replace(self, last=last)

    def with_disagreement(self, found: Iterable[Disagreement]) -> ScheduleRow:
        setting = f"schedule of {self.name}"
        mine = next((d for d in found if d.setting == setting), None)
        return replace(self, disagreement=mine)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "collection": self.collection,
            "overlap": self.overlap,
            "catch_up": self.catch_up,
            "coalesce": self.coalesce,
            "jitter": self.jitter,
            "next": _iso(self.next),
            "paused": self.paused,
            "last": None if self.last is None else self.last.to_dict(),
            "counts": dict(self.counts),
            "missed": self.missed,
            "failing": self.failing,
            "declared_by": self.declared_by,
            "pending": self.pending,
            "disagreement": None if self.disagreement is None else self.disagreement.to_dict(),
            "unreadable": dict(self.unreadable),
        }

    @classmethod
    def read(cls, doc: Mapping[str, Any]) -> ScheduleRow:
        """The row of a schedule's document, whatever its fields hold."""
        unreadable: dict[str, str] = {}
        raw_id = doc.get("_id")
        name = raw_id if isinstance(raw_id, str) else id_json_or_text(raw_id)
        if not isinstance(raw_id, str):
            unreadable["_id"] = _short(raw_id)
        stored = doc.get("spec")
        try:
            spec = spec_of(name, stored)
        except ConfigError as exc:
            unreadable["spec"] = _short(stored)
            described, collection = f"unreadable spec: {exc}", None
            overlap = catch_up = coalesce = jitter = None
        else:
            described, collection = spec.describe(), spec.collection
            overlap, catch_up = spec.overlap.value, spec.catch_up
            coalesce, jitter = spec.coalesce, spec.jitter
        state = ScheduleState.read(doc)
        for key in ("next", "buffered"):
            if doc.get(key) is not None and not isinstance(doc.get(key), datetime):
                unreadable[key] = _short(doc.get(key))
        counts = doc.get("counts")
        if counts is not None and (
            not isinstance(counts, Mapping) or len(state.counts) != len(counts)
        ):
            unreadable["counts"] = _short(counts)
        paused = doc.get("paused")
        if paused is not None and not isinstance(paused, bool):
            unreadable["paused"] = _short(paused)
        declared = doc.get("declaredBy")
        if declared is not None and not isinstance(declared, str):
            unreadable["declaredBy"] = _short(declared)
        if state.dropped or (
            doc.get("requests") is not None and not isinstance(doc.get("requests"), list)
        ):
            unreadable["requests"] = _short(doc.get("requests"))
        last = _last(doc.get("last"), unreadable)
        return cls(
            name=name,
            spec=described,
            collection=collection,
            overlap=overlap,
            catch_up=catch_up,
            coalesce=coalesce,
            jitter=jitter,
            next=state.next,
            paused=paused is True,  # what the claim reads: anything else is not paused
            last=last,
            counts=state.counts,
            declared_by=declared if isinstance(declared, str) else None,
            pending=len(state.requests),
            unreadable=unreadable,
        )


@dataclass(frozen=True)
class ScheduleRun:
    """A document a schedule started: its id, the fire time it was started for, its
    phase now, when it last changed, and its last error's message."""

    id: Any
    fire: datetime | None
    phase: str | None
    updated: datetime | None
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": _id_text(self.id),
            "fire": _iso(self.fire),
            "phase": self.phase,
            "updated": _iso(self.updated),
            "error": self.error,
        }

    @classmethod
    def read(cls, doc: Mapping[str, Any]) -> ScheduleRun:
        phase = doc.get("phase")
        error = doc.get("lastError")
        message = error.get("message") if isinstance(error, Mapping) else None
        return cls(
            id=doc.get("_id"),
            fire=fire_of(doc),
            phase=phase if isinstance(phase, str) else None,
            updated=_date(doc.get("updatedAt")),
            error=redact(message) if isinstance(message, str) else None,
        )


RUN_PROJECTION = {"_id": 1, "phase": 1, SCHEDULED_FIELD: 1, "updatedAt": 1, "lastError": 1}
"""What a schedule's list of runs reads of each run."""


@dataclass(frozen=True)
class SchedulesSummary:
    """The schedules in a line of ``status``: how many, paused, failing (their latest
    fire failed)."""

    count: int
    paused: int
    failing: int

    @classmethod
    def of(cls, rows: Iterable[ScheduleRow]) -> SchedulesSummary:
        listed = list(rows)
        return cls(len(listed), sum(r.paused for r in listed), sum(r.failing for r in listed))

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "paused": self.paused, "failing": self.failing}


@dataclass(frozen=True)
class Triggered:
    """A trigger as stored: its request ``id``, the fire time it asked for (the server's
    time), the document it starts (``run``), and whether the schedule was made claimable
    at once (``woken``; False: a step held it throughout, and the request is served at the
    schedule's next step, by ``until`` at the latest)."""

    name: str
    id: str
    fire: datetime
    run: str
    woken: bool
    until: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.id,
            "fire": self.fire.isoformat(),
            "run": self.run,
            "woken": self.woken,
            "until": _iso(self.until),
        }


@dataclass(frozen=True)
class Backfilled:
    """A backfill as stored: its request ``id``, the range, the fire times it names
    (those that already have a document are not started again)."""

    name: str
    id: str
    start: datetime
    end: datetime
    fires: int
    woken: bool
    until: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.id,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "fires": self.fires,
            "woken": self.woken,
            "until": _iso(self.until),
        }


def _last(value: Any, unreadable: dict[str, str]) -> LastRun | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        unreadable["last"] = _short(value)
        return None
    result, error = value.get("result"), value.get("error")
    return LastRun(
        fire=_date(value.get("fire")),
        at=_date(value.get("at")),
        result=result if isinstance(result, str) else None,
        run=value.get("run"),
        error=error if isinstance(error, str) else None,
    )


def _id_text(value: Any) -> str:
    """A run's id as text: a schedule's own (a string) as it is, any other as Extended JSON."""
    return value if isinstance(value, str) else id_json_or_text(value)


def _date(value: Any) -> datetime | None:
    return as_utc(value) if isinstance(value, datetime) else None


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _short(value: Any) -> str:
    text = " ".join(redact(repr(value)).split())
    return text if len(text) <= SHOWN_GARBAGE else text[: SHOWN_GARBAGE - 1] + "…"
