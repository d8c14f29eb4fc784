"""What an operator does with the documents the replicas work on, on PyMongo's async API:
the status report; finding documents (by id, business key or filter, page by page) and
reading their history; retry, unlock and cancel, of one document or of every document a
filter selects; pausing and resuming work; the audit trail. ``Operations``
(``orchestrator/operations/_sync/service.py``) is generated from it by
``scripts/synchro.py``; both are public as ``orchestrator.operations``.

Every tool acts through these (the command line on the sync form, the page and an async
application on this one), so what an action means cannot differ between them. An action
is applied only while the document is still as the operator saw it (its phase and lease
token, ``operators.operator_guard``): a retry confirmed on a free document never takes the
lease of a replica that claimed it since, an unlock confirmed for one holder never
releases the next one's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core import history, replicas, sharding
from orchestrator.core.audit import AuditEntry, AuditKind, failure_text, operator_record
from orchestrator.core.documents import Document, id_json, id_json_or_text
from orchestrator.core.errors import (
    AmbiguousId,
    ConfigError,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    NoErrorPhase,
    OperatorError,
    Refusal,
    StoreError,
    UnhandledPhase,
)
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.names import AUDIT_COLLECTION, PAUSES_COLLECTION, REPLICAS_COLLECTION
from orchestrator.core.pauses import Pause, Scope
from orchestrator.core.queries import operators
from orchestrator.core.replicas import ReplicaRecord, disagreements
from orchestrator.operations import filters
from orchestrator.operations._async.reports import AsyncReports, AsyncReportStore
from orchestrator.operations.actor import default_actor
from orchestrator.operations.filters import Filter, LeaseState, Page, Plan, Row
from orchestrator.operations.results import Bulk, Cancelled, Retried, Skipped
from orchestrator.operations.rules import (
    Action,
    cancelled_phase,
    check_phase_name,
    check_target,
    error_phase,
    history_length,
    holding,
    live_lease,
)
from orchestrator.operations.status_report import PhaseCount, RecentError, Status

__all__ = ["AsyncOperations"]

M = TypeVar("M", Retried, Cancelled)


MAX_BULK = 10_000
"""Most documents one bulk action changes: a filter selecting more is refused, to be
narrowed (or acted on in turns)."""

INDEXES_RECHECK = 60.0
"""Seconds between two looks at a collection's indexes by one ``Operations``."""

TAKEOVERS_SHOWN = 20
"""Latest take-overs of dead replicas' leases a status report lists."""


class AsyncOperations:
    """An operator's view of ``database`` (a PyMongo database: an ``AsyncMongoClient``'s
    for ``AsyncOperations``, a ``MongoClient``'s for ``Operations``) and actions on it.
    ``replicas_collection``, ``pauses_collection``, ``audit_collection``: the replicas'
    settings of those names; ``actor``: who acts, unless an action names someone else
    (by default the operating system's user at this host; an application mounting the
    page names its signed-in user per request).

    Failures are ``OrchestratorError``s: ``StoreError`` when the database fails,
    ``OperatorError`` (``DocumentNotFound``, ``AmbiguousId``, ``DocumentChanged``,
    ``LeaseHeld``, ``UnhandledPhase``, ``NoErrorPhase``, ``UnindexedField``) when a
    request cannot be carried out as asked.
    """

    def __init__(
        self,
        database: AsyncDatabase[Document],
        *,
        replicas_collection: str = REPLICAS_COLLECTION,
        pauses_collection: str = PAUSES_COLLECTION,
        audit_collection: str = AUDIT_COLLECTION,
        actor: str | None = None,
    ) -> None:
        self._name = database.name
        self._reports: AsyncReportStore = AsyncReports(database)
        self._replicas = replicas_collection
        self._pauses = pauses_collection
        self._audit = audit_collection
        self._own = {replicas_collection, pauses_collection, audit_collection}
        self.actor = actor or default_actor()
        self._uuids = database.codec_options.uuid_representation
        self._indexed: dict[str, float] = {}  # collection: when its indexes were seen

    # -- reports ----------------------------------------------------------------------

    async def status(self, collections: Sequence[str] | None = None, *, errors: int = 5) -> Status:
        """Phase counts of ``collections`` (by default every collection but the
        library's own) and their latest ``errors`` errors each, judged by the server's
        clock against each lease's own expiry (so the replicas' lock timeouts need not be
        known); the live replicas with the settings they disagree on, the pauses in
        force and the latest leases taken over from dead replicas. ``ConfigError`` names
        a collection the database does not have."""
        names = await self._work_collections(collections)
        server = await self._reports.server_time()
        now = server or datetime.now(UTC)
        live = await self._reports.live_replicas(now, self._replicas)
        in_house = InHouse.honoured_by(live)
        phases: list[PhaseCount] = []
        latest: list[RecentError] = []
        notes: list[str] = []
        for collection in names:
            rows = await self._reports.phase_summary(collection, now, in_house=in_house)
            phases.extend(rows)
            if errors > 0 and rows:
                try:
                    await self._ensure_indexes(collection)
                except StoreError as exc:
                    if exc.transient:
                        raise
                    # The server refuses the index (its documents hold arrays where it
                    # needs values): the counts stand; the errors, unindexed, are not read.
                    notes.append(f"the latest errors of {collection!r} are not listed: {exc}")
                    continue
                found = await self._reports.latest_errors(
                    collection,
                    errors,
                    [row.phase for row in rows],
                    await self._keys(collection, live),
                )
                latest.extend(found)
        taken = (
            await self._reports.read_audit(self._audit, TAKEOVERS_SHOWN, AuditKind.TAKEOVER)
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
            pauses=await self._reports.read_pauses(self._pauses),
            takeovers=taken,
            handler_names=replicas.handler_names(live),
        )

    async def collections(self) -> list[str]:
        """The database's collections, sorted, without the server's own (``system.*``)."""
        return await self._reports.collection_names()

    async def now(self) -> datetime:
        """The server's time, by which leases are judged; this machine's when it reports
        none."""
        return await self._reports.server_time() or datetime.now(UTC)

    async def replicas(self) -> list[ReplicaRecord]:
        """The live replicas, as they recorded themselves."""
        return await self._reports.live_replicas(await self.now(), self._replicas)

    # -- finding documents ------------------------------------------------------------

    async def document(self, collection: str, doc_id: Any) -> Document:
        """The document whose ``_id`` is ``doc_id``, exactly (the string ``"42"`` is not
        the integer ``42``); ``DocumentNotFound`` when there is none."""
        doc = await self._reports.find_one(collection, operators.exact_id_filter(doc_id))
        if doc is None:
            raise DocumentNotFound(collection, id_json(doc_id))
        return doc

    async def find(self, collection: str, typed: str) -> Document:
        """The one document text typed by an operator names: its id
        (``operators.id_filter``: an ObjectId's hex or an integer's digits name that value
        and the string alike), else its business key (a unique key the live replicas
        declare, of one field). ``DocumentNotFound`` when it names none, ``AmbiguousId``
        (with both) when it names two: which one is the operator's to say, never
        guessed."""
        query = operators.id_filter(typed)
        found = await self._two(collection, query)
        if not found:
            for keys in await self._keys(collection):
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
        first = await self._reports.find_one(collection, query)
        if first is None:
            return []
        other_query = {"$and": [query, {"_id": {"$ne": first["_id"]}}]}
        other = await self._reports.find_one(collection, other_query)
        return [first] if other is None else [first, other]

    async def key_filter(self, collection: str, value: Any) -> tuple[tuple[str, Any], ...]:
        """``value`` as the business key of ``collection``: the one-field unique key its
        live replicas declare. ``OperatorError`` when they declare none (then name the
        field: ``FIELD=VALUE``)."""
        for keys in await self._keys(collection):
            if len(keys) == 1:
                return ((keys[0], value),)
        raise OperatorError(
            f"no live replica declares a one-field unique key for {collection!r}: name the "
            "field (FIELD=VALUE)",
            refusal=Refusal.NO_UNIQUE_KEY,
        )

    async def browse(
        self, query: Filter, *, after: str | None = None, limit: int = filters.DEFAULT_LIMIT
    ) -> Page:
        """A page of the documents ``query`` selects, served by an index (``browse``);
        ``after``: the previous page's ``next``."""
        if not 1 <= limit <= filters.MAX_LIMIT:
            raise OperatorError(f"a page holds 1 to {filters.MAX_LIMIT} documents, not {limit}")
        now = await self.now()
        plan, rows, docs = await self._page(query, now, after, limit + 1)
        more = len(docs) > limit
        return Page(
            rows=rows[:limit],
            next=filters.cursor(docs[limit - 1], plan.sort, self._uuids) if more else None,
            index=plan.index,
            at=now,
        )

    async def count(self, query: Filter, *, limit: int = MAX_BULK) -> int:
        """How many documents ``query`` selects now, counted up to ``limit``."""
        await self._check_collection(query.collection)
        now = await self.now()
        live = await self._reports.live_replicas(now, self._replicas)
        plan = await self._plan(query, now, None, InHouse.honoured_by(live))
        return await self._reports.count(query.collection, plan, limit) if plan else 0

    async def history(self, collection: str, doc_id: Any) -> list[history.Entry]:
        """The document's history, oldest first (``history``)."""
        return history.entries(await self.document(collection, doc_id))

    async def _page(
        self, query: Filter, now: datetime, after: str | None, limit: int
    ) -> tuple[Plan, list[Row], list[Document]]:
        await self._check_collection(query.collection)
        live = await self._reports.live_replicas(now, self._replicas)
        in_house = InHouse.honoured_by(live)
        plan = await self._plan(query, now, after, in_house)
        if plan is None:
            return Plan({}, [], [], "none: the collection has no phases"), [], []
        docs = await self._reports.browse(query.collection, plan, limit)
        keys = await self._keys(query.collection, live)
        names = replicas.handler_names(live)
        return plan, [Row.read(doc, now, keys, names, in_house) for doc in docs], docs

    async def _plan(
        self, query: Filter, now: datetime, after: str | None, in_house: InHouse
    ) -> Plan | None:
        await self._ensure_indexes(query.collection)
        phases = [] if query.phases else await self._reports.phases(query.collection)
        if not query.phases and not phases:
            return None
        indexes = await self._reports.index_keys(query.collection) if query.fields else []
        return filters.plan(query, now, phases, indexes, after, in_house)

    # -- acting on one document -------------------------------------------------------

    async def unlock(
        self, collection: str, seen: Mapping[str, Any], *, by: str | None = None, why: str = ""
    ) -> Document:
        """Make the document claimable at once; a live holder's later writes raise
        ``LeaseLost``. ``seen``: the document as the operator saw it (its ``_id``, and the
        ``phase`` and ``lockToken`` the unlock is for; absent: none).

        :return: the document after the unlock
        :raises DocumentChanged: it is no longer in that phase under that lease
        :raises DocumentNotFound: it is gone
        """
        now = await self.now()
        phase = seen.get("phase")
        live = await self._reports.live_replicas(now, self._replicas)
        keep = history_length(live)
        shard = await self._shard(collection, seen, live)
        update = operators.operator_unlock_update()
        after = await self._act(
            collection,
            seen,
            update,
            Action.UNLOCK,
            now,
            by,
            why,
            phase,
            keep,
            shard=shard,
            in_house=InHouse.honoured_by(live),
        )
        await self._record(
            Action.UNLOCK,
            collection,
            {"_id": id_json_or_text(seen["_id"])},
            [seen["_id"]],
            now,
            by,
            why,
        )
        return after

    async def retry(
        self,
        collection: str,
        seen: Mapping[str, Any],
        to: str | None = None,
        *,
        force: bool = False,
        any_phase: bool = False,
        by: str | None = None,
        why: str = "",
    ) -> Retried:
        """Send the document back to phase ``to`` with its attempts reset, claimable at once
        (its error is kept as the previous error). ``seen`` as for ``unlock``, with its
        ``lockedUntil``: a retry of a document a replica holds now would let another
        replica run its step while that one is still in it, so it is refused unless
        ``force`` (an operator who saw the lease and confirmed). ``to`` defaults to the
        phase of its last (or, once retried, previous) error; a phase no live replica
        handles is refused unless ``any_phase``.

        :return: what was done, and by which clock ``updatedAt`` was stamped
        :raises OperatorError: ``to`` is no phase name
        :raises NoErrorPhase: no ``to``, and no error phase to take it from
        :raises UnhandledPhase: no live replica handles ``to``, and not ``any_phase``
        :raises LeaseHeld: a replica holds it now, and not ``force``
        :raises DocumentChanged: it is no longer in that phase under that lease
        :raises DocumentNotFound: it is gone
        """
        if to is None:
            to = error_phase(seen)
            if to is None:
                raise NoErrorPhase(collection, seen["_id"])
        check_phase_name(to)
        live = await self.replicas()
        if not any_phase:
            check_target(collection, to, live, action=Action.RETRY)
        return await self._move(Retried, collection, seen, to, force, by, why, live)

    async def cancel(
        self,
        collection: str,
        seen: Mapping[str, Any],
        *,
        to: str | None = None,
        any_phase: bool = False,
        by: str | None = None,
        why: str = "",
    ) -> Cancelled:
        """Send the document to the cancelled phase (the live replicas'
        ``cancelled_phase``, ``Cancelled`` by default), or to ``to`` (an application's own
        cancelling phase, which a handler takes), released, its attempts reset. A step
        running on it loses its lease as to any outside writer's change: its later
        writes raise ``LeaseLost`` (it is not interrupted: it stops at its next write).

        :raises UnhandledPhase: ``to`` is no phase a live replica handles, and not
            ``any_phase``
        :raises DocumentChanged: it is no longer in the phase, under the lease, seen
        :raises DocumentNotFound: it is gone
        """
        live = await self.replicas()
        target = to if to is not None else cancelled_phase(live)
        check_phase_name(target)
        if to is not None and not any_phase:
            check_target(collection, target, live, action=Action.CANCEL)
        return await self._move(Cancelled, collection, seen, target, True, by, why, live)

    async def _move(
        self,
        kind: type[M],
        collection: str,
        seen: Mapping[str, Any],
        to: str,
        force: bool,
        by: str | None,
        why: str,
        live: list[ReplicaRecord],
    ) -> M:
        """Send the document ``seen`` to ``to`` as a retry or a cancel (``kind``), as the
        ``live`` replicas keep it (their history length, shard key, in-house leases)."""
        keep = history_length(live)
        shard = await self._shard(collection, seen, live)
        in_house = InHouse.honoured_by(live)
        action = kind.action
        doc_id, source = seen["_id"], seen.get("phase")
        server = await self._reports.server_time()
        # ``updatedAt`` starts the phase's clock for the replicas' backoff: the server's.
        now = server or datetime.now(UTC)
        held = live_lease(seen, now, in_house)
        if held and not force:
            holder = holding(seen, now, in_house)
            raise LeaseHeld(collection, doc_id, holder.holder, holder.until)
        update = operators.operator_move_update(to, now)
        after = await self._act(
            collection, seen, update, action, now, by, why, to, keep, shard=shard, in_house=in_house
        )
        scope = {"_id": id_json_or_text(doc_id), "to": to}
        await self._record(action, collection, scope, [doc_id], now, by, why)
        return kind(after, source, to, now, server is not None, held)

    async def _act(
        self,
        collection: str,
        seen: Mapping[str, Any],
        update: dict[str, Any],
        action: Action,
        now: datetime,
        by: str | None,
        why: str,
        to: Any,
        keep: int,
        extra: Mapping[str, Any] | None = None,
        shard: Mapping[str, Any] | None = None,
        in_house: InHouse = NO_IN_HOUSE,
    ) -> Document:
        """Apply an operator's ``update`` to the document as ``seen`` (its phase and lease;
        ``extra``: conditions it must still meet, a bulk action's filter; ``shard``: its
        shard key values, so the change targets its shard), with its history entry in a
        history of ``keep`` entries (none: 0). The entry is pushed onto a history that is
        a list (or absent), and set whole over any other value, each fenced on that
        shape: a document whose history a writer changed meanwhile is tried once more, as
        it is now. ``in_house`` (the live replicas', ``InHouse.honoured_by``): the change
        carries the ``lockedAt`` in-house pods read it by, the epoch's even with none
        (``InHouse.operator_update``)."""
        doc_id = seen["_id"]
        update = dict(in_house.operator_update(update))
        guard = operators.operator_guard(doc_id, seen.get("phase"), seen.get("lockToken"), shard)
        if extra:
            guard = {"$and": [guard, dict(extra)]}
        entry = history.operator_entry(
            action=action.value,
            by=by or self.actor,
            why=why,
            at=now,
            phase=seen.get("phase"),
            to=to,
        )
        for shape in (history.LIST_SHAPE, history.OTHER_SHAPE) if keep else (None,):
            change = dict(update)
            query = guard
            if shape is not None:
                current = history.ABSENT if shape is history.LIST_SHAPE else None
                change = history.merge(
                    {k: dict(v) for k, v in update.items()}, history.push(entry, keep, current)
                )
                query = {"$and": [guard, shape]}
            after = await self._reports.operator_update(collection, query, change)
            if after is not None:
                return after
        if await self._reports.find_one(collection, operators.exact_id_filter(doc_id)) is None:
            raise DocumentNotFound(collection, id_json_or_text(doc_id))
        raise DocumentChanged(collection, doc_id)

    # -- acting on every document of a filter -------------------------------------------

    async def bulk(
        self,
        action: Action,
        query: Filter,
        *,
        dry_run: bool = False,
        to: str | None = None,
        force: bool = False,
        any_phase: bool = False,
        by: str | None = None,
        why: str = "",
        limit: int = MAX_BULK,
    ) -> Bulk:
        """``action`` (retry, unlock or cancel) on every document ``query`` selects, each
        applied only while it still matches the filter and is as it was read (its phase
        and lease): what moved meanwhile is skipped, not acted on. A retry sends each
        document to ``to``, or to the phase of its own last error. ``dry_run``: nothing
        is changed; the result says what would be. One audit entry records the whole, also
        when it stops part way (what it changed before, and why it stopped).

        :raises OperatorError: the filter selects more than ``limit`` documents
        :raises UnhandledPhase: as for one document, for ``to`` or any error phase
        """
        live = await self.replicas()
        target = to
        if action is Action.CANCEL and target is None:
            target = cancelled_phase(live)
        if target is not None:
            check_phase_name(target)
            if not any_phase and not (action is Action.CANCEL and to is None):
                check_target(query.collection, target, live, action=action)
        total = await self.count(query, limit=limit + 1)
        if total > limit:
            raise OperatorError(
                f"the filter selects more than {limit} documents: narrow it, or act in turns",
                refusal=Refusal.TOO_MANY,
            )
        result = Bulk(action, query, dry_run, target)
        shard_key = await self._shard_key(query.collection, live)
        now = await self.now()
        in_house = InHouse.honoured_by(live)
        plan = await self._plan(query, now, None, in_house)
        if plan is None:
            return result
        scope = {**query.describe(), **({"to": target} if target else {})}
        try:
            await self._each_of_bulk(
                result,
                query,
                plan,
                target,
                force,
                any_phase,
                live,
                in_house,
                now,
                by,
                why,
                shard_key,
            )
        except BaseException as exc:  # Ctrl-C and a cancelled request too: audited
            if not dry_run:
                await self._record_bulk(result, scope, now, by, why, failed=exc)
            raise
        if not dry_run:
            await self._record_bulk(result, scope, now, by, why)
        return result

    async def _each_of_bulk(
        self,
        result: Bulk,
        query: Filter,
        plan: Plan,
        target: str | None,
        force: bool,
        any_phase: bool,
        live: list[ReplicaRecord],
        in_house: InHouse,
        now: datetime,
        by: str | None,
        why: str,
        shard_key: tuple[str, ...],
    ) -> None:
        """Act on each document ``plan`` selects, page by page, into ``result``: what was
        changed is there when a page's read or a change fails part way. ``in_house``: the
        in-house leases ``live`` honours, judged once for the whole action."""
        action, dry_run = result.action, result.dry_run
        seen_ids: set[str] = set()
        after: str | None = None
        while True:
            _, rows, docs = await self._page(query, now, after, filters.MAX_LIMIT)
            for row, doc in zip(rows, docs, strict=True):
                marker = row.ref or row.id
                if marker in seen_ids:
                    continue  # acted on already, and back in the list after its change
                seen_ids.add(marker)
                skipped = await self._one_of_many(
                    action,
                    query,
                    plan,
                    doc,
                    row,
                    target,
                    force,
                    any_phase,
                    live,
                    in_house,
                    now,
                    by,
                    why,
                    dry_run,
                    shard_key,
                )
                if skipped is None:
                    result.changed.append(row)
                    moved_to = target or (error_phase(doc) if action is Action.RETRY else None)
                    result.targets[marker] = moved_to or row.phase or ""
                else:
                    result.skipped.append(skipped)
            if len(docs) < filters.MAX_LIMIT:
                return
            after = filters.cursor(docs[-1], plan.sort, self._uuids)

    async def _record_bulk(
        self,
        result: Bulk,
        scope: Mapping[str, Any],
        now: datetime,
        by: str | None,
        why: str,
        failed: BaseException | None = None,
    ) -> None:
        """The audit entry of a bulk action: what it changed, and, when it stopped part way
        (``failed``), why. A failure to write it leaves ``failed`` the error that
        propagates, with that noted."""
        record = operator_record(
            action=result.action.value,
            by=by or self.actor,
            why=why,
            at=now,
            collection=result.filter.collection,
            scope=scope,
            documents=[r.ref or r.id for r in result.changed],
            count=len(result.changed),
            failed=None if failed is None else failure_text(failed),
        )
        if failed is None:
            await self._reports.append_audit(self._audit, record)
            return
        try:
            await self._reports.append_audit(self._audit, record)
        except Exception as lost:  # the failure stands; this one is noted on it
            failed.add_note(f"its audit entry was not written either: {lost}")

    async def _one_of_many(
        self,
        action: Action,
        query: Filter,
        plan: Plan,
        doc: Document,
        row: Row,
        target: str | None,
        force: bool,
        any_phase: bool,
        live: list[ReplicaRecord],
        in_house: InHouse,
        now: datetime,
        by: str | None,
        why: str,
        dry_run: bool,
        shard_key: tuple[str, ...] = (),
    ) -> Skipped | None:
        """One document of a bulk action; why it was left alone (the refusal a
        single-document action raises for the same condition), or None when it was
        changed (or, ``dry_run``, would be)."""
        to = target
        if action is Action.RETRY and to is None:
            to = error_phase(doc)
            if to is None:
                return Skipped(row, Refusal.NO_ERROR_PHASE, "no recorded error phase to retry to")
            if not any_phase:
                try:
                    check_target(query.collection, to, live, action=action)
                except UnhandledPhase as exc:
                    return Skipped.because(row, exc)
        if action is Action.RETRY and live_lease(doc, now, in_house) and not force:
            why_held = f"held by a live lease of {row.holder!r} (force to take it)"
            return Skipped(row, Refusal.LEASE_HELD, why_held)
        if action is Action.UNLOCK and row.state is LeaseState.FREE:
            return Skipped(row, Refusal.ALREADY_FREE, "free already: no lease and no wait to end")
        if dry_run:
            return None
        if action is Action.UNLOCK:
            update = operators.operator_unlock_update()
        else:
            assert to is not None
            update = operators.operator_move_update(to, now)
        try:
            await self._act(
                query.collection,
                doc,
                update,
                action,
                now,
                by,
                why,
                to if to is not None else doc.get("phase"),
                history_length(live),
                extra=plan.query,
                shard=sharding.shard_values(doc, shard_key),
                in_house=in_house,
            )
        except (DocumentChanged, DocumentNotFound) as exc:
            meanwhile = "changed meanwhile (no longer as read, or no longer matching the filter)"
            return Skipped(row, exc.refusal, meanwhile)
        return None

    # -- pauses ---------------------------------------------------------------------

    async def pause(self, scope: Scope, *, by: str | None = None, why: str = "") -> bool:
        """Pause ``scope`` on every replica: within a heartbeat interval none claims
        anything of it (steps running finish). False when it was paused already."""
        now = await self.now()
        done = await self._reports.write_pause(
            self._pauses, Pause(scope, by or self.actor, now, why), now
        )
        if done:
            await self._record_pause("pause", scope, now, by, why)
        return done

    async def resume(self, scope: Scope, *, by: str | None = None, why: str = "") -> bool:
        """End the pause of ``scope``: the replicas claim its work again at their next
        heartbeat. False when it was not paused."""
        done = await self._reports.remove_pause(self._pauses, scope)
        if done:
            await self._record_pause("resume", scope, await self.now(), by, why)
        return done

    async def pauses(self) -> list[Pause]:
        """The pauses in force."""
        return await self._reports.read_pauses(self._pauses)

    async def audit(self, limit: int = 50) -> list[AuditEntry]:
        """The audit trail, latest first: operators' actions, and leases taken over."""
        return await self._reports.read_audit(self._audit, limit)

    async def _record_pause(
        self, action: str, scope: Scope, now: datetime, by: str | None, why: str
    ) -> None:
        described = {"phase": scope.phase or "", "handler": scope.handler or ""}
        await self._reports.append_audit(
            self._audit,
            operator_record(
                action=action,
                by=by or self.actor,
                why=why,
                at=now,
                collection=scope.collection,
                scope=described,
                documents=[],
                count=0,
            ),
        )

    # -- shared -----------------------------------------------------------------------

    async def _record(
        self,
        action: Action,
        collection: str,
        scope: Mapping[str, Any],
        ids: Sequence[Any],
        now: datetime,
        by: str | None,
        why: str,
    ) -> None:
        await self._reports.append_audit(
            self._audit,
            operator_record(
                action=action.value,
                by=by or self.actor,
                why=why,
                at=now,
                collection=collection,
                scope=scope,
                documents=[id_json_or_text(i) for i in ids],
                count=len(ids),
            ),
        )

    async def _keys(
        self, collection: str, live: list[ReplicaRecord] | None = None
    ) -> list[tuple[str, ...]]:
        """The business keys of ``collection``: the unique keys ``submit`` indexed, and
        those the ``live`` replicas declare (whose submits may not have run yet)."""
        found = await self._reports.unique_keys(collection)
        if live is None:
            live = await self.replicas()
        for keys in replicas.business_keys(live, collection):
            if keys not in found:
                found.append(keys)
        return found

    async def _shard_key(self, collection: str, live: list[ReplicaRecord]) -> tuple[str, ...]:
        """The shard key of ``collection``: as its live replicas' handlers declare it, else
        as the server tells (``config.collections``, where this user may read it)."""
        declared = replicas.shard_key(live, collection)
        if declared:
            return declared
        return (await self._reports.shard_state(collection)).key or ()

    async def _shard(
        self, collection: str, seen: Mapping[str, Any], live: list[ReplicaRecord]
    ) -> dict[str, Any]:
        """The shard key values of the document ``seen`` names: from ``seen`` when it holds
        them, else read from the document (a page's form carries only its id, phase and
        lease); none for an unsharded collection."""
        key = await self._shard_key(collection, live)
        if not key:
            return {}
        if not sharding.missing_fields(seen, key):
            return sharding.shard_values(seen, key)
        doc = await self._reports.find_one(collection, operators.exact_id_filter(seen["_id"]))
        if doc is None:
            raise DocumentNotFound(collection, id_json(seen["_id"]))
        return sharding.shard_values(doc, key)

    async def _work_collections(self, collections: Sequence[str] | None) -> list[str]:
        present = await self._reports.collection_names()
        if collections:
            unknown = [c for c in collections if c not in present]
            if unknown:
                known = ", ".join(present) or "none"
                raise ConfigError(
                    f"unknown collection {', '.join(map(repr, unknown))} in database "
                    f"{self._name!r} (it has: {known})"
                )
            return list(collections)
        return [c for c in present if c not in self._own]

    async def _check_collection(self, collection: str) -> None:
        await self._work_collections([collection])

    async def _ensure_indexes(self, collection: str) -> None:
        """The indexes the lists are hinted at, made if missing; looked at again after
        ``INDEXES_RECHECK`` seconds, so a collection dropped and made again (its
        indexes gone) is served again within that time, not refused for good."""
        now = time.monotonic()
        checked = self._indexed.get(collection)
        if checked is None or now - checked >= INDEXES_RECHECK:
            await self._reports.ensure_indexes(collection)
            self._indexed[collection] = now
