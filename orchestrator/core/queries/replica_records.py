"""Sent by a replica about itself (its record, refreshed with its heartbeat, removed when
it stops) and by whoever asks which replicas are live (the probe, the operators' tools).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from orchestrator.core.clock import bson_time

if TYPE_CHECKING:
    from orchestrator.core.replicas import ReplicaRecord


REPLICA_INDEX: list[tuple[str, int]] = [("expiresAt", 1)]
"""The TTL index of the replicas' records: each record carries its own expiry, so one
index with ``expireAfterSeconds: 0`` serves replicas with any settings."""


REPLICA_INDEX_EXPIRY = 0
"""Seconds past ``expiresAt`` after which the server deletes a record (at its TTL
monitor's next pass, within a minute)."""


REPLICAS_SORT: list[tuple[str, int]] = [("_id", 1)]


def replica_document(record: ReplicaRecord) -> dict[str, Any]:
    """A replica's record as stored, replacing the last one whole (``_id``: the replica
    id), so no field of an earlier version or setting lingers."""
    return {
        "_id": record.replica_id,
        "instance": record.instance,
        "host": record.host,
        "pid": record.pid,
        "version": record.version,
        "engine": record.engine,
        "started": bson_time(record.started),
        "lastSeen": bson_time(record.last_seen),
        "expiresAt": bson_time(record.expires_at),
        "lockTimeout": record.lock_timeout,
        "legacyLockTimeout": record.legacy_lock_timeout,
        "tick": record.tick,
        "maxConcurrency": record.max_concurrency,
        "steps": [
            {"collection": s.collection, "id": s.id, "phase": s.phase, "since": bson_time(s.since)}
            for s in record.steps
        ],
        "handlers": [h.to_dict() for h in record.handlers],
        "unique": [{"collection": c, "keys": list(k)} for c, k in record.unique],
        "cancelledPhase": record.cancelled_phase,
        "history": record.history,
        "paused": list(record.paused),
        "claimStrategy": record.claim_strategy,
        "claimCandidates": record.claim_candidates,
        "retention": [{"collection": c, "phase": p, "seconds": s} for c, p, s in record.retention],
        "schedules": [{"name": s.name, "spec": dict(s.stored)} for s in record.schedules],
    }


REPLICA_INSTANCE_PROJECTION: dict[str, Any] = {"_id": 0, "instance": 1}
"""What a refresh reads back of the record it replaces: who wrote it."""


def replica_filter(replica_id: str) -> dict[str, Any]:
    return {"_id": replica_id}


def replica_removal(replica_id: str, instance: str) -> dict[str, Any]:
    """A stopping replica's own record only: another process started with the same
    replica id (a restarted pod) keeps the one it wrote since."""
    return {"_id": replica_id, "instance": instance}


def live_replicas_filter(now: datetime) -> dict[str, Any]:
    """Records not yet expired at ``now`` (the server's time): the TTL monitor runs once a
    minute, so an expired record may still be there."""
    return {"expiresAt": {"$gt": bson_time(now)}}
