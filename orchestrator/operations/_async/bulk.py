"""An operator's action on every document a ``Filter`` selects, on PyMongo's async API:
retry, unlock or cancel, page by page, each document changed only while it still matches
the filter and is as it was read (its phase and lease); what moved meanwhile, or is
refused as a single-document action would refuse it, is ``Skipped`` with that
``Refusal``. One audit entry records the whole, also when it stops part way. A document
moved to a phase the replicas are done with wakes its waiting owner, and a cancel
reaches what each document owns, as for one document (``trees.py``).
``BulkActions`` (``_sync/bulk.py``) is generated from it by ``scripts/synchro.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.core import replicas, sharding
from orchestrator.core.audit import OperatorAct, failure_text, operator_record
from orchestrator.core.documents import Document
from orchestrator.core.errors import (
    DocumentChanged,
    DocumentNotFound,
    OperatorError,
    Refusal,
    UnhandledPhase,
)
from orchestrator.core.queries import operators
from orchestrator.operations import filters
from orchestrator.operations._async.reads import AsyncReads
from orchestrator.operations._async.single import AsyncSingleActions, Change
from orchestrator.operations._async.trees import AsyncTreeActions, Reach
from orchestrator.operations.filters import Filter, LeaseState, Plan, Row
from orchestrator.operations.results import Bulk, Cascade, Skipped
from orchestrator.operations.rules import (
    Action,
    Children,
    Live,
    Signed,
    cancelled_phase,
    check_phase_name,
    check_target,
    error_phase,
    live_lease,
)

__all__ = ["MAX_BULK", "AsyncBulkActions", "BulkOptions"]

MAX_BULK = 10_000
"""Most documents one bulk action changes: a filter selecting more is refused, to be
narrowed (or acted on in turns)."""


@dataclass(frozen=True)
class BulkOptions:
    """How a bulk action is carried out (``AsyncOperations.bulk`` says each): ``to``,
    ``force``, ``any_phase``, ``dry_run``, at most ``limit`` documents, a cancel's
    ``children``, as ``signed``."""

    signed: Signed
    to: str | None = None
    force: bool = False
    any_phase: bool = False
    dry_run: bool = False
    limit: int = MAX_BULK
    children: Children = Children.CANCEL


@dataclass(frozen=True)
class _Run:
    """A bulk action under way: what it did so far (``result``), the ``plan`` of its
    filter, and what it judged once for every document: the ``live`` replicas, the
    collection's ``shard_key``, the server's time ``now``; and its cancel's cascades'
    ``reach``."""

    result: Bulk
    options: BulkOptions
    plan: Plan
    live: Live
    shard_key: tuple[str, ...]
    now: datetime
    reach: Reach


class AsyncBulkActions:
    """Bulk actions, reading through ``reads`` and writing as ``single`` does (its fenced
    write and audit trail); the owners and what is owned, through ``trees``."""

    def __init__(
        self, reads: AsyncReads, single: AsyncSingleActions, trees: AsyncTreeActions
    ) -> None:
        self._reads = reads
        self._single = single
        self._trees = trees

    async def bulk(self, action: Action, query: Filter, options: BulkOptions) -> Bulk:
        """As ``AsyncOperations.bulk``."""
        reads, to = self._reads, options.to
        live = await reads.replicas()
        target = to
        if action is Action.CANCEL and target is None:
            target = cancelled_phase(live)
        if target is not None:
            check_phase_name(target)
            if not options.any_phase and not (action is Action.CANCEL and to is None):
                check_target(query.collection, target, live, action=action)
        total = await reads.count(query, options.limit + 1)
        if total > options.limit:
            raise OperatorError(
                f"the filter selects more than {options.limit} documents: narrow it, or act "
                "in turns",
                refusal=Refusal.TOO_MANY,
            )
        result = Bulk(action, query, options.dry_run, target, cascade=Cascade(options.children))
        shard_key = await reads.shard_key(query.collection, live)
        now = await reads.now()
        judged = Live.of(live)
        plan = await reads.plan(query, now, None, judged.in_house)
        if plan is None:
            return result
        reach = Reach(options.signed, judged, now)
        run = _Run(result, options, plan, judged, shard_key, now, reach)
        scope = {**query.describe(), **({"to": target} if target else {})}
        try:
            await self._each(run)
        except BaseException as exc:  # Ctrl-C and a cancelled request too: audited
            if not options.dry_run:
                await self._record(run, scope, failed=exc)
            raise
        if not options.dry_run:
            await self._record(run, scope)
        return result

    async def _each(self, run: _Run) -> None:
        """Act on each document ``run.plan`` selects, page by page, into ``run.result``:
        what was changed is there when a page's read or a change fails part way."""
        result, query = run.result, run.result.filter
        seen_ids: set[str] = set()
        after: str | None = None
        while True:
            _, rows, docs = await self._reads.page(query, run.now, after, filters.MAX_LIMIT)
            for row, doc in zip(rows, docs, strict=True):
                marker = row.ref or row.id
                if marker in seen_ids:
                    continue  # acted on already, and back in the list after its change
                seen_ids.add(marker)
                skipped = await self._one(run, doc, row)
                if skipped is None:
                    result.changed.append(row)
                    retried = error_phase(doc) if result.action is Action.RETRY else None
                    result.targets[marker] = result.target or retried or row.phase or ""
                else:
                    result.skipped.append(skipped)
            if len(docs) < filters.MAX_LIMIT:
                return
            after = filters.cursor(docs[-1], run.plan.sort, self._reads.uuids)

    async def _one(self, run: _Run, doc: Document, row: Row) -> Skipped | None:
        """One document of a bulk action; why it was left alone (the refusal a
        single-document action raises for the same condition), or None when it was
        changed (or, a dry run, would be)."""
        to, skipped = _refusal(run, doc, row)
        if skipped is not None or run.options.dry_run:
            return skipped
        action = run.result.action
        if action is Action.UNLOCK:
            update = operators.operator_unlock_update()
        else:
            assert to is not None
            kept = replicas.retention_of(run.live.records, run.result.filter.collection)
            update = operators.operator_move_update(to, run.now, kept)
        moved_to = to if to is not None else doc.get("phase")
        change = Change(action, update, moved_to, run.now, run.options.signed)
        collection = run.result.filter.collection
        try:
            after = await self._single.act(
                collection,
                doc,
                change,
                run.live,
                extra=run.plan.query,
                shard=sharding.shard_values(doc, run.shard_key),
            )
        except (DocumentChanged, DocumentNotFound) as exc:
            meanwhile = "changed meanwhile (no longer as read, or no longer matching the filter)"
            return Skipped(row, exc.refusal, meanwhile)
        if action is not Action.UNLOCK:
            await self._trees.wake_owner(collection, after, run.live)
        if action is Action.CANCEL and run.options.children is Children.CANCEL:
            cascade = await self._trees.cascade(collection, after, run.reach)
            run.result.cascade = run.result.cascade.plus(cascade)
        return None

    async def _record(
        self, run: _Run, scope: Mapping[str, Any], failed: BaseException | None = None
    ) -> None:
        """The audit entry of a bulk action: what it changed, and, when it stopped part way
        (``failed``), why. A failure to write it leaves ``failed`` the error that
        propagates, with that noted."""
        result, signed = run.result, run.options.signed
        record = operator_record(
            OperatorAct(result.action.value, signed.by, signed.why, run.now),
            collection=result.filter.collection,
            scope=scope,
            documents=[r.ref or r.id for r in result.changed],
            count=len(result.changed),
            keys=[r.key for r in result.changed],
            failed=None if failed is None else failure_text(failed),
        )
        reports, audit = self._reads.reports, self._reads.audit_collection
        if failed is None:
            await reports.append_audit(audit, record)
            return
        try:
            await reports.append_audit(audit, record)
        except Exception as lost:  # the failure stands; this one is noted on it
            failed.add_note(f"its audit entry was not written either: {lost}")


def _refusal(run: _Run, doc: Document, row: Row) -> tuple[str | None, Skipped | None]:
    """Where ``run`` sends ``doc`` (None: it stays in its phase), and why it is left
    alone, as a single-document action would refuse it (None: it is not)."""
    action, to = run.result.action, run.result.target
    if action is Action.RETRY and to is None:
        to = error_phase(doc)
        if to is None:
            return None, Skipped(row, Refusal.NO_ERROR_PHASE, "no recorded error phase to retry to")
        if not run.options.any_phase:
            try:
                check_target(run.result.filter.collection, to, run.live.records, action=action)
            except UnhandledPhase as exc:
                return to, Skipped.because(row, exc)
    respects_leases = action is Action.RETRY and not run.options.force
    if respects_leases and live_lease(doc, run.now, run.live.in_house):
        why_held = f"held by a live lease of {row.holder!r} (force to take it)"
        return to, Skipped(row, Refusal.LEASE_HELD, why_held)
    if action is Action.UNLOCK and row.state is LeaseState.FREE:
        return to, Skipped(row, Refusal.ALREADY_FREE, "free already: no lease and no wait to end")
    return to, None
