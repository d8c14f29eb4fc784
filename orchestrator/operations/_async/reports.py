"""The operator's side of the store: the reports and the operator's changes, through PyMongo.

The engine never asks these; the operator's tools do (``orchestrator.operations``: the
command line, the page, the metrics collector). ``AsyncReportStore`` is their contract,
``AsyncReports`` keeps it on PyMongo's async API, and ``ReportStore``/``Reports``
(``orchestrator/operations/_sync/reports.py``) are generated from them by
``scripts/synchro.py``, as the lease side's ``Store`` is from ``AsyncStore``.

``AsyncReports`` reads through an ``AsyncStore`` of its own, so its documents come back as
the engine's do (aware UTC dates, whatever the client's codec options), its change waits
for the same write concern, and its clock is the one the replicas judge leases by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core import audit, replicas
from orchestrator.core.audit import AuditEntry, AuditKind
from orchestrator.core.documents import Document
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.names import REPLICAS_COLLECTION, UNIQUE_PREFIX
from orchestrator.core.pauses import Pause, Scope
from orchestrator.core.queries import operators, replica_records
from orchestrator.core.queries import trees as tree_queries
from orchestrator.core.replicas import ReplicaRecord
from orchestrator.core.sharding import ShardState
from orchestrator.mongo import AsyncStore
from orchestrator.mongo.driver_errors import driver_errors
from orchestrator.operations.filters import LIST_PROJECTION, Plan
from orchestrator.operations.status_report import PhaseCount, RecentError

__all__ = ["AsyncReportStore", "AsyncReports"]


class AsyncReportStore(Protocol):
    """What the operator's tools need of the store, and what each call promises.

    Each call is one round trip (a status report costs one per collection, whatever its
    size). Reads are plain reads outside any lease: what they return may be changed by a
    holder at once, so an operator's change is guarded by what was read
    (``operators.operator_guard``), never decided on the read alone. Any driver failure
    leaves as ``StoreError``, with ``transient`` saying whether a retry may succeed.
    """

    async def server_time(self) -> datetime | None:
        """The server's clock, by which the replicas judge leases.

        :return: the server's time as an aware UTC datetime, or None when the server
            reports none (then the caller judges by its own clock, and says so)
        :raises StoreError: the server cannot be asked, or is older than
            ``connection.MIN_SERVER_VERSION``
        """
        ...

    async def collection_names(self) -> list[str]:
        """The database's collections.

        :return: their names, sorted, without the server's own (``system.*``)
        :raises StoreError: the database cannot be listed
        """
        ...

    async def phase_summary(
        self,
        name: str,
        now: datetime,
        match: Mapping[str, Any] | None = None,
        *,
        in_house: InHouse = NO_IN_HOUSE,
    ) -> list[PhaseCount]:
        """Documents per phase and lease state at ``now``, in one aggregation
        (``operators.status_pipeline``).

        :param name: the collection
        :param now: the server's time: leases are judged by their own expiry against it
        :param match: narrows the count (to one document, for the operator's page)
        :param in_house: the in-house leases the live replicas honour: they count
        :return: one count per phase holding documents, in no promised order; none for a
            collection that is empty or absent
        :raises StoreError: the aggregation failed
        """
        ...

    async def latest_errors(
        self,
        name: str,
        limit: int,
        phases: Sequence[str],
        keys: Sequence[tuple[str, ...]] = (),
    ) -> list[RecentError]:
        """The documents of ``phases`` carrying an error, most recent error first, read
        through ``operators.ERRORS_INDEX`` (hinted: never a collection scan).

        :param name: the collection
        :param limit: at most this many
        :param phases: the collection's phases (``phase_summary``'s)
        :param keys: the collection's business keys, read too and shown beside each id
        :return: each document's last error as a report shows it (the documents are read
            with only the fields a report needs: a document may be large, its error small)
        :raises StoreError: the read failed
        """
        ...

    async def live_replicas(
        self, now: datetime, name: str = REPLICAS_COLLECTION
    ) -> list[ReplicaRecord]:
        """The replicas that recorded themselves and are live at ``now``.

        :param now: the server's time (``server_time()``): a record past its expiry is not
            listed, even if the TTL monitor has not deleted it yet
        :param name: the replicas' collection (their ``replicas_collection`` setting)
        :return: the records, by replica id; a document that is not a record is skipped
        :raises StoreError: the read failed
        """
        ...

    async def phases(self, name: str) -> list[str]:
        """The phases ``name``'s documents are in (``distinct``, served by the claim index).

        :raises StoreError: the read failed
        """
        ...

    async def index_keys(self, name: str) -> list[list[tuple[str, Any]]]:
        """The key patterns of ``name``'s indexes (none for an absent collection).

        :raises StoreError: the listing failed
        """
        ...

    async def unique_keys(self, name: str) -> list[tuple[str, ...]]:
        """The fields of ``name``'s unique indexes but ``_id``'s, ``submit``'s first
        (``orchestrator_unique_*``): its documents' business keys.

        :raises StoreError: the listing failed
        """
        ...

    async def browse(self, name: str, plan: Plan, limit: int) -> list[Document]:
        """A page of documents: ``plan``'s query in its order through its hinted index,
        without their history (``filters.LIST_PROJECTION``).

        :raises StoreError: the read failed (a missing index among them: the hint names
            an index the collection does not have)
        """
        ...

    async def count(self, name: str, plan: Plan, limit: int) -> int:
        """How many documents ``plan`` selects, counted up to ``limit`` through its index.

        :raises StoreError: the count failed
        """
        ...

    async def ensure_indexes(self, name: str) -> None:
        """The indexes every list of ``name`` is served by (the claim index and the
        errors index), made if missing: the replicas make them at start, and a tool
        meeting a collection before its replicas were upgraded makes them itself.

        :raises StoreError: listing or making them failed
        """
        ...

    async def read_pauses(self, name: str) -> list[Pause]:
        """The pauses in force (``pauses``).

        :raises StoreError: the read failed
        """
        ...

    async def write_pause(self, name: str, pause: Pause, at: datetime) -> bool:
        """Record ``pause`` (one per scope); False when it was in force already (its
        first author and time are kept).

        :raises StoreError: the write failed
        """
        ...

    async def remove_pause(self, name: str, scope: Scope) -> bool:
        """End the pause of ``scope``; False when there was none.

        :raises StoreError: the write failed
        """
        ...

    async def append_audit(self, name: str, entry: Mapping[str, Any]) -> None:
        """Add ``entry`` to the audit trail (``audit``).

        :raises StoreError: the write failed
        """
        ...

    async def read_audit(
        self, name: str, limit: int, kind: AuditKind | None = None, keys: Sequence[str] = ()
    ) -> list[AuditEntry]:
        """The latest ``limit`` entries of the audit trail (of ``kind`` only, if given;
        naming a document by one of the business keys ``keys`` only, if given), latest
        first.

        :raises StoreError: the read failed
        """
        ...

    async def find_one(self, name: str, query: Mapping[str, Any]) -> Document | None:
        """One document, read outside any lease.

        :param name: the collection
        :param query: a filter (``operators.exact_id_filter``, ``operators.id_filter``)
        :return: the first document it matches, or None
        :raises StoreError: the read failed
        """
        ...

    async def find_many(
        self,
        name: str,
        query: Mapping[str, Any],
        sort: Sequence[tuple[str, int]],
        limit: int,
        projection: Mapping[str, Any] | None = None,
    ) -> list[Document]:
        """Up to ``limit`` documents of ``name`` that ``query`` selects, in ``sort``'s order
        (``projection``: their fields read, all when None)."""
        ...

    async def child_phases(self, name: str, owner: str, owner_id: Any) -> list[tuple[Any, int]]:
        """How many children of ``name`` the document ``owner_id`` of ``owner`` owns, per
        phase, in one aggregation (``queries.trees.children_phases_pipeline``).

        :return: (phase as stored, count) pairs, in no promised order
        :raises StoreError: the aggregation failed
        """
        ...

    async def shard_state(self, name: str) -> ShardState:
        """Whether ``name`` is sharded, and on what, as the server tells (asked once per
        collection; ``UNKNOWN`` when this user may not read it).

        :raises StoreError: never for a refusal to tell; only as the store's reads do
        """
        ...

    async def operator_update(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document | None:
        """An operator's change to one document, not fenced by any lease: an operator acts
        from outside (a retry, a forced unlock) and wins over the holder, whose next fenced
        write then fails with ``LeaseLost``.

        :param name: the collection
        :param query: which document, as the operator saw it (``operators.operator_guard``)
        :param update: the change (``lease_writes.release_update``,
            ``operators.operator_move_update``)
        :return: the document after the change, or None when ``query`` matched nothing
            (the document is gone, or no longer as the operator saw it)
        :raises StoreError: the write failed, or no majority acknowledged it within the
            write timeout (``transient``: it may have applied)
        :raises ShardKeyRequired: the collection is sharded and ``query`` does not name its
            shard key (a server before 8.0 refuses such a change)
        """
        ...


class AsyncReports:
    """``AsyncReportStore`` on PyMongo's async API, for one database.

    ``write_concern`` and ``write_timeout`` are the operator's change's, as ``AsyncStore``
    takes them.
    """

    def __init__(
        self,
        db: AsyncDatabase[Document],
        write_concern: str | int = "majority",
        write_timeout: float = 10.0,
    ) -> None:
        self._store = AsyncStore(db, write_concern, write_timeout)

    async def server_time(self) -> datetime | None:
        return await self._store.server_time()

    async def collection_names(self) -> list[str]:
        with driver_errors("list collections"):
            names = await self._store.database.list_collection_names()
        return sorted(n for n in names if not n.startswith("system."))

    async def phase_summary(
        self,
        name: str,
        now: datetime,
        match: Mapping[str, Any] | None = None,
        *,
        in_house: InHouse = NO_IN_HOUSE,
    ) -> list[PhaseCount]:
        with driver_errors(f"summarise {name}"):
            cursor = await self._store.collection(name).aggregate(
                operators.status_pipeline(now, match, in_house)
            )
            rows = await cursor.to_list()
        return [PhaseCount.from_row(name, row) for row in rows]

    async def latest_errors(
        self,
        name: str,
        limit: int,
        phases: Sequence[str],
        keys: Sequence[tuple[str, ...]] = (),
    ) -> list[RecentError]:
        if not phases or limit <= 0:
            return []
        projection = {**operators.ERRORS_PROJECTION, **{f: 1 for key in keys for f in key}}
        with driver_errors(f"read errors of {name}"):
            cursor = self._store.collection(name).find(operators.errors_filter(phases), projection)
            cursor = cursor.sort(operators.ERRORS_SORT).hint(operators.ERRORS_INDEX)
            docs = await cursor.limit(limit).to_list()
        return [RecentError.from_document(name, doc, keys) for doc in docs]

    async def phases(self, name: str) -> list[str]:
        with driver_errors(f"read the phases of {name}"):
            found = await self._store.collection(name).distinct("phase")
        return sorted(p for p in found if isinstance(p, str))

    async def index_keys(self, name: str) -> list[list[tuple[str, Any]]]:
        with driver_errors(f"list indexes of {name}"):
            cursor = await self._store.collection(name).list_indexes()
            infos = await cursor.to_list()
        return [list(dict(info["key"]).items()) for info in infos if "key" in info]

    async def unique_keys(self, name: str) -> list[tuple[str, ...]]:
        with driver_errors(f"list indexes of {name}"):
            cursor = await self._store.collection(name).list_indexes()
            infos = await cursor.to_list()
        unique = [
            (not str(info.get("name", "")).startswith(UNIQUE_PREFIX), tuple(dict(info["key"])))
            for info in infos
            if info.get("unique") and "key" in info and info.get("name") != "_id_"
        ]
        return [keys for _, keys in sorted(unique)]

    async def browse(self, name: str, plan: Plan, limit: int) -> list[Document]:
        with driver_errors(f"browse {name}"):
            cursor = self._store.collection(name).find(plan.query, LIST_PROJECTION)
            cursor = cursor.sort(plan.sort).hint(plan.hint).limit(limit)
            return await cursor.to_list()

    async def count(self, name: str, plan: Plan, limit: int) -> int:
        with driver_errors(f"count in {name}"):
            return await self._store.collection(name).count_documents(
                plan.query, hint=plan.hint, limit=limit
            )

    async def ensure_indexes(self, name: str) -> None:
        await self._store.ensure_claim_index(name)
        await self._store.ensure_errors_index(name)

    async def read_pauses(self, name: str) -> list[Pause]:
        return await self._store.read_pauses(name)

    async def write_pause(self, name: str, pause: Pause, at: datetime) -> bool:
        doc = pause.document(at)
        with driver_errors(f"pause in {name}"):
            result = await self._store.collection(name).update_one(
                {"_id": doc["_id"]}, {"$setOnInsert": doc}, upsert=True
            )
        return result.upserted_id is not None

    async def remove_pause(self, name: str, scope: Scope) -> bool:
        with driver_errors(f"resume in {name}"):
            result = await self._store.collection(name).delete_one({"_id": scope.key})
        return result.deleted_count > 0

    async def append_audit(self, name: str, entry: Mapping[str, Any]) -> None:
        await self._store.append_audit(name, entry)

    async def read_audit(
        self, name: str, limit: int, kind: AuditKind | None = None, keys: Sequence[str] = ()
    ) -> list[AuditEntry]:
        query = operators.audit_filter(None if kind is None else kind.value, keys)
        with driver_errors(f"read the audit trail {name}"):
            cursor = self._store.collection(name).find(query).sort(audit.AUDIT_SORT)
            docs = await cursor.limit(limit).to_list()
        return [AuditEntry.read(doc) for doc in docs]

    async def live_replicas(
        self, now: datetime, name: str = REPLICAS_COLLECTION
    ) -> list[ReplicaRecord]:
        with driver_errors(f"read replicas from {name}"):
            cursor = self._store.collection(name).find(replica_records.live_replicas_filter(now))
            docs = await cursor.sort(replica_records.REPLICAS_SORT).to_list()
        parsed = (ReplicaRecord.from_document(doc) for doc in docs)
        return replicas.live((r for r in parsed if r is not None), now)

    async def find_one(self, name: str, query: Mapping[str, Any]) -> Document | None:
        with driver_errors(f"read from {name}"):
            return await self._store.collection(name).find_one(dict(query))

    async def find_many(
        self,
        name: str,
        query: Mapping[str, Any],
        sort: Sequence[tuple[str, int]],
        limit: int,
        projection: Mapping[str, Any] | None = None,
    ) -> list[Document]:
        with driver_errors(f"read from {name}"):
            cursor = self._store.collection(name).find(
                dict(query), None if projection is None else dict(projection)
            )
            return await cursor.sort(list(sort)).limit(limit).to_list()

    async def child_phases(self, name: str, owner: str, owner_id: Any) -> list[tuple[Any, int]]:
        with driver_errors(f"count the children in {name}"):
            cursor = await self._store.collection(name).aggregate(
                tree_queries.children_phases_pipeline(owner, owner_id)
            )
            rows = await cursor.to_list()
        return [(row.get("_id"), int(row.get("count", 0))) for row in rows]

    async def shard_state(self, name: str) -> ShardState:
        return await self._store.shard_state(name)

    async def operator_update(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document | None:
        with driver_errors(f"update {name}", (name, None)):
            return await self._store.collection(name).find_one_and_update(
                dict(query), dict(update), return_document=ReturnDocument.AFTER
            )
