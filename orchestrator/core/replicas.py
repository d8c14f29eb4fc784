"""Live replicas: the record each replica keeps of itself, and what readers make of them.

Every replica (``Orchestrator`` and ``AsyncOrchestrator``) writes one small document to
``Settings.replicas_collection`` (``orchestrator.replicas``) when it starts and on every
heartbeat, and deletes it when it stops gracefully. A killed replica cannot delete its
own, so each record carries its own expiry (``expiresAt``: its last refresh plus a time to
live that comfortably exceeds its refresh interval), as each lease carries its own
``lockedUntil``: replicas with different settings refresh at different intervals, and one
TTL index on ``expiresAt`` (``expireAfterSeconds: 0``) serves them all. MongoDB's TTL
monitor deletes expired documents only once a minute (``TTL_MONITOR_PERIOD``), so a
dead replica's record may sit there that much longer: readers judge ``expiresAt``
themselves (``live_filter``), and a dead replica is never listed past its expiry.

Everything here is pure; the store reads and writes, the runners decide when.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.retention import Retention, describe, shown
from orchestrator.core.schedules import spec_of

MAX_REFRESH = 10.0
"""A replica refreshes its record (with its heartbeat) at least this often, whatever its
lock timeout: a replica with a one-day lease must not look alive for hours after it died."""

MIN_TTL = 30.0
"""No record lives less than this past its last refresh: a replica whose heartbeat is
late by a few seconds (a busy event loop, a slow write) does not flicker off the list."""

TTL_MONITOR_PERIOD = 60.0
"""MongoDB's TTL monitor runs every 60 s (``ttlMonitorSleepSecs``): an expired record can
outlive its ``expiresAt`` by that much, which is why readers filter on it themselves."""

_TRACKED = (
    "lock_timeout",
    "legacy_lock_timeout",
    "tick",
    "max_concurrency",
    "version",
    "history",
)
"""The settings ``disagreements`` compares, most consequential first (not the pauses each
honours: they differ for a heartbeat while a pause spreads, and the tools show who
honours each)."""


def refresh_interval(lock_timeout: float) -> float:
    """Seconds between two heartbeats: often enough to renew a lease in time (a sixth of
    the lock timeout), and at most ``MAX_REFRESH`` (the record is written every
    ``RECORD_INTERVAL``, at the heartbeat due then)."""
    return min(lock_timeout / 6, MAX_REFRESH)


RECORD_INTERVAL = MAX_REFRESH
"""Seconds between two writes of a replica's record (at the first heartbeat this long
after the last): an idle replica's one write, whatever its lock timeout; its heartbeats
renew leases more often."""


def record_due(since: float, lock_timeout: float) -> bool:
    """Whether a heartbeat ``since`` seconds after the record's last write writes it again:
    at the first heartbeat within half an interval of ``RECORD_INTERVAL``, so records are
    written every ``RECORD_INTERVAL`` however the heartbeats fall."""
    return since >= RECORD_INTERVAL - refresh_interval(lock_timeout) / 2


def same_content(record: ReplicaRecord, before: ReplicaRecord | None) -> bool:
    """Whether ``record`` says what ``before`` said, but for when it was written."""
    if before is None:
        return False
    return replace(record, last_seen=before.last_seen, expires_at=before.expires_at) == before


def record_ttl(lock_timeout: float) -> float:
    """How long a record stays live after its last write: four record intervals (three
    may be missed), and never less than ``MIN_TTL``."""
    return max(4 * RECORD_INTERVAL, MIN_TTL)


@dataclass(frozen=True)
class RunningStep:
    """A step a replica was running at its last refresh; ``since``: when it was claimed."""

    collection: str
    id: str
    phase: str | None
    since: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "id": self.id,
            "phase": self.phase,
            "since": self.since.isoformat(),
        }


@dataclass(frozen=True)
class HandlerInfo:
    """A handler as its replica publishes it: operators' tools learn from these which
    phases the live replicas handle (a retry to another is refused), which handler a
    ``failedBy`` mark names, and what a pause of a handler can name."""

    collection: str
    phase: str | None
    name: str
    key: str
    failed_phase: str
    shard_key: tuple[str, ...] = ()
    """The collection's shard key as the handler declares it (operators' changes name it)."""
    global_limit: int | None = None
    """Its ``global_limit`` (steps at once across the replicas), None without one."""
    rate_limit: str | None = None
    """Its ``rate_limit`` as ``10/minute``, None without one."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "phase": self.phase,
            "name": self.name,
            "key": self.key,
            "failedPhase": self.failed_phase,
            "shardKey": list(self.shard_key),
            "globalLimit": self.global_limit,
            "rateLimit": self.rate_limit,
        }

    @classmethod
    def read(cls, doc: Mapping[str, Any]) -> HandlerInfo:
        phase = doc.get("phase")
        return cls(
            collection=str(doc["collection"]),
            phase=None if phase is None else str(phase),
            name=str(doc.get("name", "")),
            key=str(doc.get("key", "")),
            failed_phase=str(doc.get("failedPhase", "")),
            shard_key=tuple(str(k) for k in doc.get("shardKey") or ()),
            global_limit=_optional_int(doc.get("globalLimit")),
            rate_limit=None if doc.get("rateLimit") is None else str(doc["rateLimit"]),
        )


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as a replica declares it: its name and its spec as stored
    (``ScheduleSpec.stored()``), so that operators see which replicas declare which spec
    (a rolling deploy changes one)."""

    name: str
    stored: Mapping[str, Any] = field(hash=False)

    @property
    def shown(self) -> str:
        """The whole spec in one line (its fire times and policies), as compared."""
        try:
            spec = spec_of(self.name, self.stored)
        except ConfigError:
            return "an unreadable spec"
        return (
            f"{spec.describe()} into {spec.collection}, overlap {spec.overlap.value},"
            f" catch-up {spec.catch_up:g}s{', coalesced' if spec.coalesce else ''}"
            f", jitter {spec.jitter:g}s"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.shown}

    @classmethod
    def read(cls, value: Any) -> ScheduleInfo | None:
        """The entry ``value`` stores, or None for anything else (it is skipped)."""
        if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
            return None
        stored = value.get("spec")
        return cls(value["name"], dict(stored) if isinstance(stored, Mapping) else {})


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica as it recorded itself. Times are the server's (each replica's estimate
    of the server's clock, as for leases); ``instance`` tells apart two processes that
    were given the same ``replica_id``."""

    replica_id: str
    instance: str
    host: str
    pid: int
    version: str
    engine: str
    started: datetime
    last_seen: datetime
    expires_at: datetime
    lock_timeout: float
    tick: float
    max_concurrency: int
    steps: tuple[RunningStep, ...] = field(default_factory=tuple)
    handlers: tuple[HandlerInfo, ...] = ()
    unique: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Per collection, the keys ``submit`` keeps unique: its documents' business keys."""
    cancelled_phase: str = ""
    history: int = 0
    paused: tuple[str, ...] = ()
    """The pauses this replica honours (their scopes, as ``Scope.describe`` says them)."""
    claim_strategy: str = ""
    """How its claims find documents (``Settings.claim_strategy``; "" from versions
    before it was recorded), and how many candidates a peek reads."""
    claim_candidates: int = 0
    legacy_lock_timeout: float | None = None
    """The in-house pods' lock timeout whose leases it honours and writes
    (``Settings.legacy_lock_timeout``), None when it does not."""
    retention: tuple[tuple[str, str, float], ...] = ()
    """Its retention (``retain``): collection, phase and seconds, in order."""

    def retention_of(self, collection: str) -> Retention:
        """How long it keeps documents of ``collection`` in each retained phase."""
        return {phase: s for c, phase, s in self.retention if c == collection}

    schedules: tuple[ScheduleInfo, ...] = ()
    """The schedules it declares, with their specs (``disagreements`` compares them)."""

    def live(self, now: datetime) -> bool:
        """Whether the record is still live at ``now`` (the server's time)."""
        return self.expires_at > now

    def seen_ago(self, now: datetime) -> float:
        """Seconds since its last refresh, by the server's time (never negative)."""
        return max((now - self.last_seen).total_seconds(), 0.0)

    def stale(self, now: datetime) -> bool:
        """Silent past two record intervals: its record is still live, but it missed
        writes it should have made (it died, stalled or lost the database); its leases
        expire and other replicas take them over."""
        return self.seen_ago(now) > 2 * RECORD_INTERVAL

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> ReplicaRecord | None:
        """The record stored as ``doc`` (``replica_records.replica_document``), or None when it is
        not one (a document some other writer put there): a reader skips it, not fails."""
        try:
            steps = tuple(
                RunningStep(
                    collection=str(s["collection"]),
                    id=str(s["id"]),
                    phase=None if s.get("phase") is None else str(s["phase"]),
                    since=_utc(s["since"]),
                )
                for s in doc.get("steps") or ()
            )
            return cls(
                replica_id=str(doc["_id"]),
                instance=str(doc.get("instance", "")),
                host=str(doc.get("host", "")),
                pid=_int(doc.get("pid", 0)),
                version=str(doc.get("version", "")),
                engine=str(doc.get("engine", "")),
                started=_utc(doc["started"]),
                last_seen=_utc(doc["lastSeen"]),
                expires_at=_utc(doc["expiresAt"]),
                lock_timeout=_number(doc["lockTimeout"]),
                tick=_number(doc["tick"]),
                max_concurrency=_int(doc["maxConcurrency"]),
                steps=steps,
                handlers=tuple(HandlerInfo.read(h) for h in doc.get("handlers") or ()),
                unique=tuple(
                    (str(u["collection"]), tuple(str(k) for k in u["keys"]))
                    for u in doc.get("unique") or ()
                ),
                cancelled_phase=str(doc.get("cancelledPhase", "")),
                history=_int(doc.get("history", 0)),
                paused=tuple(str(p) for p in doc.get("paused") or ()),
                claim_strategy=str(doc.get("claimStrategy", "")),
                claim_candidates=_int(doc.get("claimCandidates", 0)),
                legacy_lock_timeout=_optional_number(doc.get("legacyLockTimeout")),
                retention=tuple(
                    (str(r["collection"]), str(r["phase"]), _number(r["seconds"]))
                    for r in doc.get("retention") or ()
                ),
                schedules=_schedules(doc.get("schedules")),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``orchestrator status --json``, the web page)."""
        return {
            "replica_id": self.replica_id,
            "instance": self.instance,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "engine": self.engine,
            "started": self.started.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "lock_timeout": self.lock_timeout,
            "tick": self.tick,
            "max_concurrency": self.max_concurrency,
            "steps": [s.to_dict() for s in self.steps],
            "handlers": [h.to_dict() for h in self.handlers],
            "unique": [{"collection": c, "keys": list(k)} for c, k in self.unique],
            "cancelled_phase": self.cancelled_phase,
            "history": self.history,
            "paused": list(self.paused),
            "claim_strategy": self.claim_strategy,
            "claim_candidates": self.claim_candidates,
            "legacy_lock_timeout": self.legacy_lock_timeout,
            "retention": [
                {"collection": c, "phase": p, "seconds": s, "shown": shown(s)}
                for c, p, s in self.retention
            ],
            "schedules": [s.to_dict() for s in self.schedules],
        }


def _schedules(value: Any) -> tuple[ScheduleInfo, ...]:
    """The schedules a record lists, its entries that are none skipped."""
    found = (ScheduleInfo.read(v) for v in value) if isinstance(value, list) else ()
    return tuple(info for info in found if info is not None)


@dataclass(frozen=True)
class ReplicaIdentity:
    """Who writes a record, fixed for a replica's run: the replica (``replica_id``), this
    process of it (``instance``, ``host``, ``pid``), what it runs (``version``,
    ``engine``) and since when (``started``)."""

    replica_id: str
    instance: str
    host: str
    pid: int
    version: str
    engine: str
    started: datetime


@dataclass(frozen=True)
class ReplicaSettings:
    """The settings a record publishes: those replicas are compared on
    (``disagreements``) and those operators' tools act by (the cancelled phase, the
    history kept, the in-house pods' lock timeout, the retention)."""

    lock_timeout: float
    tick: float
    max_concurrency: int
    cancelled_phase: str = ""
    history: int = 0
    claim_strategy: str = ""
    claim_candidates: int = 0
    legacy_lock_timeout: float | None = None
    retention: tuple[tuple[str, str, float], ...] = ()
    """Its collections' retention (``retain``), as ``ReplicaRecord.retention``."""

    @staticmethod
    def retained(kept: Mapping[str, Retention]) -> tuple[tuple[str, str, float], ...]:
        """``kept`` (per collection, ``Registry.retention``) as a record publishes it."""
        return tuple(
            sorted(
                (collection, phase, seconds)
                for collection, phases in kept.items()
                for phase, seconds in phases.items()
            )
        )


def new_record(  # noqa: PLR0913  what a record says, each keyword-only but the two parts
    identity: ReplicaIdentity,
    settings: ReplicaSettings,
    *,
    now: datetime,
    steps: Iterable[RunningStep] = (),
    handlers: Iterable[HandlerInfo] = (),
    unique: Iterable[tuple[str, tuple[str, ...]]] = (),
    paused: Iterable[str] = (),
    schedules: Iterable[ScheduleInfo] = (),
) -> ReplicaRecord:
    """A replica's record as of ``now`` (its estimate of the server's time), live for
    ``record_ttl(lock_timeout)``: who it is, what it runs with, and what it does now (the
    steps it runs, its handlers, the keys it keeps unique, the pauses it honours, how long
    it keeps documents of each retained phase, the schedules it declares)."""
    return ReplicaRecord(
        replica_id=identity.replica_id,
        instance=identity.instance,
        host=identity.host,
        pid=identity.pid,
        version=identity.version,
        engine=identity.engine,
        started=identity.started,
        last_seen=now,
        expires_at=now + timedelta(seconds=record_ttl(settings.lock_timeout)),
        lock_timeout=settings.lock_timeout,
        tick=settings.tick,
        max_concurrency=settings.max_concurrency,
        steps=tuple(sorted(steps, key=lambda s: (s.since, s.collection, s.id))),
        handlers=tuple(handlers),
        unique=tuple(sorted(unique)),
        cancelled_phase=settings.cancelled_phase,
        history=settings.history,
        paused=tuple(paused),
        claim_strategy=settings.claim_strategy,
        claim_candidates=settings.claim_candidates,
        legacy_lock_timeout=settings.legacy_lock_timeout,
        retention=settings.retention,
        schedules=tuple(sorted(schedules, key=lambda s: s.name)),
    )


def live(records: Iterable[ReplicaRecord], now: datetime) -> list[ReplicaRecord]:
    """The records still live at ``now``, by replica id: what the TTL monitor has not
    deleted yet may be past its expiry."""
    return sorted((r for r in records if r.live(now)), key=lambda r: r.replica_id)


@dataclass(frozen=True)
class Disagreement:
    """Live replicas that run with different values of one setting: ``values`` pairs each
    value (as shown) with the replicas that have it, most common first."""

    setting: str
    values: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def message(self) -> str:
        shown = "; ".join(f"{value} ({', '.join(ids)})" for value, ids in self.values)
        return f"replicas disagree on {self.setting}: {shown}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "values": {value: list(ids) for value, ids in self.values},
            "message": self.message,
        }


def disagreements(records: Iterable[ReplicaRecord]) -> list[Disagreement]:
    """The settings on which ``records`` differ, the lock timeout first, then the in-house
    pods' lock timeout (set on some replicas only: the others take those pods' leases and
    write leases they cannot read), the tick, the concurrency and the library's version;
    then the handlers' cluster-wide limits (``global_limit of KEY``, ``rate_limit of KEY``)
    that replicas running one handler disagree on, then the retention of each collection
    (``retention of NAME``) that replicas working on it disagree on; then the schedules
    whose spec the replicas declaring them disagree on (``schedule of NAME``: the stored
    spec fires, the one written by the replica started last).

    Mixed settings do not break leases (each lease carries its holder's expiry), but they
    are rarely meant: a rolling change left half done, or one deployment configured apart.
    The lock timeout matters most: it decides how long a dead replica's work waits.
    """
    rows = list(records)
    found: list[Disagreement] = []
    for setting in _TRACKED:
        groups: dict[Any, list[str]] = {}
        for record in rows:
            groups.setdefault(getattr(record, setting), []).append(record.replica_id)
        if len(groups) > 1:
            ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), _rank(item[0])))
            found.append(
                Disagreement(
                    setting, tuple((_shown(value), tuple(sorted(ids))) for value, ids in ordered)
                )
            )
    return (
        found
        + _limit_disagreements(rows)
        + _retention_disagreements(rows)
        + _schedule_disagreements(rows)
    )


_LIMITS = ("global_limit", "rate_limit")
"""The handlers' limits ``disagreements`` compares, per handler, after the settings."""


def _limit_disagreements(rows: list[ReplicaRecord]) -> list[Disagreement]:
    """Per handler key and limit, the replicas running that handler with different values
    of it (a replica without the handler does not disagree): a limit replicas disagree on
    is kept as the highest of them, since each takes only the slots its own count allows."""
    found: list[Disagreement] = []
    keys = sorted({h.key for record in rows for h in record.handlers})
    for setting in _LIMITS:
        for key in keys:
            groups: dict[str, list[str]] = {}
            for record in rows:
                for handler in record.handlers:
                    if handler.key == key:
                        value = getattr(handler, setting)
                        shown = "none" if value is None else str(value)
                        groups.setdefault(shown, []).append(record.replica_id)
            if len(groups) > 1:
                ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
                values = tuple((value, tuple(sorted(set(ids)))) for value, ids in ordered)
                found.append(Disagreement(f"{setting} of {key}", values))
    return found


def _retention_disagreements(rows: list[ReplicaRecord]) -> list[Disagreement]:
    """Per retained collection, the replicas working on it (a handler or a retention
    there) that keep its documents for different times: the write entering a phase dates
    it by its own replica's, so a document's life would depend on who moved it."""
    found: list[Disagreement] = []
    for collection in sorted({c for record in rows for c, _, _ in record.retention}):
        groups: dict[str, list[str]] = {}
        for record in rows:
            kept = record.retention_of(collection)
            if kept or any(h.collection == collection for h in record.handlers):
                groups.setdefault(describe(kept), []).append(record.replica_id)
        if len(groups) > 1:
            ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
            values = tuple((value, tuple(sorted(ids))) for value, ids in ordered)
            found.append(Disagreement(f"retention of {collection}", values))
    return found


def retention_of(records: Iterable[ReplicaRecord], collection: str) -> Retention:
    """The retention of ``collection`` most live replicas keep (the operators' moves date
    what they move into a retained phase by it); none when none keeps one."""
    seen: dict[tuple[tuple[str, float], ...], int] = {}
    for record in records:
        phases = tuple(sorted(record.retention_of(collection).items()))
        if phases:
            seen[phases] = seen.get(phases, 0) + 1
    if not seen:
        return {}
    best = min(seen, key=lambda phases: (-seen[phases], phases))
    return dict(best)


def _schedule_disagreements(rows: list[ReplicaRecord]) -> list[Disagreement]:
    """Per schedule, the replicas declaring it with different specs (a replica that does
    not declare it does not disagree)."""
    groups: dict[str, dict[str, list[str]]] = {}
    for record in rows:
        for info in record.schedules:
            groups.setdefault(info.name, {}).setdefault(info.shown, []).append(record.replica_id)
    found: list[Disagreement] = []
    for name in sorted(groups):
        specs = groups[name]
        if len(specs) > 1:
            ordered = sorted(specs.items(), key=lambda item: (-len(item[1]), item[0]))
            values = tuple((value, tuple(sorted(set(ids)))) for value, ids in ordered)
            found.append(Disagreement(f"schedule of {name}", values))
    return found


def _shown(value: Any) -> str:
    """A duration in seconds as ``30s``, an unset one as ``unset``, anything else as it is."""
    if value is None:
        return "unset"
    return f"{value:g}s" if isinstance(value, float) else str(value)


def _rank(value: Any) -> tuple[bool, Any]:
    """Values of one setting in order, an unset one (None) last."""
    return (value is None, 0 if value is None else value)


def _utc(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"not a date: {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def _optional_number(value: Any) -> float | None:
    return None if value is None else _number(value)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def handled_phases(records: Iterable[ReplicaRecord], collection: str) -> tuple[set[str], bool]:
    """The phases of ``collection`` some live replica handles, and whether one has a
    handler whose filter names no single phase (``when()``: it may take any)."""
    phases: set[str] = set()
    open_filter = False
    for record in records:
        for handler in record.handlers:
            if handler.collection != collection:
                continue
            if handler.phase is None:
                open_filter = True
            else:
                phases.add(handler.phase)
    return phases, open_filter


def resting_phases(records: Iterable[ReplicaRecord], collection: str) -> set[str]:
    """The phases of ``collection`` where the live replicas leave documents on purpose:
    their handlers' failed phases and their cancelled phase."""
    rest: set[str] = set()
    for record in records:
        if record.cancelled_phase:
            rest.add(record.cancelled_phase)
        rest.update(h.failed_phase for h in record.handlers if h.collection == collection)
    return rest


def business_keys(records: Iterable[ReplicaRecord], collection: str) -> list[tuple[str, ...]]:
    """The unique keys the live replicas keep for ``collection``, most replicas first."""
    seen: dict[tuple[str, ...], int] = {}
    for record in records:
        for name, keys in record.unique:
            if name == collection:
                seen[keys] = seen.get(keys, 0) + 1
    return sorted(seen, key=lambda keys: (-seen[keys], keys))


def shard_key(records: Iterable[ReplicaRecord], collection: str) -> tuple[str, ...]:
    """The shard key the live replicas' handlers declare for ``collection``, most handlers
    first; () when none declares one."""
    seen: dict[tuple[str, ...], int] = {}
    for record in records:
        for handler in record.handlers:
            if handler.collection == collection and handler.shard_key:
                seen[handler.shard_key] = seen.get(handler.shard_key, 0) + 1
    return min(seen, key=lambda key: (-seen[key], key)) if seen else ()


def handler_names(records: Iterable[ReplicaRecord]) -> dict[str, str]:
    """Handler key (what ``failedBy`` holds) to its ``module:function`` name."""
    return {h.key: h.name for record in records for h in record.handlers}
