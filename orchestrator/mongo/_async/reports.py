"""The operator's side of the store: the reports and the operator's changes, through PyMongo.

The engine never asks these; the operator's tools do (``orchestrator.operations``: the
command line, the page, the metrics collector). ``AsyncReportStore`` is their contract,
``AsyncReports`` keeps it on PyMongo's async API, and ``ReportStore``/``Reports``
(``orchestrator/mongo/_sync/reports.py``) are generated from them by
``scripts/synchro.py``, as the lease side's ``Store`` is from ``AsyncStore``.

``AsyncReports`` reads through an ``AsyncStore`` of its own, so its documents come back as
the engine's do (aware UTC dates, whatever the client's codec options), its change waits
for the same write concern, and its clock is the one the replicas judge leases by.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core import queries, replicas
from orchestrator.core.replicas import REPLICAS_COLLECTION, ReplicaRecord
from orchestrator.core.status import PhaseCount, RecentError
from orchestrator.mongo._async.store import AsyncStore
from orchestrator.mongo.common import Document, driver_errors

__all__ = ["AsyncReportStore", "AsyncReports"]


class AsyncReportStore(Protocol):
    """What the operator's tools need of the store, and what each call promises.

    Each call is one round trip (a status report costs one per collection, whatever its
    size). Reads are plain reads outside any lease: what they return may be changed by a
    holder at once, so an operator's change is guarded by what was read
    (``queries.operator_guard``), never decided on the read alone. Any driver failure
    leaves as ``StoreError``, with ``transient`` saying whether a retry may succeed.
    """

    async def server_time(self) -> datetime | None:
        """The server's clock, by which the replicas judge leases.

        :return: the server's time as an aware UTC datetime, or None when the server
            reports none (then the caller judges by its own clock, and says so)
        :raises StoreError: the server cannot be asked, or is older than
            ``common.MIN_SERVER_VERSION``
        """
        ...

    async def collection_names(self) -> list[str]:
        """The database's collections.

        :return: their names, sorted, without the server's own (``system.*``)
        :raises StoreError: the database cannot be listed
        """
        ...

    async def phase_summary(
        self, name: str, now: datetime, match: Mapping[str, Any] | None = None
    ) -> list[PhaseCount]:
        """Documents per phase and lease state at ``now``, in one aggregation
        (``queries.status_pipeline``).

        :param name: the collection
        :param now: the server's time: leases are judged by their own expiry against it
        :param match: narrows the count (to one document, for the operator's page)
        :return: one count per phase holding documents, in no promised order; none for a
            collection that is empty or absent
        :raises StoreError: the aggregation failed
        """
        ...

    async def latest_errors(self, name: str, limit: int) -> list[RecentError]:
        """The documents carrying an error, most recent error first.

        :param name: the collection
        :param limit: at most this many
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

    async def find_one(self, name: str, query: Mapping[str, Any]) -> Document | None:
        """One document, read outside any lease.

        :param name: the collection
        :param query: a filter (``queries.exact_id_filter``, ``queries.id_filter``)
        :return: the first document it matches, or None
        :raises StoreError: the read failed
        """
        ...

    async def operator_update(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document | None:
        """An operator's change to one document, not fenced by any lease: an operator acts
        from outside (a retry, a forced unlock) and wins over the holder, whose next fenced
        write then fails with ``LeaseLost``.

        :param name: the collection
        :param query: which document, as the operator saw it (``queries.operator_guard``)
        :param update: the change (``queries.release_update``,
            ``queries.operator_retry_update``)
        :return: the document after the change, or None when ``query`` matched nothing
            (the document is gone, or no longer as the operator saw it)
        :raises StoreError: the write failed, or no majority acknowledged it within the
            write timeout (``transient``: it may have applied)
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
        self, name: str, now: datetime, match: Mapping[str, Any] | None = None
    ) -> list[PhaseCount]:
        with driver_errors(f"summarise {name}"):
            cursor = await self._store.collection(name).aggregate(
                queries.status_pipeline(now, match)
            )
            rows = await cursor.to_list()
        return [PhaseCount.from_row(name, row) for row in rows]

    async def latest_errors(self, name: str, limit: int) -> list[RecentError]:
        with driver_errors(f"read errors of {name}"):
            cursor = self._store.collection(name).find(
                queries.errors_filter(), queries.ERRORS_PROJECTION
            )
            docs = await cursor.sort(queries.ERRORS_SORT).limit(limit).to_list()
        return [RecentError.from_document(name, doc) for doc in docs]

    async def live_replicas(
        self, now: datetime, name: str = REPLICAS_COLLECTION
    ) -> list[ReplicaRecord]:
        with driver_errors(f"read replicas from {name}"):
            cursor = self._store.collection(name).find(queries.live_replicas_filter(now))
            docs = await cursor.sort(queries.REPLICAS_SORT).to_list()
        parsed = (ReplicaRecord.from_document(doc) for doc in docs)
        return replicas.live((r for r in parsed if r is not None), now)

    async def find_one(self, name: str, query: Mapping[str, Any]) -> Document | None:
        with driver_errors(f"read from {name}"):
            return await self._store.collection(name).find_one(dict(query))

    async def operator_update(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document | None:
        with driver_errors(f"update {name}"):
            return await self._store.collection(name).find_one_and_update(
                dict(query), dict(update), return_document=ReturnDocument.AFTER
            )
