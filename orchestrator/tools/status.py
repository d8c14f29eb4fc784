"""What operators ask first: where are the documents, who holds them, what failed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from bson.errors import BSONError
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator.core.errors import ConfigError
from orchestrator.core.queries import as_utc
from orchestrator.core.replicas import (
    REPLICAS_COLLECTION,
    Disagreement,
    ReplicaRecord,
    disagreements,
)
from orchestrator.mongo import AsyncStore, Store
from orchestrator.mongo.common import Document
from orchestrator.runners.plans import Plan, adrive, drive
from orchestrator.tools.operations import id_json


@dataclass(frozen=True)
class PhaseCount:
    """``leased``: held by a live lease; ``overdue``: held past the lock timeout (its
    replica died or is stuck; claimable); ``waiting``: sitting out a relock or retry;
    ``failed``: whose last attempt failed."""

    collection: str
    phase: str
    count: int
    leased: int
    overdue: int
    waiting: int
    failed: int


@dataclass(frozen=True)
class RecentError:
    """A document's last error as a report shows it: every part as text, whatever the
    stored fields hold (``lastError`` may be a string a migrated application wrote).
    ``id``: the document's id as text, for reading (the string ``"42"`` and the integer
    ``42`` read alike); ``ref``: its canonical Extended JSON, exact whatever its type
    (``operations.id_json``), for finding it again; None when the id cannot be encoded."""

    collection: str
    id: str
    ref: str | None
    phase: str | None
    attempts: int
    type: str
    message: str
    at: datetime | None


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

    def counts(self) -> dict[str, dict[str, int]]:
        """``{collection: {phase: count}}``."""
        out: dict[str, dict[str, int]] = {}
        for row in self.phases:
            out.setdefault(row.collection, {})[row.phase] = row.count
        return out

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "at": self.at.isoformat(),
            "server_time": self.server_time,
            "phases": [asdict(row) for row in self.phases],
            "errors": [asdict(error) for error in self.errors],
            "replicas": [
                {**r.to_dict(), "seen_ago": round(r.seen_ago(self.at), 3)} for r in self.replicas
            ],
            "disagreements": [d.to_dict() for d in self.disagreements],
        }
        for error in data["errors"]:
            error["at"] = error["at"].isoformat() if error["at"] is not None else None
        return data


def collect(
    db: Database[Document],
    *,
    collections: Sequence[str] | None = None,
    errors: int = 5,
    replicas_collection: str = REPLICAS_COLLECTION,
) -> Status:
    """Phase counts of ``collections`` (by default every collection holding phased
    documents) and their latest ``errors`` errors each, judged by the server's clock
    against each lease's own expiry (so the replicas' lock timeouts need not be known),
    and the replicas live in ``replicas_collection`` with the settings they disagree on."""
    return drive(_collect(Store(db), db.name, collections, errors, replicas_collection))


async def collect_async(
    db: AsyncDatabase[Document],
    *,
    collections: Sequence[str] | None = None,
    errors: int = 5,
    replicas_collection: str = REPLICAS_COLLECTION,
) -> Status:
    """``collect`` with the async driver, for an async application (the API server)."""
    return await adrive(_collect(AsyncStore(db), db.name, collections, errors, replicas_collection))


def _collect(
    store: Store | AsyncStore,
    name: str,
    collections: Sequence[str] | None,
    errors: int,
    replicas_collection: str,
) -> Plan[Status]:
    """The status report, as a plan either store carries out (``runners.base``)."""
    present: list[str] = yield store.collection_names
    if collections:
        unknown = [c for c in collections if c not in present]
        if unknown:
            known = ", ".join(present) or "none"
            raise ConfigError(
                f"unknown collection {', '.join(map(repr, unknown))} in database "
                f"{name!r} (it has: {known})"
            )
        names = list(collections)
    else:
        names = [collection for collection in present if collection != replicas_collection]
    server: datetime | None = yield store.server_time
    now = server or datetime.now(UTC)
    live: list[ReplicaRecord] = yield partial(store.live_replicas, now, replicas_collection)
    status = Status(
        at=now, server_time=server is not None, replicas=live, disagreements=disagreements(live)
    )
    for collection in names:
        rows: list[Document] = yield partial(store.phase_summary, collection, now)
        for row in rows:
            status.phases.append(
                PhaseCount(
                    collection=collection,
                    phase=str(row["_id"]),
                    count=row["count"],
                    leased=row["leased"],
                    overdue=row["overdue"],
                    waiting=row["waiting"],
                    failed=row["failed"],
                )
            )
        if errors > 0:
            latest: list[Document] = yield partial(store.latest_errors, collection, errors)
            status.errors.extend(_error(collection, doc) for doc in latest)
    return status


def _error(collection: str, doc: Document) -> RecentError:
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
    return RecentError(
        collection=collection,
        id=_text(doc.get("_id")),
        ref=ref,
        phase=None if phase is None else _text(phase),
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
        type=_text(kind),
        message=_text(message),
        at=as_utc(at) if isinstance(at, datetime) else None,
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)
