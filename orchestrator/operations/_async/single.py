"""An operator's action on one document, on PyMongo's async API: unlock, retry, cancel,
each applied only while the document is still as the operator saw it (its phase and lease
token, ``operators.operator_guard``), with its history entry and audit record. The fenced
write (``act``) and the audit record (``record``) serve the bulk actions too
(``AsyncBulkActions``). ``SingleActions`` (``_sync/single.py``) is generated from it by
``scripts/synchro.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from orchestrator.core import history, replicas
from orchestrator.core.audit import OperatorAct, operator_record
from orchestrator.core.documents import Document, id_json_or_text
from orchestrator.core.errors import DocumentChanged, DocumentNotFound, LeaseHeld, NoErrorPhase
from orchestrator.core.queries import operators
from orchestrator.operations._async.reads import AsyncReads
from orchestrator.operations.filters import business_key
from orchestrator.operations.results import Cancelled, Retried
from orchestrator.operations.rules import (
    Action,
    Live,
    Signed,
    cancelled_phase,
    check_phase_name,
    check_target,
    error_phase,
    holding,
    live_lease,
)

__all__ = ["AsyncSingleActions", "Change"]

M = TypeVar("M", Retried, Cancelled)


@dataclass(frozen=True)
class Change:
    """An operator's change of a document: ``update`` for ``action`` at ``now`` (the
    server's time), sending it ``to`` a phase (or leaving it in its own), as ``signed``."""

    action: Action
    update: dict[str, Any]
    to: Any
    now: datetime
    signed: Signed


class AsyncSingleActions:
    """Unlock, retry and cancel of one document, reading through ``reads``; the audit
    trail is the collection ``reads`` names."""

    def __init__(self, reads: AsyncReads) -> None:
        self._reads = reads

    async def unlock(self, collection: str, seen: Mapping[str, Any], signed: Signed) -> Document:
        """As ``AsyncOperations.unlock``."""
        reads = self._reads
        now = await reads.now()
        live = Live.of(await reads.reports.live_replicas(now, reads.replicas_collection))
        shard = await reads.shard(collection, seen, live.records)
        update = operators.operator_unlock_update()
        change = Change(Action.UNLOCK, update, seen.get("phase"), now, signed)
        after = await self.act(collection, seen, change, live, shard=shard)
        await self.record(collection, change, {"_id": id_json_or_text(seen["_id"])}, after, live)
        return after

    async def retry(
        self,
        collection: str,
        seen: Mapping[str, Any],
        to: str | None,
        *,
        force: bool,
        any_phase: bool,
        signed: Signed,
    ) -> Retried:
        """As ``AsyncOperations.retry``."""
        if to is None:
            to = error_phase(seen)
            if to is None:
                raise NoErrorPhase(collection, seen["_id"])
        check_phase_name(to)
        live = await self._reads.replicas()
        if not any_phase:
            check_target(collection, to, live, action=Action.RETRY)
        return await self._move(
            Retried, collection, seen, to, force=force, signed=signed, live=Live.of(live)
        )

    async def cancel(
        self,
        collection: str,
        seen: Mapping[str, Any],
        to: str | None,
        *,
        any_phase: bool,
        signed: Signed,
    ) -> Cancelled:
        """As ``AsyncOperations.cancel``."""
        live = await self._reads.replicas()
        target = to if to is not None else cancelled_phase(live)
        check_phase_name(target)
        if to is not None and not any_phase:
            check_target(collection, target, live, action=Action.CANCEL)
        return await self._move(
            Cancelled, collection, seen, target, force=True, signed=signed, live=Live.of(live)
        )

    async def _move(
        self,
        kind: type[M],
        collection: str,
        seen: Mapping[str, Any],
        to: str,
        *,
        force: bool,
        signed: Signed,
        live: Live,
    ) -> M:
        """Send the document ``seen`` to ``to`` as a retry or a cancel (``kind``), as the
        ``live`` replicas keep it (their history length, shard key, in-house leases)."""
        reads = self._reads
        shard = await reads.shard(collection, seen, live.records)
        doc_id, source = seen["_id"], seen.get("phase")
        server = await reads.reports.server_time()
        # ``updatedAt`` starts the phase's clock for the replicas' backoff: the server's.
        now = server or datetime.now(UTC)
        held = live_lease(seen, now, live.in_house)
        if held and not force:
            holder = holding(seen, now, live.in_house)
            raise LeaseHeld(collection, doc_id, holder.holder, holder.until)
        kept = replicas.retention_of(live.records, collection)
        update = operators.operator_move_update(to, now, kept)
        change = Change(kind.action, update, to, now, signed)
        after = await self.act(collection, seen, change, live, shard=shard)
        scope = {"_id": id_json_or_text(doc_id), "to": to}
        await self.record(collection, change, scope, after, live)
        return kind(after, source, to, now, server is not None, held)

    async def act(
        self,
        collection: str,
        seen: Mapping[str, Any],
        change: Change,
        live: Live,
        *,
        extra: Mapping[str, Any] | None = None,
        shard: Mapping[str, Any] | None = None,
    ) -> Document:
        """Apply an operator's ``change`` to the document as ``seen`` (its phase and lease;
        ``extra``: conditions it must still meet, a bulk action's filter; ``shard``: its
        shard key values, so the change targets its shard), with its history entry in a
        history of ``live.keep`` entries (none: 0). The entry is pushed onto a history
        that is a list (or absent), and set whole over any other value, each fenced on
        that shape: a document whose history a writer changed meanwhile is tried once
        more, as it is now. ``live.in_house``: the change carries the ``lockedAt``
        in-house pods read it by, the epoch's even with none
        (``InHouse.operator_update``)."""
        doc_id = seen["_id"]
        update = dict(live.in_house.operator_update(change.update))
        guard = operators.operator_guard(doc_id, seen.get("phase"), seen.get("lockToken"), shard)
        if extra:
            guard = {"$and": [guard, dict(extra)]}
        entry = history.operator_entry(
            action=change.action.value,
            by=change.signed.by,
            why=change.signed.why,
            at=change.now,
            phase=seen.get("phase"),
            to=change.to,
        )
        for shape in (history.LIST_SHAPE, history.OTHER_SHAPE) if live.keep else (None,):
            written = dict(update)
            query = guard
            if shape is not None:
                current = history.ABSENT if shape is history.LIST_SHAPE else None
                written = history.merge(update, history.push(entry, live.keep, current))
                query = {"$and": [guard, shape]}
            after = await self._reads.reports.operator_update(collection, query, written)
            if after is not None:
                return after
        found = await self._reads.reports.find_one(collection, operators.exact_id_filter(doc_id))
        if found is None:
            raise DocumentNotFound(collection, id_json_or_text(doc_id))
        raise DocumentChanged(collection, doc_id)

    async def record(
        self, collection: str, change: Change, scope: Mapping[str, Any], after: Document, live: Live
    ) -> None:
        """The audit entry of ``change`` of one document (``after``: as the change left
        it; ``scope``: what the operator named), naming it by id and business key."""
        reads = self._reads
        key = business_key(after, await reads.keys(collection, live.records))
        await reads.reports.append_audit(
            reads.audit_collection,
            operator_record(
                OperatorAct(change.action.value, change.signed.by, change.signed.why, change.now),
                collection=collection,
                scope=scope,
                documents=[id_json_or_text(after["_id"])],
                count=1,
                keys=[key],
            ),
        )
