"""What an operator does with the documents the replicas work on, on PyMongo's async API:
the status report, finding a document, unlock and retry. ``Operations``
(``orchestrator/mongo/_sync/operations.py``) is generated from it by ``scripts/synchro.py``;
both are public as ``orchestrator.operations``.

Every tool acts through these (the command line on the sync form, the page and an async
application on this one), so what an action means cannot differ between them. An action
is applied only while the document is still as the operator saw it (its phase and lease
token, ``queries.operator_guard``): a retry confirmed on a free document never takes the
lease of a replica that claimed it since, an unlock confirmed for one holder never
releases the next one's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core import queries
from orchestrator.core.errors import (
    AmbiguousId,
    ConfigError,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
)
from orchestrator.core.operator import Retried, check_phase_name, id_json, live_lease
from orchestrator.core.replicas import REPLICAS_COLLECTION, disagreements
from orchestrator.core.status import PhaseCount, RecentError, Status
from orchestrator.mongo._async.reports import AsyncReports, AsyncReportStore
from orchestrator.mongo.common import Document

__all__ = ["AsyncOperations"]


class AsyncOperations:
    """An operator's view of ``database`` (a PyMongo database: an ``AsyncMongoClient``'s
    for ``AsyncOperations``, a ``MongoClient``'s for ``Operations``) and actions on it;
    ``replicas_collection``: where the replicas record themselves (their
    ``replicas_collection`` setting).

    Failures are ``OrchestratorError``s: ``StoreError`` when the database fails,
    ``OperatorError`` (``DocumentNotFound``, ``AmbiguousId``, ``DocumentChanged``,
    ``LeaseHeld``) when a request cannot be carried out as asked.
    """

    def __init__(
        self, database: AsyncDatabase[Document], *, replicas_collection: str = REPLICAS_COLLECTION
    ) -> None:
        self._name = database.name
        self._reports: AsyncReportStore = AsyncReports(database)
        self._replicas = replicas_collection

    async def status(self, collections: Sequence[str] | None = None, *, errors: int = 5) -> Status:
        """Phase counts of ``collections`` (by default every collection but the replicas')
        and their latest ``errors`` errors each, judged by the server's clock against each
        lease's own expiry (so the replicas' lock timeouts need not be known), and the
        live replicas with the settings they disagree on. ``ConfigError`` names a
        collection the database does not have."""
        present = await self._reports.collection_names()
        if collections:
            unknown = [c for c in collections if c not in present]
            if unknown:
                known = ", ".join(present) or "none"
                raise ConfigError(
                    f"unknown collection {', '.join(map(repr, unknown))} in database "
                    f"{self._name!r} (it has: {known})"
                )
            names = list(collections)
        else:
            names = [collection for collection in present if collection != self._replicas]
        server = await self._reports.server_time()
        now = server or datetime.now(UTC)
        live = await self._reports.live_replicas(now, self._replicas)
        phases: list[PhaseCount] = []
        latest: list[RecentError] = []
        for collection in names:
            phases.extend(await self._reports.phase_summary(collection, now))
            if errors > 0:
                latest.extend(await self._reports.latest_errors(collection, errors))
        return Status(
            at=now,
            server_time=server is not None,
            phases=phases,
            errors=latest,
            replicas=live,
            disagreements=disagreements(live),
        )

    async def collections(self) -> list[str]:
        """The database's collections, sorted, without the server's own (``system.*``)."""
        return await self._reports.collection_names()

    async def now(self) -> datetime:
        """The server's time, by which leases are judged; this machine's when it reports
        none."""
        return await self._reports.server_time() or datetime.now(UTC)

    async def document(self, collection: str, doc_id: Any) -> Document:
        """The document whose ``_id`` is ``doc_id``, exactly (the string ``"42"`` is not
        the integer ``42``); ``DocumentNotFound`` when there is none."""
        doc = await self._reports.find_one(collection, queries.exact_id_filter(doc_id))
        if doc is None:
            raise DocumentNotFound(collection, id_json(doc_id))
        return doc

    async def find(self, collection: str, typed: str) -> Document:
        """The one document an id typed as text names (``queries.id_filter``: an
        ObjectId's hex or an integer's digits name that value and the string alike).
        ``DocumentNotFound`` when it names none, ``AmbiguousId`` (with both) when it names
        two: which one is the operator's to say, never guessed."""
        query = queries.id_filter(typed)
        first = await self._reports.find_one(collection, query)
        if first is None:
            raise DocumentNotFound(collection, repr(typed))
        if not isinstance(query["_id"], dict):
            return first
        other_query = {"$and": [query, {"_id": {"$ne": first["_id"]}}]}
        other = await self._reports.find_one(collection, other_query)
        if other is not None:
            raise AmbiguousId(collection, typed, [first, other])
        return first

    async def lease_state(self, collection: str, doc_id: Any, now: datetime) -> PhaseCount | None:
        """One document's lease state at ``now`` as the status counts judge it (the same
        aggregation, on that document alone); None when it has no phase or is gone."""
        rows = await self._reports.phase_summary(collection, now, queries.exact_id_filter(doc_id))
        return rows[0] if rows else None

    async def unlock(self, collection: str, seen: Mapping[str, Any]) -> Document:
        """Make the document claimable at once; a live holder's later writes raise
        ``LeaseLost``. ``seen``: the document as the operator saw it (its ``_id``, and the
        ``phase`` and ``lockToken`` the unlock is for; absent: none).

        :return: the document after the unlock
        :raises DocumentChanged: it is no longer in that phase under that lease
        :raises DocumentNotFound: it is gone
        """
        guard = queries.operator_guard(seen["_id"], seen.get("phase"), seen.get("lockToken"))
        return await self._apply(collection, seen["_id"], guard, queries.release_update())

    async def retry(
        self, collection: str, seen: Mapping[str, Any], to: str, *, force: bool = False
    ) -> Retried:
        """Send the document back to phase ``to`` with its attempts reset, claimable at once
        (its error is kept as the previous error). ``seen`` as for ``unlock``, with its
        ``lockedUntil``: a retry of a document a replica holds now would let another
        replica run its step while that one is still in it, so it is refused unless
        ``force`` (an operator who saw the lease and confirmed).

        :return: what was done, and by which clock ``updatedAt`` was stamped
        :raises OperatorError: ``to`` is no phase name
        :raises LeaseHeld: a replica holds it now, and not ``force``
        :raises DocumentChanged: it is no longer in that phase under that lease
        :raises DocumentNotFound: it is gone
        """
        check_phase_name(to)
        doc_id, source = seen["_id"], seen.get("phase")
        server = await self._reports.server_time()
        # ``updatedAt`` starts the phase's clock for the replicas' backoff: the server's.
        now = server or datetime.now(UTC)
        held = live_lease(seen, now)
        if held and not force:
            raise LeaseHeld(collection, doc_id, seen.get("lockedBy"), seen.get("lockedUntil"))
        guard = queries.operator_guard(doc_id, source, seen.get("lockToken"))
        update = queries.operator_retry_update(to, now)
        after = await self._apply(collection, doc_id, guard, update)
        return Retried(after, source, to, now, server is not None, held)

    async def _apply(
        self, collection: str, doc_id: Any, guard: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document:
        after = await self._reports.operator_update(collection, guard, update)
        if after is not None:
            return after
        if await self._reports.find_one(collection, queries.exact_id_filter(doc_id)) is None:
            raise DocumentNotFound(collection, id_json(doc_id))
        raise DocumentChanged(collection, doc_id)
