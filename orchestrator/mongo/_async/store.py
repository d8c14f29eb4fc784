"""The store: the lease reads and writes the orchestrator sends, through PyMongo.

One design in two forms, as PyMongo's own: ``AsyncStore``
(``orchestrator/mongo/_async/store.py``, on PyMongo's async API) is written by hand, and
``Store`` (``orchestrator/mongo/_sync/store.py``) is generated from it by
``scripts/synchro.py`` with ``unasync``, so the two cannot drift apart. What needs no I/O
lives once beside them, by topic: ``driver_errors`` (error mapping), ``connection`` (the
server's checks, client and codec options), ``index_plans`` and ``probe_answers``; every
filter and update comes from ``orchestrator.core.queries``. The claim path (the claim, the
probe, what a collection's sharding is) is ``AsyncClaimer``'s, in ``claiming.py``: the
store holds one and answers its contract's claims with it.

Driver errors leave here as ``StoreError`` (with a ``transient`` flag) and fenced writes
that match nothing as ``LeaseLost``, so the layers above never see a driver exception.
What only the operator's tools ask (reports, an operator's change) is the operator's own,
in ``orchestrator/operations/_async/reports.py``.

Whatever codec options the application's client has (``tz_aware``, ``DATETIME_MS``...),
the store reads with its own: dates come back as aware UTC datetimes (a date outside the
range of ``datetime`` as ``bson.DatetimeMS``), documents as the client's document class.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pymongo
from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    BulkWriteError,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from orchestrator.core import audit, history, limits, pauses, retention, sharding
from orchestrator.core.clock import as_utc
from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.core.in_house import IN_HOUSE_INDEX, InHouse
from orchestrator.core.names import (
    AUDIT_INDEX_NAME,
    AUDIT_KEY_INDEX_NAME,
    AUDIT_ORDER_INDEX_NAME,
    CLAIM_INDEX_NAME,
    ERRORS_INDEX_NAME,
    IN_HOUSE_INDEX_NAME,
    OWNER_INDEX_NAME,
    REPLICA_INDEX_NAME,
    REPLICAS_COLLECTION,
    RETENTION_INDEX_NAME,
    SCHEDULE_RUNS_INDEX_NAME,
    SLOT_INDEX_NAME,
    UNIQUE_PREFIX,
)
from orchestrator.core.outages import DatabaseWatch
from orchestrator.core.queries import (
    claims,
    limit_slots,
    operators,
    replica_records,
    submissions,
)
from orchestrator.core.queries import schedules as schedule_queries
from orchestrator.core.queries import trees as tree_queries
from orchestrator.core.redact import redact
from orchestrator.core.replicas import ReplicaRecord
from orchestrator.core.scheduler import Found
from orchestrator.core.settings import DEFAULT_DATABASE
from orchestrator.mongo import connection, index_plans
from orchestrator.mongo._async.claiming import AsyncClaimer
from orchestrator.mongo.connection import COMMAND_NOT_FOUND
from orchestrator.mongo.driver_errors import DUPLICATE_KEY, Sharded, driver_errors

__all__ = ["AsyncStore", "connect_async"]

logger = logging.getLogger("orchestrator")


class AsyncStore:
    """Lease reads and writes against one database, with the configured write concern.

    The contract every store keeps, whatever the server (a replica set, a single node, the
    in-memory database): a claim is one atomic find-and-modify, so two replicas never hold
    one lease; a write under a lease is fenced, so a stale holder's write lands nowhere and
    says so; a submit is idempotent by its unique keys, so a retried or concurrent submit
    makes one document; and no driver error escapes unclassified, so the caller can tell a
    retry (``transient``) from a fault.

    Writes wait at most ``write_timeout`` seconds for their write concern (``wtimeout``):
    past it they raise a transient ``StoreError`` instead of blocking while no majority
    is reachable.

    ``legacy_lock_timeout`` (``Settings.legacy_lock_timeout``): while in-house pods run
    beside the replicas, their leases (``lockedAt`` alone) hold documents for the claim and
    the probe, and every lease this store writes, or document it inserts, carries the
    ``lockedAt`` they read it by (``InHouse.update``): here, where every write leaves, so
    none is left out.

    ``watch`` (a replica's): told what each operation found, an answer or a transient
    failure, so the replica says once that the database is unreachable and once that it
    is back, not at every failed tick.
    """

    def __init__(
        self,
        db: AsyncDatabase[Document],
        write_concern: str | int = "majority",
        write_timeout: float = 10.0,
        legacy_lock_timeout: float | None = None,
        watch: DatabaseWatch | None = None,
    ) -> None:
        connection.check_database_name(getattr(db, "name", None))
        self._db = db
        self._watch = watch
        self._in_house = InHouse(legacy_lock_timeout)
        self._write_concern = connection.write_concern(write_concern, write_timeout)
        self._codec: CodecOptions[Document] = connection.codec_options(db.codec_options)
        self._collections: dict[str, AsyncCollection[Document]] = {}
        self._indexed: set[tuple[str, str]] = set()
        self._audit_indexed: set[str] = set()
        self._slots_made: set[tuple[str, str, limits.Limit]] = set()
        self._slots_checked: dict[tuple[str, str, limits.Limit], datetime] = {}
        """When a take that found no free slot last counted the slots (``take_slot``)."""
        self._lock = asyncio.Lock()
        self._predates_hello = False
        self._claimer = AsyncClaimer(db, self, self._codec, self._in_house)

    @property
    def database(self) -> AsyncDatabase[Document]:
        return self._db

    def errors(
        self, action: str, sharded: Sharded | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """``driver_errors`` around one operation, telling this store's watch what it found."""
        return driver_errors(action, sharded, self._watch)

    def collection(self, name: str) -> AsyncCollection[Document]:
        """The collection ``name`` with the store's codec options and write concern (the
        application's own options for it do not apply to the orchestrator's operations)."""
        coll = self._collections.get(name)
        if coll is None:
            coll = self._db.get_collection(
                name, codec_options=self._codec, write_concern=self._write_concern
            )
            self._collections[name] = coll
        return coll

    # -- time ---------------------------------------------------------------------------

    async def server_time(self) -> datetime | None:
        """The server's clock from ``hello`` (no privileges needed), or None if it gives none.

        Lease times are judged by the server's clock, not each replica's, so replicas
        whose clocks disagree still agree on which lease is live. Raises ``StoreError``
        for a server older than ``MIN_SERVER_VERSION``, so ``start()``, which measures
        the clock first, refuses it.
        """
        with self.errors("hello"):
            reply = await self._hello()
        connection.check_server(reply)
        local = reply.get("localTime")
        return as_utc(local) if isinstance(local, datetime) else None

    def primary(self) -> Hashable:
        """The server ``hello`` measures now, as the driver knows it (no I/O):
        ``connection.primary_of``."""
        return connection.primary_of(self._db.client)

    async def _hello(self) -> Mapping[str, Any]:
        """``hello``, or ``isMaster`` on servers that predate it (and from then on)."""
        if not self._predates_hello:
            try:
                return await self._db.command("hello", codec_options=self._codec)
            except OperationFailure as exc:
                if exc.code != COMMAND_NOT_FOUND:
                    raise
                self._predates_hello = True
        return await self._db.command("isMaster", codec_options=self._codec)

    # -- leases -------------------------------------------------------------------------

    async def claim(
        self,
        name: str,
        request: claims.ClaimRequest,
        seen: Callable[[Document], None] | None = None,
    ) -> Document | None:
        """The claim (``AsyncClaimer.claim``): one atomic find-and-modify, or a peek and
        a targeted one, taking the first free document ``request`` selects."""
        return await self._claimer.claim(name, request, seen)

    async def shard_state(self, name: str) -> sharding.ShardState:
        """Whether ``name`` is sharded, and on which key (``AsyncClaimer.shard_state``)."""
        return await self._claimer.shard_state(name)

    async def probe(
        self,
        groups: Sequence[tuple[str, claims.Matches]],
        now: datetime,
        horizon: float,
        pauses_collection: str | None = None,
        replicas_collection: str | None = None,
        *,
        known: frozenset[int] = frozenset(),
    ) -> Found:
        """One read: which handlers could claim now, and when the next document comes due
        (``AsyncClaimer.probe``)."""
        return await self._claimer.probe(
            groups, now, horizon, pauses_collection, replicas_collection, known=known
        )

    async def carry(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> Document | None:
        """A fenced write that also takes the lease on (``lease_writes.carry_update``): the
        document as it stored it (its history cut as a claim reads it), or None when
        ``query`` matched nothing. One command, as the release alone was."""
        with self.errors(f"write to {name}/{_named_id(query)}"):
            return await self.collection(name).find_one_and_update(
                dict(query),
                dict(self._in_house.update(update)),
                projection=history.CLAIM_PROJECTION,
                return_document=ReturnDocument.AFTER,
            )

    async def write(self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]) -> bool:
        """A fenced write (``query`` from ``lease_writes.fenced``); False when it matched nothing,
        that is, the lease is no longer the writer's.

        A result, not an exception: the caller decides whether a lost lease is an error
        (a step's outcome: ``LeaseLost``) or expected (a heartbeat racing a release).
        """
        with self.errors(f"write to {name}/{_named_id(query)}"):
            result = await self.collection(name).update_one(
                dict(query), self._in_house.update(update)
            )
        return result.matched_count > 0

    async def delete(self, name: str, query: Mapping[str, Any]) -> bool:
        """A fenced delete (``query`` from ``lease_writes.fenced``); False when it matched
        nothing: the lease is no longer the writer's, or the phase was changed from outside."""
        with self.errors(f"remove {name}/{_named_id(query)}"):
            result = await self.collection(name).delete_one(dict(query))
        return result.deleted_count > 0

    async def find_ids(self, name: str, query: Mapping[str, Any], most: int) -> list[Any]:
        """The ``_id`` of at most ``most`` documents ``query`` selects."""
        with self.errors(f"read from {name}"):
            docs = await self.collection(name).find(dict(query), {"_id": 1}).limit(most).to_list()
        return [doc["_id"] for doc in docs]

    async def find_fields(
        self, name: str, query: Mapping[str, Any], fields: Sequence[str], most: int
    ) -> list[Document]:
        """At most ``most`` documents ``query`` selects, with ``_id`` and ``fields`` only."""
        with self.errors(f"read from {name}"):
            cursor = self.collection(name).find(dict(query), dict.fromkeys(fields, 1))
            return list(await cursor.limit(most).to_list())

    async def update_and_read(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any], fields: Sequence[str]
    ) -> Document | None:
        """Update the one document ``query`` selects; it as updated (``_id`` and
        ``fields``), or None when none matched."""
        with self.errors(f"update {name}/{_named_id(query)}"):
            found = await self.collection(name).find_one_and_update(
                dict(query),
                dict(update),
                projection=dict.fromkeys(fields, 1),
                return_document=ReturnDocument.AFTER,
            )
        return found

    async def run_fires(self, name: str, query: Mapping[str, Any], most: int) -> list[datetime]:
        """The fire times of at most ``most`` of a schedule's runs, earliest first."""
        field = schedule_queries.FIRE_FIELD
        with self.errors(f"read from {name}"):
            cursor = self.collection(name).find(dict(query), {field: 1}).sort(field, 1)
            docs = await cursor.limit(most).to_list()
        found = [schedule_queries.fire_of(doc) for doc in docs]
        return [fire for fire in found if fire is not None]

    async def write_many(
        self, name: str, query: Mapping[str, Any], update: Mapping[str, Any]
    ) -> int:
        """An update of every document ``query`` selects; how many it changed."""
        with self.errors(f"update {name}"):
            result = await self.collection(name).update_many(
                dict(query), self._in_house.update(update)
            )
        return result.modified_count

    # -- documents ----------------------------------------------------------------------

    async def insert(self, name: str, doc: Document, unique: Sequence[str]) -> Document:
        """Create ``doc`` unless a document with the same unique keys exists; return the one
        stored. Concurrent calls with one key make one document (the unique index decides).

        An upsert on the unique keys rather than insert-then-catch, so that a submit
        retried after a lost reply returns the document it made instead of failing.
        """
        coll = self.collection(name)
        doc = self._in_house.stamped(doc) if self._in_house.migrating else doc
        if not unique:
            with self.errors(f"insert into {name}"):
                await coll.insert_one(doc)
            return doc
        key = submissions.unique_filter(doc, unique)
        if "_id" not in unique:  # the _id index keeps those unique (``Registry.add_unique``)
            await self.ensure_unique(name, unique)
        on_insert = {k: v for k, v in doc.items() if k not in key}
        for _ in range(3):
            with self.errors(f"submit to {name}", (name, None)):
                try:
                    stored = await coll.find_one_and_update(
                        key,
                        {"$setOnInsert": on_insert},
                        upsert=True,
                        return_document=ReturnDocument.AFTER,
                    )
                except DuplicateKeyError:
                    # Two upserts raced; the unique index let one insert. Read the winner.
                    stored = await coll.find_one(key)
            if stored is not None:
                return stored
        raise StoreError(f"submit to {name}: the document {key} vanished while being created")

    async def ensure_claim_index(self, name: str) -> str:
        """The index serving the claim: an equivalent one already there under any name, or
        a new one. Returns the name of the index used. With ``legacy_lock_timeout``, the
        index serving the probe's in-house branch too (``IN_HOUSE_INDEX``)."""
        if self._in_house.migrating:
            await self.ensure_index(
                name, IN_HOUSE_INDEX, index_name=IN_HOUSE_INDEX_NAME, unique=False
            )
        return await self.ensure_index(
            name, claims.CLAIM_INDEX, index_name=CLAIM_INDEX_NAME, unique=False
        )

    async def ensure_unique(self, name: str, keys: Sequence[str]) -> None:
        """A unique index on ``keys``, made once per store: the server, not a read before
        the write, is what keeps concurrent submits from making two documents."""
        index = [(k, 1) for k in keys]
        await self._ensure_once(name, index, UNIQUE_PREFIX + "_".join(keys), unique=True)

    async def ensure_index(
        self,
        name: str,
        keys: Sequence[tuple[str, int]],
        *,
        index_name: str,
        unique: bool,
        expire_after: int | None = None,
    ) -> str:
        """Make sure an index that does the job of ``keys`` exists; return its name.

        An application's equivalent index is reused whatever its name, and one that
        cannot do the job is refused with a ``ConfigError`` naming it (see
        ``index_plans.plan_index``): the server allows no second index on one key pattern.
        Replicas starting at once may race to create it; the loser looks again.
        """
        coll = self.collection(name)
        wanted = index_plans.index_keys(keys)
        for attempt in range(2):
            with self.errors(f"list indexes of {name}"):
                cursor = await coll.list_indexes()
                existing = [dict(info) for info in await cursor.to_list()]
                collation = (
                    await self._default_collation(name)
                    if index_plans.has_collation(existing)
                    else None
                )
            plan = index_plans.plan_index(
                name,
                existing,
                wanted,
                index_name=index_name,
                unique=unique,
                collation=collation,
                expire_after=expire_after,
            )
            if plan.reuse is not None:
                return plan.reuse
            with self.errors(f"create index {index_name} on {name}"):
                if plan.replace is not None:
                    logger.warning(
                        f"replacing index {plan.replace!r} on {name}: it is an earlier version's",
                        extra={"collection": name, "outcome": "index-replaced"},
                    )
                    await coll.drop_index(plan.replace)
                try:
                    await coll.create_index(
                        wanted, **index_plans.index_options(index_name, unique, expire_after)
                    )
                except DuplicateKeyError as exc:
                    raise ConfigError(index_plans.duplicates_error(name, wanted, exc)) from exc
                except OperationFailure as exc:
                    if exc.code in index_plans.INDEX_CONFLICT_CODES and attempt == 0:
                        continue  # another process created an index meanwhile: look again
                    raise
            return index_name
        raise StoreError(f"create index {index_name} on {name}: indexes keep changing")

    async def _default_collation(self, name: str) -> Any:
        """The collection's default collation, which indexes created without one inherit."""
        cursor = await self._db.list_collections(filter={"name": name})
        for info in await cursor.to_list():
            return (info.get("options") or {}).get("collation")
        return None

    # -- live replicas ------------------------------------------------------------------

    async def ensure_replica_index(self, name: str = REPLICAS_COLLECTION) -> str:
        """The TTL index that deletes the records of replicas that died without removing
        their own (within a minute of their ``expiresAt``: the TTL monitor's period)."""
        return await self.ensure_index(
            name,
            replica_records.REPLICA_INDEX,
            index_name=REPLICA_INDEX_NAME,
            unique=False,
            expire_after=replica_records.REPLICA_INDEX_EXPIRY,
        )

    async def record_replica(
        self, record: ReplicaRecord, name: str = REPLICAS_COLLECTION
    ) -> str | None:
        """Write this replica's record, replacing its last one whole (or creating it).
        Returns the ``instance`` of the record it replaced (None if there was none), so a
        replica can tell that another process wrote under its replica id meanwhile."""
        with self.errors(f"record replica {record.replica_id} in {name}"):
            before = await self.collection(name).find_one_and_replace(
                replica_records.replica_filter(record.replica_id),
                replica_records.replica_document(record),
                projection=replica_records.REPLICA_INSTANCE_PROJECTION,
                upsert=True,
                return_document=ReturnDocument.BEFORE,
            )
        return None if before is None else str(before.get("instance"))

    async def remove_replica(
        self, replica_id: str, instance: str, name: str = REPLICAS_COLLECTION
    ) -> bool:
        """Delete a stopping replica's own record; False if it was not there (expired, or
        replaced by another process with the same replica id)."""
        with self.errors(f"remove replica {replica_id} from {name}"):
            result = await self.collection(name).delete_one(
                replica_records.replica_removal(replica_id, instance)
            )
        return result.deleted_count > 0

    async def ensure_errors_index(self, name: str) -> str:
        """The index serving the latest errors of each phase (``operators.ERRORS_INDEX``): the
        status report's and the failed documents' list."""
        return await self.ensure_index(
            name, operators.ERRORS_INDEX, index_name=ERRORS_INDEX_NAME, unique=False
        )

    async def ensure_schedule_runs_index(self, name: str) -> str:
        """The index serving a schedule's look for its runs (``schedules.RUNS_INDEX``)."""
        return await self.ensure_index(
            name, schedule_queries.RUNS_INDEX, index_name=SCHEDULE_RUNS_INDEX_NAME, unique=False
        )

    async def ensure_owner_index(self, name: str) -> None:
        """The index serving a parent's look for its children (``trees.OWNER_INDEX``), made
        once per store, at the first child made in ``name``."""
        await self._ensure_once(name, tree_queries.OWNER_INDEX, OWNER_INDEX_NAME, unique=False)

    async def _ensure_once(
        self, name: str, keys: list[tuple[str, int]], index_name: str, *, unique: bool
    ) -> None:
        """``ensure_index``, once per store for each collection and index: the indexes a
        first use makes (a unique key, the owner index), not asked again each time."""
        marker = (name, index_name)
        if marker in self._indexed:
            return
        async with self._lock:
            if marker in self._indexed:
                return
            await self.ensure_index(name, keys, index_name=index_name, unique=unique)
            self._indexed.add(marker)

    async def ensure_retention_index(self, name: str) -> str:
        """The TTL index by which the server deletes documents past the date their retained
        phase gave them (``retention.RETENTION_INDEX``); one on that field with other
        options is refused with a ``ConfigError`` naming it."""
        return await self.ensure_index(
            name,
            retention.RETENTION_INDEX,
            index_name=RETENTION_INDEX_NAME,
            unique=False,
            expire_after=retention.RETENTION_INDEX_EXPIRY,
        )

    # -- operators' controls ------------------------------------------------------------

    async def read_pauses(self, name: str) -> list[pauses.Pause]:
        """The operators' pauses in force (``pauses``); what is no pause is skipped."""
        with self.errors(f"read pauses from {name}"):
            docs = await self.collection(name).find({}).limit(pauses.MAX_PAUSES).to_list()
        return pauses.read_all(docs)

    async def append_audit(self, name: str, entry: Mapping[str, Any]) -> None:
        """Add ``entry`` to the audit trail, whose TTL index (and the indexes listing it
        latest first, and by business key) this store makes first, once."""
        if name not in self._audit_indexed:
            await self.ensure_index(
                name,
                audit.AUDIT_INDEX,
                index_name=AUDIT_INDEX_NAME,
                unique=False,
                expire_after=0,
            )
            await self.ensure_index(
                name,
                audit.AUDIT_ORDER_INDEX,
                index_name=AUDIT_ORDER_INDEX_NAME,
                unique=False,
            )
            await self.ensure_index(
                name, audit.AUDIT_KEY_INDEX, index_name=AUDIT_KEY_INDEX_NAME, unique=False
            )
            self._audit_indexed.add(name)
        with self.errors(f"append to {name}"):
            await self.collection(name).insert_one(dict(entry))

    # -- cluster-wide limits ------------------------------------------------------------

    async def ensure_slots(self, name: str, key: str, limit: limits.Limit) -> None:
        """The slots of ``limit`` of the handler ``key`` in ``name``, and their index: made
        once per store (a slot already there, taken or not, is kept as it is). One read when
        they are all there, else one insert of them all, the existing ones refused by the
        ``_id`` index."""
        marker = (name, key, limit)
        if marker in self._slots_made:
            return
        await self.ensure_index(
            name, limit_slots.SLOT_INDEX, index_name=SLOT_INDEX_NAME, unique=False
        )
        coll = self.collection(name)
        with self.errors(f"make the slots of {key} in {name}"):
            have = await coll.count_documents(limit_slots.slots_filter(key, limit))
            if have < limit.count:
                try:
                    await coll.insert_many(limit_slots.slot_documents(key, limit), ordered=False)
                except BulkWriteError as exc:
                    errors = exc.details.get("writeErrors", [])
                    if any(e.get("code") != DUPLICATE_KEY for e in errors):
                        raise
        self._slots_made.add(marker)

    async def take_slot(
        self,
        name: str,
        key: str,
        limit: limits.Limit,
        judged_at: datetime,
        update: Mapping[str, Any],
    ) -> Document | None:
        """Take a slot of ``limit`` that is free at ``judged_at`` with ``update``
        (``limit_slots.take_slot_update``): one find-and-modify, so of replicas taking at once
        each gets its own slot. The slot as it was before (its ``_id``, ``until`` and
        ``token``), or None when none is free. The slots are made first, once per store;
        when none is free they are counted again, at most every ``limits.SLOTS_RECHECK``
        seconds, and made again if some are gone (an operator removed them, or the
        collection): a limit never waits on slots nobody will make."""
        await self.ensure_slots(name, key, limit)
        before = await self._take_slot(name, key, limit, judged_at, update)
        marker = (name, key, limit)
        checked = self._slots_checked.get(marker)
        if before is not None or (
            checked is not None and (judged_at - checked).total_seconds() < limits.SLOTS_RECHECK
        ):
            return before
        self._slots_checked[marker] = judged_at
        self._slots_made.discard(marker)
        await self.ensure_slots(name, key, limit)
        return await self._take_slot(name, key, limit, judged_at, update)

    async def _take_slot(
        self,
        name: str,
        key: str,
        limit: limits.Limit,
        judged_at: datetime,
        update: Mapping[str, Any],
    ) -> Document | None:
        with self.errors(f"take a slot of {key}"):
            return await self.collection(name).find_one_and_update(
                limit_slots.take_slot_filter(key, limit, judged_at),
                dict(update),
                projection=limit_slots.SLOT_PROJECTION,
                return_document=ReturnDocument.BEFORE,
            )

    async def next_slot(self, name: str, key: str, limit: limits.Limit) -> datetime | None:
        """When the next slot of ``limit`` comes free (the earliest ``until``), or None when
        there is no slot to read."""
        with self.errors(f"read the slots of {key}"):
            doc = await self.collection(name).find_one(
                limit_slots.slots_filter(key, limit),
                limit_slots.SLOT_PROJECTION,
                sort=limit_slots.NEXT_SLOT_SORT,
            )
        until = None if doc is None else doc.get("until")
        return as_utc(until) if isinstance(until, datetime) else None

    # -- collections --------------------------------------------------------------------

    async def drop(self, name: str) -> None:
        """Drop a collection with its documents and indexes. The unique indexes this store
        made there are forgotten too, so the next submit makes them again rather than
        trusting an index that is gone."""
        with self.errors(f"drop {name}"):
            await self._db.drop_collection(name)
        self._indexed = {done for done in self._indexed if done[0] != name}
        self._claimer.forget(name)
        self._slots_made = {made for made in self._slots_made if made[0] != name}


async def connect_async(
    uri: str, database: str | None = None, *, timeout: float = 5.0
) -> AsyncDatabase[Document]:
    """The database of ``uri`` (or ``database``), checked reachable within ``timeout`` s:
    a command-line tool should fail in seconds with the reason, not hang for thirty."""
    where = redact(uri)
    try:
        client: AsyncMongoClient[Document] = AsyncMongoClient(
            uri, **connection.client_options(timeout)
        )
    except (PyMongoError, ValueError) as exc:  # a malformed port is a bare ValueError
        raise StoreError(f"invalid MongoDB URI {where}: {redact(str(exc))}") from exc
    try:
        db = client[database] if database else client.get_default_database(DEFAULT_DATABASE)
        await db.command("ping")
    except ServerSelectionTimeoutError as exc:
        await client.close()
        raise StoreError(
            f"cannot reach MongoDB at {where} within {timeout:g}s: {connection.unreachable(exc)}",
            transient=True,
        ) from exc
    except PyMongoError as exc:
        await client.close()
        raise StoreError(f"MongoDB at {where}: {redact(str(exc))}") from exc
    connection.check_database_name(db.name)
    return db


async def check_reachable_async(db: AsyncDatabase[Document], timeout: float) -> None:
    """``db`` answers a ping within ``timeout`` s, whatever its client's own server
    selection timeout (30 s by default): a worker that cannot start says why in seconds."""
    try:
        with pymongo.timeout(timeout):
            await db.command("ping")
    except PyMongoError as exc:
        raise StoreError(
            f"cannot reach MongoDB within {timeout:g}s: {connection.unreachable(exc)}",
            transient=True,
        ) from exc


def _named_id(query: Mapping[str, Any]) -> Any:
    """The ``_id`` a write's filter names, for its error: the value of an exact
    ``{"$eq": id}`` (the fenced writes' form) rather than the operator."""
    named = query.get("_id")
    if isinstance(named, Mapping) and set(named) == {"$eq"}:
        return named["$eq"]
    return named
