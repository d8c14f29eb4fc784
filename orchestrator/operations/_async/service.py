"""What an operator does with the documents the replicas work on, on PyMongo's async API:
the status report; finding documents (by id, business key or filter, page by page) and
reading their history; retry, unlock and cancel, of one document or of every document a
filter selects (a cancel reaching the documents they own); signals; pausing and resuming
work; the audit trail. ``Operations``
(``orchestrator/operations/_sync/service.py``) is generated from it by
``scripts/synchro.py``; both are public as ``orchestrator.operations``.

Every tool acts through these (the command line on the sync form, the page and an async
application on this one), so what an action means cannot differ between them. An action
is applied only while the document is still as the operator saw it (its phase and lease
token, ``operators.operator_guard``): a retry confirmed on a free document never takes the
lease of a replica that claimed it since, an unlock confirmed for one holder never
releases the next one's.

This is the service's face; the work is done by its parts, one concept each: the reads
(``reads.py``), the actions on one document (``single.py``), on every document of a filter
(``bulk.py``), on trees and events (``trees.py``: signals, a cancel's cascade, an owner's
wake); the pauses and the audit trail are here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from orchestrator.core import history
from orchestrator.core.audit import AuditEntry, OperatorAct, operator_record
from orchestrator.core.documents import Document
from orchestrator.core.names import (
    AUDIT_COLLECTION,
    PAUSES_COLLECTION,
    REPLICAS_COLLECTION,
    SCHEDULES_COLLECTION,
)
from orchestrator.core.pauses import Pause, Scope
from orchestrator.core.replicas import ReplicaRecord
from orchestrator.core.trees import Delivered
from orchestrator.operations import filters
from orchestrator.operations._async.bulk import MAX_BULK, AsyncBulkActions, BulkOptions
from orchestrator.operations._async.reads import AsyncReads
from orchestrator.operations._async.reports import AsyncReportStore
from orchestrator.operations._async.schedules import AsyncScheduleActions
from orchestrator.operations._async.single import AsyncSingleActions
from orchestrator.operations._async.trees import AsyncTreeActions, Reach
from orchestrator.operations.actor import default_actor
from orchestrator.operations.filters import Filter, Page
from orchestrator.operations.results import Bulk, Cancelled, Cascade, Retried
from orchestrator.operations.rules import (
    Action,
    Children,
    Live,
    Signed,
    audit_keys,
    check_children,
    check_scope,
)
from orchestrator.operations.schedule_report import (
    Backfilled,
    ScheduleRow,
    ScheduleRun,
    SchedulesSummary,
    Triggered,
)
from orchestrator.operations.status_report import Status
from orchestrator.operations.tree_report import Tree

__all__ = ["AsyncOperations"]


class AsyncOperations:
    """An operator's view of ``database`` (a PyMongo database: an ``AsyncMongoClient``'s
    for ``AsyncOperations``, a ``MongoClient``'s for ``Operations``) and actions on it.
    ``replicas_collection``, ``pauses_collection``, ``audit_collection``,
    ``schedules_collection``: the replicas' settings of those names; ``actor``: who acts,
    unless an action names someone else (by default the operating system's user at this
    host; an application mounting the page names its signed-in user per request).

    Failures are ``OrchestratorError``s: ``StoreError`` when the database fails,
    ``OperatorError`` (``DocumentNotFound``, ``AmbiguousId``, ``DocumentChanged``,
    ``LeaseHeld``, ``UnhandledPhase``, ``UnhandledScope``, ``NoErrorPhase``,
    ``UnindexedField``) when a request cannot be carried out as asked; ``ConfigError`` for
    a signal that is none.

    A retry or cancel that leaves a document in a phase the live replicas are done with
    wakes its owner (``orchestratorOwner``) if the owner waits for its children: the
    owner's next claim judges its wait, not a lock timeout later.
    """

    def __init__(
        self,
        database: AsyncDatabase[Document],
        *,
        replicas_collection: str = REPLICAS_COLLECTION,
        pauses_collection: str = PAUSES_COLLECTION,
        audit_collection: str = AUDIT_COLLECTION,
        schedules_collection: str = SCHEDULES_COLLECTION,
        actor: str | None = None,
    ) -> None:
        self._read = AsyncReads(
            database,
            replicas=replicas_collection,
            pauses=pauses_collection,
            audit=audit_collection,
        )
        self._reports: AsyncReportStore = self._read.reports
        self._single = AsyncSingleActions(self._read)
        self._trees = AsyncTreeActions(self._read, self._single)
        self._bulk = AsyncBulkActions(self._read, self._single, self._trees)
        self._schedules = AsyncScheduleActions(self._read, schedules_collection)
        self._pauses = pauses_collection
        self._audit = audit_collection
        self.actor = actor or default_actor()

    # -- reports ----------------------------------------------------------------------

    async def status(self, collections: Sequence[str] | None = None, *, errors: int = 5) -> Status:
        """Phase counts of ``collections`` (by default every collection but the
        library's own) and their latest ``errors`` errors each, judged by the server's
        clock against each lease's own expiry (so the replicas' lock timeouts need not be
        known); the live replicas with the settings they disagree on, the pauses in
        force and the latest leases taken over from dead replicas. ``ConfigError`` names
        a collection the database does not have. ``schedules``: how many schedules,
        paused, failing."""
        status = await self._read.status(collections, errors)
        summary = SchedulesSummary.of(await self._schedules.rows(runs=False))
        return replace(status, schedules=summary)

    async def collections(self) -> list[str]:
        """The database's collections, sorted, without the server's own (``system.*``)."""
        return await self._reports.collection_names()

    async def now(self) -> datetime:
        """The server's time, by which leases are judged; this machine's when it reports
        none."""
        return await self._read.now()

    async def replicas(self) -> list[ReplicaRecord]:
        """The live replicas, as they recorded themselves."""
        return await self._read.replicas()

    # -- finding documents ------------------------------------------------------------

    async def document(self, collection: str, doc_id: Any) -> Document:
        """The document whose ``_id`` is ``doc_id``, exactly (the string ``"42"`` is not
        the integer ``42``); ``DocumentNotFound`` when there is none."""
        return await self._read.document(collection, doc_id)

    async def find(self, collection: str, typed: str) -> Document:
        """The one document text typed by an operator names: its id
        (``operators.id_filter``: an ObjectId's hex or an integer's digits name that value
        and the string alike), else its business key (a unique key the live replicas
        declare, of one field). ``DocumentNotFound`` when it names none, ``AmbiguousId``
        (with both) when it names two: which one is the operator's to say, never
        guessed."""
        return await self._read.find(collection, typed)

    async def key_filter(self, collection: str, value: Any) -> tuple[tuple[str, Any], ...]:
        """``value`` as the business key of ``collection``: the one-field unique key its
        live replicas declare. ``OperatorError`` when they declare none (then name the
        field: ``FIELD=VALUE``)."""
        return await self._read.key_filter(collection, value)

    async def browse(
        self, query: Filter, *, after: str | None = None, limit: int = filters.DEFAULT_LIMIT
    ) -> Page:
        """A page of the documents ``query`` selects, served by an index (``browse``);
        ``after``: the previous page's ``next``."""
        return await self._read.browse(query, after, limit)

    async def count(self, query: Filter, *, limit: int = MAX_BULK) -> int:
        """How many documents ``query`` selects now, counted up to ``limit``."""
        return await self._read.count(query, limit)

    async def history(self, collection: str, doc_id: Any) -> list[history.Entry]:
        """The document's history, the latest entry first (``history.latest_first``), as
        every tool shows it."""
        return await self._read.history(collection, doc_id)

    async def tree(
        self,
        collection: str,
        doc: Mapping[str, Any],
        *,
        replicas: Sequence[ReplicaRecord] | None = None,
    ) -> Tree:
        """``doc`` (read from ``collection``) in its tree: its parent (``orchestratorOwner``),
        its children in the collections it owns (up to ``CHILDREN_SHOWN`` listed per
        collection, all counted per phase: one aggregation and one read per collection, at
        most ``OWNS_READ`` collections), each judged ended or not by the live replicas'
        handlers; what it waits for, with its children's counts; its inbox of signals.
        A stored field holding garbage is shown as such, never raised. ``replicas``: the
        live replicas already read (a status report's), else read now."""
        return await self._read.tree(collection, doc, replicas)

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
        return await self._single.unlock(collection, seen, self._signed(by, why))

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
        signed = self._signed(by, why)
        retried = await self._single.retry(
            collection, seen, to, force=force, any_phase=any_phase, signed=signed
        )
        await self._trees.wake_owner(collection, retried.document, Live.of(await self.replicas()))
        return retried

    async def cancel(
        self,
        collection: str,
        seen: Mapping[str, Any],
        *,
        to: str | None = None,
        any_phase: bool = False,
        children: Children | str = Children.CANCEL,
        by: str | None = None,
        why: str = "",
    ) -> Cancelled:
        """Send the document to the cancelled phase (the live replicas'
        ``cancelled_phase``, ``Cancelled`` by default), or to ``to`` (an application's own
        cancelling phase, which a handler takes), released, its attempts reset. A step
        running on it loses its lease as to any outside writer's change: its later
        writes raise ``LeaseLost`` (it is not interrupted: it stops at its next write).

        ``children``: what becomes of the documents it owns (in the collections its
        ``orchestratorOwns`` names), and theirs in turn: ``"cancel"`` (the default) sends
        each the live replicas are not done with (a phase one of their handlers takes) to
        the cancelled phase too, with its history entry and audit record naming the owner
        whose cancel it follows; ``"abandon"`` leaves them. At most ``MAX_CASCADE``
        documents are looked at (``Cancelled.cascade`` says what was done, and ``cut``
        when it stopped there).

        :raises OperatorError: ``children`` is neither
        :raises UnhandledPhase: ``to`` is no phase a live replica handles, and not
            ``any_phase``
        :raises DocumentChanged: it is no longer in the phase, under the lease, seen
        :raises DocumentNotFound: it is gone
        """
        policy = check_children(children)
        signed = self._signed(by, why)
        cancelled = await self._single.cancel(
            collection, seen, to, any_phase=any_phase, signed=signed
        )
        live = Live.of(await self.replicas())
        await self._trees.wake_owner(collection, cancelled.document, live)
        if policy is Children.ABANDON:
            return replace(cancelled, cascade=Cascade(policy))
        reach = Reach(signed, live, cancelled.at)
        cascade = await self._trees.cascade(collection, cancelled.document, reach)
        return replace(cancelled, cascade=cascade)

    # -- signals ----------------------------------------------------------------------

    async def signal(
        self,
        collection: str,
        doc_id: Any,
        name: str,
        payload: Any = None,
        *,
        by: str | None = None,
        why: str = "",
    ) -> Delivered:
        """Send the signal ``name`` (with ``payload``) to the document whose ``_id`` is
        ``doc_id``, exactly, as a replica's ``signal`` sends it: into its bounded inbox,
        and, if it waits for that name and no step holds it, waking it
        (``Delivered.woke``); a wait written later finds it in the inbox. Recorded in the
        audit trail (who, why, the signal's name, the document by id and business key).

        This process is no replica: it claims nothing. The document woken is made due at
        once (``lockedUntil`` the epoch), and the next tick of a replica whose handlers
        take it claims it and moves it on to its wait's ``then`` phase.

        :raises ConfigError: ``name`` is no signal name (an empty string, or longer than
            200 characters), or ``payload`` cannot be stored as given
        :raises DocumentNotFound: there is no such document
        """
        return await self._trees.signal(collection, doc_id, name, payload, self._signed(by, why))

    # -- acting on every document of a filter -------------------------------------------

    async def bulk(  # noqa: PLR0913  the documented keywords (README, "Acting")
        self,
        action: Action,
        query: Filter,
        *,
        dry_run: bool = False,
        to: str | None = None,
        force: bool = False,
        any_phase: bool = False,
        children: Children | str = Children.CANCEL,
        by: str | None = None,
        why: str = "",
        limit: int = MAX_BULK,
    ) -> Bulk:
        """``action`` (retry, unlock or cancel) on every document ``query`` selects, each
        applied only while it still matches the filter and is as it was read (its phase
        and lease): what moved meanwhile is skipped, not acted on. A retry sends each
        document to ``to``, or to the phase of its own last error; a cancel treats the
        documents each owns by ``children``, as ``cancel`` does (``MAX_CASCADE`` for
        all of them together; ``Bulk.cascade``). ``dry_run``: nothing is changed; the
        result says what would be. One audit entry records the whole, also when it stops
        part way (what it changed before, and why it stopped).

        :raises OperatorError: the filter selects more than ``limit`` documents;
            ``children`` is neither ``"cancel"`` nor ``"abandon"``
        :raises UnhandledPhase: as for one document, for ``to`` or any error phase
        """
        policy = check_children(children)
        signed = self._signed(by, why)
        options = BulkOptions(signed, to, force, any_phase, dry_run, limit, policy)
        return await self._bulk.bulk(action, query, options)

    # -- pauses and the audit trail -------------------------------------------------------

    async def pause(
        self, scope: Scope, *, force: bool = False, by: str | None = None, why: str = ""
    ) -> bool:
        """Pause ``scope`` on every replica: within a heartbeat interval none claims
        anything of it (steps running finish). False when it was paused already.

        A collection, phase or handler no live replica has is refused unless ``force``
        (such a pause covers nothing now, and holds for replicas started later): a typo
        would otherwise look done.

        :raises UnhandledScope: no live replica has what ``scope`` names, and not ``force``
        """
        if not force:
            check_scope(scope, await self.replicas())
        signed = self._signed(by, why)
        now = await self.now()
        done = await self._reports.write_pause(
            self._pauses, Pause(scope, signed.by, now, signed.why), now
        )
        if done:
            await self._record_pause("pause", scope, now, signed)
        return done

    async def resume(self, scope: Scope, *, by: str | None = None, why: str = "") -> bool:
        """End the pause of ``scope``: the replicas claim its work again at their next
        heartbeat. False when it was not paused."""
        done = await self._reports.remove_pause(self._pauses, scope)
        if done:
            await self._record_pause("resume", scope, await self.now(), self._signed(by, why))
        return done

    async def refused(
        self,
        action: str,
        collection: str,
        *,
        because: str,
        scope: Mapping[str, Any] | None = None,
        documents: Sequence[str] = (),
        by: str | None = None,
        why: str = "",
    ) -> None:
        """Record in the audit trail an ``action`` a tool refused ``because`` before it did
        anything (``by`` may not take it): who tried what, on which ``documents`` (their
        ids as Extended JSON, or as given) or ``scope``, so the trail shows attempts
        that did not happen as well as the changes that did."""
        signed = self._signed(by, why)
        await self._reports.append_audit(
            self._audit,
            operator_record(
                OperatorAct(action, signed.by, signed.why, await self.now()),
                collection=collection,
                scope=scope or {},
                documents=documents,
                count=0,
                refused=because,
            ),
        )

    async def pauses(self) -> list[Pause]:
        """The pauses in force."""
        return await self._reports.read_pauses(self._pauses)

    async def audit(self, limit: int = 50, *, key: str | None = None) -> list[AuditEntry]:
        """The audit trail, latest first: operators' actions, and leases taken over; each
        operator's entry names the documents it changed by id and business key
        (``AuditEntry.named``). ``key``: only the entries naming a document by that
        business key: ``FIELD=VALUE``, or a value of a one-field unique key of a collection
        the live replicas work on (``audit_keys``).

        :raises OperatorError: ``key`` names no field, and no collection the live
            replicas work on has a one-field key
        """
        keys = () if key is None else audit_keys(key, await self._read.declared_keys())
        return await self._reports.read_audit(self._audit, limit, keys=keys)

    # -- schedules ---------------------------------------------------------------------

    async def schedules(self) -> list[ScheduleRow]:
        """Every schedule, by name: its spec, policies, next fire, last run and its
        outcome (with the phase its document is in now), counts (missed ones too), who
        declared the stored spec, and whether the live replicas declaring it disagree on
        its spec. A field its document holds garbage in is listed as ``unreadable``."""
        return await self._schedules.rows()

    async def schedule(self, name: str, *, runs: int = 20) -> tuple[ScheduleRow, list[ScheduleRun]]:
        """The schedule ``name`` and its latest ``runs`` runs, the newest fire first.

        :raises OperatorError: there is no schedule ``name`` (``refusal``: not_found)
        """
        row = await self._schedules.row(name)
        return row, await self._schedules.runs(row, runs)

    async def pause_schedule(self, name: str, *, by: str | None = None, why: str = "") -> bool:
        """Pause the schedule ``name``: no replica starts its fires until it is resumed
        (those past its catch-up window then are counted missed). False when it was
        paused already."""
        return await self._schedules.pause(name, True, self._signed(by, why))

    async def resume_schedule(self, name: str, *, by: str | None = None, why: str = "") -> bool:
        """Resume the schedule ``name``. False when it was not paused."""
        return await self._schedules.pause(name, False, self._signed(by, why))

    async def trigger(self, name: str, *, by: str | None = None, why: str = "") -> Triggered:
        """Start one run of the schedule ``name`` now, its fire time the server's time,
        whatever its overlap policy says of runs still going (a trigger of a paused
        schedule waits for its resume). Served by the schedule's next step, on whichever
        replica declares it: made claimable at once unless a step holds it
        (``Triggered.woken``)."""
        return await self._schedules.trigger(name, self._signed(by, why))

    async def backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        by: str | None = None,
        why: str = "",
    ) -> Backfilled:
        """Start every fire time of the schedule ``name`` in [``start``, ``end``] that has
        no document yet, at its next step.

        :raises OperatorError: ``end`` before ``start``; more than ``MAX_BACKFILL`` fire
            times, or none, in the range; a stored spec that is no spec
        """
        return await self._schedules.backfill(name, start, end, self._signed(by, why))

    async def _record_pause(self, action: str, scope: Scope, now: datetime, signed: Signed) -> None:
        described = {"phase": scope.phase or "", "handler": scope.handler or ""}
        await self._reports.append_audit(
            self._audit,
            operator_record(
                OperatorAct(action, signed.by, signed.why, now),
                collection=scope.collection,
                scope=described,
                documents=[],
                count=0,
            ),
        )

    def _signed(self, by: str | None, why: str) -> Signed:
        """Who acts (``by``, else this service's ``actor``), and why."""
        return Signed(by or self.actor, why)
