"""This replica's record in the replicas collection, for operators: who runs, since when,
with which settings and which steps. Written at ``start()``, then at a heartbeat every
``replicas.RECORD_INTERVAL`` while started (an idle replica's only write), and removed at
``stop()``; the sync twin is generated (``scripts/synchro.py``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from orchestrator.core import limits, replicas
from orchestrator.core.distribution import library_version
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.registry import Registry
from orchestrator.runners._async.parts import AsyncReplicaParts

__all__ = ["AsyncReplicaRecorder"]


class AsyncReplicaRecorder:
    """Keeps this process's record of ``settings.replica_id``. Never raises: the record is
    for operators, and a replica that cannot write it still runs its steps. A failure is
    logged and counted (``replica_errors``), and the next heartbeat writes again."""

    def __init__(
        self,
        parts: AsyncReplicaParts,
        *,
        engine: str,
        registry: Registry,
        paused: Callable[[], list[str]],
        schedules: Callable[[], list[tuple[str, Mapping[str, Any]]]],
    ) -> None:
        self._store = parts.store
        self._clock = parts.clock
        self._settings = parts.settings
        self._books = parts.books
        self._report = parts.report
        self._engine = engine
        self._registry = registry
        self._paused = paused
        self._schedules = schedules
        self._lock = threading.Lock()  # the flags below, read and set from any worker
        self.instance = secrets.token_hex(8)
        """This process's record, not a namesake's."""
        self._recording = False  # the record is kept (start() until stop())
        self._recorded = False  # the record was written since start()
        self._started_at: datetime | None = None
        self._indexed = False  # the records' TTL index was made
        self._written: datetime | None = None  # when the record was last written
        self._content: replicas.ReplicaRecord | None = None  # what it said then

    def record(self, now: datetime) -> replicas.ReplicaRecord:
        """This replica as it records itself at ``now``, with the steps it runs."""
        steps = [
            replicas.RunningStep(
                collection=step.lease.collection,
                id=str(step.lease.id),
                phase=step.lease.phase,
                since=step.lease.claimed_at,
            )
            for step in self._books.running()
        ]
        settings = self._settings
        with self._lock:
            started = self._started_at or now
        identity = replicas.ReplicaIdentity(
            replica_id=settings.replica_id,
            instance=self.instance,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=library_version(),
            engine=self._engine,
            started=started,
        )
        published = replicas.ReplicaSettings(
            lock_timeout=settings.lock_timeout,
            tick=settings.tick,
            max_concurrency=settings.max_concurrency,
            cancelled_phase=settings.cancelled_phase,
            history=settings.history,
            claim_strategy=settings.claim_strategy,
            claim_candidates=settings.claim_candidates,
            legacy_lock_timeout=settings.legacy_lock_timeout,
            retention=replicas.ReplicaSettings.retained(dict(self._registry.retention)),
        )
        return replicas.new_record(
            identity,
            published,
            now=now,
            steps=steps,
            handlers=[
                replicas.HandlerInfo(
                    h.collection,
                    h.phase,
                    h.name,
                    h.key,
                    h.failed_phase,
                    h.shard_key,
                    *limits.published(h.limits),
                )
                for h in self._registry.handlers
            ],
            unique=[
                (collection, keys)
                for collection, key_sets in list(self._registry.unique.items())
                for keys in tuple(key_sets)
            ],
            paused=self._paused(),
            schedules=[replicas.ScheduleInfo(name, spec) for name, spec in self._schedules()],
        )

    async def begin(self) -> None:
        """``start()``'s first record, written before the first tick: a started replica is
        listed before it runs any step."""
        with self._lock:
            self._recording = True
            self._recorded = False
            self._written = None
            self._content = None
            self._started_at = self._clock.now()
        await self.refresh()

    async def refresh(self) -> None:
        """Write the record (while started), when what it says changed (the steps running,
        the pauses honoured...) or ``RECORD_INTERVAL`` has passed since the last write: an
        idle replica writes it every ``RECORD_INTERVAL``, a busy one as its steps change."""
        with self._lock:
            recording = self._recording
            last = self._written
        if not recording or not self._clock.measured:
            return
        now = self._clock.now()
        record = self.record(now)
        since = None if last is None else (now - last).total_seconds()
        if (
            since is not None
            and since >= 0  # a clock gone back writes at once: it cannot wait for it
            and not replicas.record_due(since, self._settings.lock_timeout)
            and replicas.same_content(record, self._content)
        ):
            return  # nothing new to say (an idle replica): written every RECORD_INTERVAL
        name = self._settings.replicas_collection
        try:
            if not self._indexed:
                await self._store.ensure_replica_index(name)
                self._indexed = True
            previous = await self._store.record_replica(record, name)
        except OrchestratorError as exc:
            self._books.count("replica_errors")
            self._report.line(
                self._report.trouble(logging.WARNING, exc),
                f"could not record this replica in {name} (the next heartbeat tries again): {exc}",
                "replica-unrecorded",
            )
            return
        self._books.count("replica_records")
        with self._lock:
            self._written = now
            self._content = record
            stopped = not self._recording
            # Another process wrote under this replica id since this one's last record
            # (a dead namesake cannot: its record is only there before the first write).
            namesake = self._recorded and previous not in (None, self.instance)
            self._recorded = True
        if namesake:
            self._books.count("replica_namesakes")
            self._report.line(
                logging.WARNING,
                f"another live process records itself as replica {self._settings.replica_id!r}:"
                " give each replica its own replica_id (leases name their holder by it)",
                "replica-namesake",
            )
        if stopped:  # stop() removed the record while this write was on its way
            await self._remove()

    async def forget(self) -> None:
        """Stop keeping the record, and delete it: a stopped replica is not listed."""
        with self._lock:
            if not self._recording:
                return
            self._recording = False
        await self._remove()

    async def _remove(self) -> None:
        name, replica_id = self._settings.replicas_collection, self._settings.replica_id
        try:
            await self._store.remove_replica(replica_id, self.instance, name)
        except OrchestratorError as exc:
            self._books.count("replica_errors")
            self._report.line(
                self._report.trouble(logging.WARNING, exc),
                f"could not remove this replica's record from {name}; it expires on its own: {exc}",
                "replica-unrecorded",
            )
