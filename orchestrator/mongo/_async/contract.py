"""The lease side of the store: what the engine and its leases ask of the database.

A typed contract (APScheduler 4's ``abc.py`` is the model): each method says what it
returns and what may happen. ``AsyncStore`` is the implementation; the engine holds an
``AsyncLeaseStore``, so a misspelt call fails the type check. Every method may raise
``StoreError`` (the database unreachable, timed out, or answering nonsense), never a
driver error. The operators' side (status, browse, retry, unlock) has its own contract.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from orchestrator.core.documents import Document
from orchestrator.core.limits import Limit
from orchestrator.core.pauses import Pause
from orchestrator.core.queries.claims import ClaimRequest, Matches
from orchestrator.core.replicas import ReplicaRecord
from orchestrator.core.scheduler import Found
from orchestrator.core.sharding import ShardState

__all__ = ["AsyncLeaseStore"]


class AsyncLeaseStore(Protocol):
    """Claims, fenced writes, submits, the server's clock and the replicas' records."""

    async def server_time(self) -> datetime | None:
        """The server's clock (``hello``'s ``localTime``), or None if it gives none; raises
        ``StoreError`` for a server too old to be used."""

    def primary(self) -> Hashable:
        """The server a measurement of the clock reaches now, as the driver knows it; no
        I/O. A change (a failover) calls for a new measurement."""

    async def claim(
        self, name: str, request: ClaimRequest, seen: Callable[[Document], None] | None = None
    ) -> Document | None:
        """Atomically take the longest-free document of ``name`` that ``request.match``
        selects, whose lease is free at ``request.judged_at`` and that
        ``request.exclusion`` lets through, applying ``request.update``; the document as
        claimed, or None when there is none. Of replicas claiming at once exactly one gets
        each document. ``seen`` gets the document as it was before the claim. A lost reply
        may leave a claim applied: that lease expires. ``request.plan``: sorted, or
        peek-then-claim (with the shard key, targeted; ``auto`` from
        ``sharding.PEEK_FROM`` ``request.live`` replicas on); raises ``ShardKeyRequired``
        once for a sharded collection whose key is not declared (or not the one declared),
        and then claims nothing more there (None, no round trip)."""

    async def shard_state(self, name: str) -> ShardState:
        """Whether ``name`` is sharded, and on what, as the server tells (asked once)."""

    async def probe(
        self,
        groups: Sequence[tuple[str, Matches]],
        now: datetime,
        horizon: float,
        pauses_collection: str | None = None,
        replicas_collection: str | None = None,
        *,
        known: frozenset[int] = frozenset(),
    ) -> Found:
        """For (collection, its handlers' (match, exclusion) pairs) groups: the handlers
        (numbered across the groups in order) that would claim a document now (where the
        server cannot tell them apart, every handler of a collection with work), and the
        earliest time a document they select comes due after ``now`` (None when the
        server cannot say), and with ``pauses_collection`` the operators' pauses (None
        when it cannot read them with the rest), with ``replicas_collection`` how many
        replicas are live (None when it cannot count them); one read if the server can
        (``$unionWith``), else one per collection; never a write. ``known``: handlers
        (numbered so) known to have work: not asked, never in the answer's ready; their
        documents' due times are (a collection all of whose handlers are known costs no
        read of its own where the server cannot join them)."""

    async def carry(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document | None:
        """A fenced update that takes the lease on for the next step: the document as it
        left it, or None when ``query`` matched nothing. A lost reply may leave it applied
        (that lease expires unused)."""

    async def write(self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]) -> bool:
        """A fenced update; False when ``query`` matched nothing (the lease is not the
        writer's any more). A lost reply may leave it applied."""

    async def delete(self, name: str, query: Mapping[str, Any]) -> bool:
        """A fenced delete; False when ``query`` matched nothing."""

    async def insert(self, name: str, doc: Document, unique: Sequence[str]) -> Document:
        """Create ``doc`` unless one with the same ``unique`` keys exists; the document
        stored. Concurrent calls with one key make one document."""

    async def find_ids(self, name: str, query: Mapping[str, Any], most: int) -> list[Any]:
        """The ``_id`` of at most ``most`` documents ``query`` selects (a schedule's runs)."""

    async def find_fields(
        self, name: str, query: Mapping[str, Any], fields: Sequence[str], most: int
    ) -> list[Document]:
        """At most ``most`` documents ``query`` selects, with ``_id`` and ``fields`` only (a
        parent's children, as its wait counts them)."""

    async def update_and_read(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any], fields: Sequence[str]
    ) -> Document | None:
        """Update the one document ``query`` selects; it as updated (``_id`` and
        ``fields``), or None when none matched (a child's end added to its parent's wait)."""

    async def run_fires(self, name: str, query: Mapping[str, Any], most: int) -> list[datetime]:
        """The fire times (``scheduled.fire``, aware) of at most ``most`` documents
        ``query`` selects, earliest first; a document without a date there is skipped."""

    async def write_many(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> int:
        """An update of every document ``query`` selects (a schedule cancelling its previous
        runs); how many it changed. A lost reply may leave it applied."""

    async def ensure_claim_index(self, name: str) -> str:
        """The index serving the claim (an equivalent one under any name, or a new one);
        its name."""

    async def ensure_unique(self, name: str, keys: Sequence[str]) -> None:
        """A unique index on ``keys`` (made once per store)."""

    async def ensure_replica_index(self, name: str) -> str:
        """The TTL index that deletes the records of replicas that died; its name."""

    async def record_replica(self, record: ReplicaRecord, name: str) -> str | None:
        """Write this replica's record whole; the ``instance`` of the record it replaced,
        or None when there was none."""

    async def remove_replica(self, replica_id: str, instance: str, name: str) -> bool:
        """Delete this process's record of ``replica_id``; False if it was not there."""

    async def ensure_errors_index(self, name: str) -> str:
        """The index serving the latest errors of each phase (``operators.ERRORS_INDEX``);
        its name."""

    async def ensure_schedule_runs_index(self, name: str) -> str:
        """The index serving a schedule's look for its runs (``schedules.RUNS_INDEX``);
        its name."""

    async def ensure_owner_index(self, name: str) -> None:
        """The index serving a parent's look for its children (``trees.OWNER_INDEX``),
        made once per store."""

    async def ensure_retention_index(self, name: str) -> str:
        """The TTL index deleting documents past their retention
        (``retention.RETENTION_INDEX``); its name."""

    async def read_pauses(self, name: str) -> list[Pause]:
        """The operators' pauses in force; a document that is no pause is skipped."""

    async def append_audit(self, name: str, entry: Mapping[str, Any]) -> None:
        """Add ``entry`` to the audit trail (``audit``), making its TTL index first if
        this store has not yet."""

    async def ensure_slots(self, name: str, key: str, limit: Limit) -> None:
        """The slots of ``limit`` of the handler ``key`` in ``name`` (``limit_slots.
        slot_documents``) and their index, made once per store; slots already there are
        kept as they are."""

    async def take_slot(
        self,
        name: str,
        key: str,
        limit: Limit,
        judged_at: datetime,
        update: Mapping[str, Any],
    ) -> Document | None:
        """Atomically take a slot of ``limit`` free at ``judged_at`` with ``update``; the
        slot as it was before (``_id``, ``until``, ``token``), or None when none is free.
        Of replicas taking at once, each gets its own slot."""

    async def next_slot(self, name: str, key: str, limit: Limit) -> datetime | None:
        """When the next slot of ``limit`` comes free (its earliest ``until``), or None."""
