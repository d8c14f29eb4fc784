"""What an operator reads, on PyMongo's async API: the status report, the live replicas,
one document (by exact id, id as typed or business key), a page of what a ``Filter``
selects and how many, a document's history; and the reads every action shares (the
server's time, a collection's business and shard keys, the indexes a list is hinted at).
``AsyncOperations`` serves them; ``AsyncSingleActions`` and ``AsyncBulkActions`` read
through them. ``Reads`` (``_sync/reads.py``) is generated from it by ``scripts/synchro.py``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core import history, replicas, sharding
from orchestrator.core.audit import AuditKind
from orchestrator.core.documents import Document, id_json
from orchestrator.core.errors import (
    AmbiguousId,
    ConfigError,
    DocumentNotFound,
    OperatorError,
    Refusal,
    StoreError,
)
from orchestrator.core.in_house import InHouse
from orchestrator.core.queries import operators
from orchestrator.core.queries import trees as tree_queries
from orchestrator.core.replicas import ReplicaRecord, disagreements
from orchestrator.core.trees import owns_of
from orchestrator.operations import filters
from orchestrator.operations._async.reports import AsyncReports, AsyncReportStore
from orchestrator.operations.filters import Filter, Page, Plan, Row
from orchestrator.operations.status_report import PhaseCount, RecentError, Status
from orchestrator.operations.tree_report import (
    CHILDREN_SHOWN,
    OWNS_READ,
    ChildRow,
    Counted,
    Inbox,
    Judge,
    Tree,
    Waiting,
    parent_of,
)

__all__ = ["INDEXES_RECHECK", "TAKEOVERS_SHOWN", "AsyncReads"]

INDEXES_RECHECK = 60.0
"""Seconds between two looks at a collection's indexes by one ``Operations``."""

TAKEOVERS_SHOWN = 20
"""Latest take-overs of dead replicas' leases a status report lists."""


class AsyncReads:
    """The reads of ``database`` an operator's tools make; ``replicas``, ``pauses``,
    ``audit``: the names of the library's own collections (never listed as work)."""

    def __init__(
        self, database: AsyncDatabase[Document], *, replicas: str, pauses: str, audit: str
    ) -> None:
        self.name = database.name
        self.reports: AsyncReportStore = AsyncReports(database)
        self.replicas_collection = replicas
        self.pauses_collection = pauses
        self.audit_collection = audit
        self._own = {replicas, pauses, audit}
        self.uuids = database.codec_options.uuid_representation
        self._indexed: dict[str, float] = {}  # collection: when its indexes were seen

    # -- reports ----------------------------------------------------------------------

    async def status(self, collections: Sequence[str] | None, errors: int) -> Status:
        """As ``AsyncOperations.status``."""
        names = await self.work_collections(collections)
        server = await self.reports.server_time()
        now = server or datetime.now(UTC)
        live = await self.reports.live_replicas(now, self.replicas_collection)
        in_house = InHouse.honoured_by(live)
        phases: list[PhaseCount] = []
        latest: list[RecentError] = []
        notes: list[str] = []
        for collection in names:
            rows = await self.reports.phase_summary(collection, now, in_house=in_house)
            phases.extend(rows)
            if errors > 0 and rows:
                try:
                    await self.ensure_indexes(collection)
                except StoreError as exc:
                    if exc.transient:
                        raise
                    # The server refuses the index (its documents hold arrays where it
                    # needs values): the counts stand; the errors, unindexed, are not read.
                    notes.append(f"the latest errors of {collection!r} are not listed: {exc}")
                    continue
                found = await self.reports.latest_errors(
                    collection,
                    errors,
                    [row.phase for row in rows],
                    await self.keys(collection, live),
                )
                latest.extend(found)
        taken = (
            await self.reports.read_audit(
                self.audit_collection, TAKEOVERS_SHOWN, AuditKind.TAKEOVER
            )
            if errors > 0
            else []
        )
        return Status(
            at=now,
            server_time=server is not None,
            phases=phases,
            errors=latest,
            notes=notes,
            replicas=live,
            disagreements=disagreements(live),
            pauses=await self.reports.read_pauses(self.pauses_collection),
            takeovers=taken,
            handler_names=replicas.handler_names(live),
        )

    async def now(self) -> datetime:
        """The server's time, by which leases are judged; this machine's when it reports
        none."""
        return await self.reports.server_time() or datetime.now(UTC)

    async def replicas(self) -> list[ReplicaRecord]:
        """The live replicas, as they recorded themselves."""
        return await self.reports.live_replicas(await self.now(), self.replicas_collection)

    # -- finding documents ------------------------------------------------------------

    async def document(self, collection: str, doc_id: Any) -> Document:
        """As ``AsyncOperations.document``."""
        doc = await self.reports.find_one(collection, operators.exact_id_filter(doc_id))
        if doc is None:
            raise DocumentNotFound(collection, id_json(doc_id))
        return doc

    async def find(self, collection: str, typed: str) -> Document:
        """As ``AsyncOperations.find``."""
        query = operators.id_filter(typed)
        found = await self._two(collection, query)
        if not found:
            for keys in await self.keys(collection):
                if len(keys) == 1:
                    found = await self._two(collection, {keys[0]: {"$eq": typed}})
                    if found:
                        break
        if not found:
            raise DocumentNotFound(collection, repr(typed))
        if len(found) > 1:
            raise AmbiguousId(collection, typed, found)
        return found[0]

    async def _two(self, collection: str, query: Mapping[str, Any]) -> list[Document]:
        first = await self.reports.find_one(collection, query)
        if first is None:
            return []
        other_query = {"$and": [query, {"_id": {"$ne": first["_id"]}}]}
        other = await self.reports.find_one(collection, other_query)
        return [first] if other is None else [first, other]

    async def key_filter(self, collection: str, value: Any) -> tuple[tuple[str, Any], ...]:
        """As ``AsyncOperations.key_filter``."""
        for keys in await self.keys(collection):
            if len(keys) == 1:
                return ((keys[0], value),)
        raise OperatorError(
            f"no live replica declares a one-field unique key for {collection!r}: name the "
            "field (FIELD=VALUE)",
            refusal=Refusal.NO_UNIQUE_KEY,
        )

    async def browse(self, query: Filter, after: str | None, limit: int) -> Page:
        """As ``AsyncOperations.browse``."""
        if not 1 <= limit <= filters.MAX_LIMIT:
            raise OperatorError(f"a page holds 1 to {filters.MAX_LIMIT} documents, not {limit}")
        now = await self.now()
        plan, rows, docs = await self.page(query, now, after, limit + 1)
        more = len(docs) > limit
        return Page(
            rows=rows[:limit],
            next=filters.cursor(docs[limit - 1], plan.sort, self.uuids) if more else None,
            index=plan.index,
            at=now,
        )

    async def count(self, query: Filter, limit: int) -> int:
        """How many documents ``query`` selects now, counted up to ``limit``."""
        await self.check_collection(query.collection)
        now = await self.now()
        live = await self.reports.live_replicas(now, self.replicas_collection)
        plan = await self.plan(query, now, None, InHouse.honoured_by(live))
        return await self.reports.count(query.collection, plan, limit) if plan else 0

    async def history(self, collection: str, doc_id: Any) -> list[history.Entry]:
        """The document's history, latest entry first (``history.latest_first``)."""
        return history.latest_first(await self.document(collection, doc_id))

    async def tree(
        self, collection: str, doc: Mapping[str, Any], live: Sequence[ReplicaRecord] | None = None
    ) -> Tree:
        """As ``AsyncOperations.tree``."""
        if live is None:
            live = await self.replicas()
        judge = Judge(live)
        owns = owns_of(doc)
        looked, cut = owns[:OWNS_READ], owns[OWNS_READ:]
        rows: list[tuple[str, Any, int]] = []
        children: list[ChildRow] = []
        more: list[str] = []
        for where in looked:
            found = await self.reports.child_phases(where, collection, doc.get("_id"))
            rows.extend((where, phase, count) for phase, count in found)
            if not found:
                continue
            query = tree_queries.children_filter(collection, doc.get("_id"))
            docs = await self.reports.find_many(
                where, query, [("_id", 1)], CHILDREN_SHOWN + 1, tree_queries.CHILD_PROJECTION
            )
            if len(docs) > CHILDREN_SHOWN:
                more.append(where)
            children.extend(ChildRow.read(where, d, judge) for d in docs[:CHILDREN_SHOWN])
        counted = Counted.of(rows, judge, cut)
        parent, unreadable = parent_of(doc)
        return Tree(
            parent=parent,
            parent_unreadable=unreadable,
            owns=owns,
            children=children,
            counted=counted,
            waiting=Waiting.of(doc, counted),
            inbox=Inbox.of(doc),
            cut=more,
        )

    async def page(
        self, query: Filter, now: datetime, after: str | None, limit: int
    ) -> tuple[Plan, list[Row], list[Document]]:
        """Up to ``limit`` documents ``query`` selects at ``now`` after the cursor
        ``after``: the plan that served them, their rows, the documents themselves."""
        await self.check_collection(query.collection)
        live = await self.reports.live_replicas(now, self.replicas_collection)
        in_house = InHouse.honoured_by(live)
        plan = await self.plan(query, now, after, in_house)
        if plan is None:
            return Plan({}, [], [], "none: the collection has no phases"), [], []
        docs = await self.reports.browse(query.collection, plan, limit)
        keys = await self.keys(query.collection, live)
        names = replicas.handler_names(live)
        return plan, [Row.read(doc, now, keys, names, in_house) for doc in docs], docs

    async def plan(
        self, query: Filter, now: datetime, after: str | None, in_house: InHouse
    ) -> Plan | None:
        """The plan serving ``query`` (``filters.plan``); None when the collection has no
        phases (so nothing to select)."""
        await self.ensure_indexes(query.collection)
        phases = [] if query.phases else await self.reports.phases(query.collection)
        if not query.phases and not phases:
            return None
        indexes = (
            await self.reports.index_keys(query.collection)
            if query.fields or query.owner is not None
            else []
        )
        return filters.plan(query, now, phases, indexes, after=after, in_house=in_house)

    # -- what every action reads ------------------------------------------------------

    async def declared_keys(self) -> list[tuple[str, ...]]:
        """The business keys (``keys``) of every collection the live replicas work on
        (their handlers' and their submits' collections): one read of indexes each."""
        live = await self.replicas()
        names = {h.collection for r in live for h in r.handlers}
        names.update(name for r in live for name, _ in r.unique)
        found: list[tuple[str, ...]] = []
        for name in sorted(names):
            found += [k for k in await self.keys(name, live) if k not in found]
        return found

    async def keys(
        self, collection: str, live: list[ReplicaRecord] | None = None
    ) -> list[tuple[str, ...]]:
        """The business keys of ``collection``: the unique keys ``submit`` indexed, and
        those the ``live`` replicas declare (whose submits may not have run yet)."""
        found = await self.reports.unique_keys(collection)
        if live is None:
            live = await self.replicas()
        for keys in replicas.business_keys(live, collection):
            if keys not in found:
                found.append(keys)
        return found

    async def shard_key(self, collection: str, live: list[ReplicaRecord]) -> tuple[str, ...]:
        """The shard key of ``collection``: as its live replicas' handlers declare it, else
        as the server tells (``config.collections``, where this user may read it)."""
        declared = replicas.shard_key(live, collection)
        if declared:
            return declared
        return (await self.reports.shard_state(collection)).key or ()

    async def shard(
        self, collection: str, seen: Mapping[str, Any], live: list[ReplicaRecord]
    ) -> dict[str, Any]:
        """The shard key values of the document ``seen`` names: from ``seen`` when it holds
        them, else read from the document (a page's form carries only its id, phase and
        lease); none for an unsharded collection."""
        key = await self.shard_key(collection, live)
        if not key:
            return {}
        if not sharding.missing_fields(seen, key):
            return sharding.shard_values(seen, key)
        doc = await self.reports.find_one(collection, operators.exact_id_filter(seen["_id"]))
        if doc is None:
            raise DocumentNotFound(collection, id_json(seen["_id"]))
        return sharding.shard_values(doc, key)

    async def work_collections(self, collections: Sequence[str] | None) -> list[str]:
        """``collections``, each checked to exist (``ConfigError`` names those that do
        not); none: every collection but the server's and the library's own."""
        present = await self.reports.collection_names()
        if collections:
            unknown = [c for c in collections if c not in present]
            if unknown:
                known = ", ".join(present) or "none"
                raise ConfigError(
                    f"unknown collection {', '.join(map(repr, unknown))} in database "
                    f"{self.name!r} (it has: {known})"
                )
            return list(collections)
        return [c for c in present if c not in self._own]

    async def check_collection(self, collection: str) -> None:
        await self.work_collections([collection])

    async def ensure_indexes(self, collection: str) -> None:
        """The indexes the lists are hinted at, made if missing; looked at again after
        ``INDEXES_RECHECK`` seconds, so a collection dropped and made again (its
        indexes gone) is served again within that time, not refused for good."""
        now = time.monotonic()
        checked = self._indexed.get(collection)
        if checked is None or now - checked >= INDEXES_RECHECK:
            await self.reports.ensure_indexes(collection)
            self._indexed[collection] = now
