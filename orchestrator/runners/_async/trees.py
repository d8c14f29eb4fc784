"""A replica's trees and events: the children a step makes and moves, the waits it stores
and judges, the wakes that end them, and the signals it sends (``orchestrator.core.trees``
says what is stored and decides; this sends it).

A wait is judged when the document is claimed (before any handler runs), right after the
step that stored it (what ended it meanwhile is not missed), and each lock timeout at the
latest. What may end one wakes it: a child's step that leaves it in a phase no handler
claims (or deletes it) sends one write to its parent, due at once if it waits and no step
holds it; a signal is one write, that wakes the document in the same write when it waits
for that name. A replica whose handlers take what it woke claims it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.core import steps
from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError, DocumentNotFound, StoreError
from orchestrator.core.lease_values import Outcome
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.queries import submissions
from orchestrator.core.queries import trees as queries
from orchestrator.core.queries.operators import exact_id_filter, operator_move_update
from orchestrator.core.registry import Handler, Target, resolve
from orchestrator.core.resource import Resource
from orchestrator.core.retention import NO_RETENTION
from orchestrator.core.trees import (
    OWNER_FIELD,
    SIGNALS_FIELD,
    TAKEN_FIELD,
    WAIT_FIELD,
    Delivered,
    Owner,
    Signal,
    Tally,
    Verdict,
    Wait,
    WaitKind,
    check_child_name,
    child_id,
    child_key,
    judge,
    may_end,
    owns_of,
    signals_of,
    taken_of,
)
from orchestrator.mongo import AsyncLease

if TYPE_CHECKING:
    from orchestrator.runners._async.parts import AsyncReplicaParts
    from orchestrator.runners._async.steps import AsyncSteps
    from orchestrator.runners.registration import Registration

__all__ = ["AsyncTrees"]

MAX_CHILDREN = 10_000
"""Children of one document a wait counts at most (in each collection)."""


class AsyncTrees:
    """The trees and events of one replica (``AsyncOrchestrator``'s); the ``AsyncFamily``
    its leases ask about their children."""

    def __init__(
        self,
        parts: AsyncReplicaParts,
        *,
        registration: Registration,
        steps: AsyncSteps,
    ) -> None:
        self._store = parts.store
        self._clock = parts.clock
        self._settings = parts.settings
        self._report = parts.report
        self._retention = parts.retention
        self._registration = registration
        self._books = parts.books
        self._said: set[str] = set()  # collections whose children a wait cannot judge, said
        self._steps = steps  # a submit's insert (lent to a free worker at once), the clock

    @property
    def _handlers(self) -> list[Handler]:
        return self._registration.registry.handlers

    # -- children (a lease's family) -----------------------------------------------------

    async def create_child(
        self,
        lease: AsyncLease[Any],
        target: Target,
        name: str,
        doc: Mapping[str, Any] | Resource,
    ) -> Document:
        check_child_name(name)
        new = self._registration.submission(target, doc, None)
        self._registration.register_unique_keys(new)
        owner = Owner(lease.collection, lease.id, name)
        fields = dict(new.fields)
        fields.setdefault("_id", child_id(lease.collection, lease.id, name))
        keys = new.keys if new.named else ("_id",)
        await self._store.ensure_owner_index(new.collection)
        await self._steps.measure_if_due()
        now = self._clock.now()
        trace = self._report.submitting(new.collection, fields)
        made = submissions.new_document(fields, now, trace)
        made[OWNER_FIELD] = owner.stored()
        kept = self._retention.get(new.collection, NO_RETENTION)
        stored = await self._steps.insert(
            new.collection, submissions.expiring(made, now, kept), keys, due_now=True
        )
        if Owner.read(stored.get(OWNER_FIELD)) != owner:
            raise ConfigError(
                f"{new.collection}/{stored.get('_id')!r} exists and is not the child {name!r}"
                f" of {lease.collection}/{lease.id!r}: give the child another _id"
            )
        return stored

    async def children(self, lease: AsyncLease[Any]) -> list[Document]:
        found: list[Document] = []
        for collection in owns_of(lease.doc, lease.made):
            found += await self._children_in(collection, lease.collection, lease.id)
        return found

    async def move_children(self, lease: AsyncLease[Any], phase: str) -> int:
        moved = 0
        for collection in owns_of(lease.doc, lease.made):
            query = queries.move_children_filter(lease.collection, lease.id, [phase])
            moved += await self._move(collection, query, phase)
        return moved

    async def _move(self, collection: str, query: Mapping[str, Any], phase: str) -> int:
        """Children ``query`` selects sent to ``phase`` as an operator's move sends them
        (dated when the collection retains that phase), then claimed here at once if
        this replica takes them there; how many."""
        kept = self._retention.get(collection, NO_RETENTION)
        update = operator_move_update(phase, self._clock.now(), kept)
        count = await self._store.write_many(collection, query, update)
        if count:
            await self._come_due(collection, phase)
        return count

    # -- waits --------------------------------------------------------------------------

    def waits(self, lease: AsyncLease[Any]) -> bool:
        """Whether the claimed document waits (its step judges the wait, not the handler)."""
        return lease.doc.get(WAIT_FIELD) is not None

    async def resume(self, lease: AsyncLease[Any]) -> Outcome:
        """The step of a waiting document: judge its wait, and end it, or wait on.
        ``ConfigError`` for a stored wait that is no wait (recorded as the step's error)."""
        wait = Wait.read(lease.doc.get(WAIT_FIELD))
        assert wait is not None  # only called when one is stored
        verdict, signal = await self._judge(lease.collection, lease.doc, wait)
        if verdict is Verdict.WAITING:
            return await lease.wait_on(wait)
        if verdict is Verdict.MET:
            taken = None
            if signal is not None:
                inbox = {s.id for s in signals_of(lease.doc)}
                taken = [t for t in taken_of(lease.doc) if t in inbox] + [signal.id]
            return await lease.end_wait(wait.then, taken)
        if verdict is Verdict.FAILED:
            assert wait.on_failure is not None
            if wait.cancel_siblings:
                await self._cancel_children(lease)
            return await lease.end_wait(wait.on_failure, None)
        if wait.on_timeout is not None:
            return await lease.end_wait(wait.on_timeout, None)
        return await lease.fail(f"waited past its timeout for {_waited_for(wait)}")

    async def after(self, lease: AsyncLease[Any], outcome: StepOutcome) -> None:
        """What a step that ended may have to wake: its own wait, met meanwhile; its owner,
        when it ended (its end added to the owner's wait, which wakes it if that may end
        it). Best effort: what fails here is made up for by the waits' judgement each lock
        timeout."""
        try:
            if lease.waiting is not None and outcome is StepOutcome.RELOCKED:
                await self._judge_written(lease, lease.waiting)
            owner = lease.owner
            end = None if owner is None else self._end_of(lease, outcome)
            if owner is not None and end is not None:
                key = child_key(lease.collection, lease.id)
                await self._add_ends(owner.collection, owner.id, [key], [key] if end else [])
        except StoreError as exc:
            self._report.line(
                logging.WARNING,
                f"could not wake what {lease.collection}/{lease.id!r} ended: {exc}; its"
                " wait is judged again within a lock timeout",
                "wake-failed",
            )

    async def _judge_written(self, lease: AsyncLease[Any], wait: Wait) -> None:
        """Judge a wait just written: what ended it while the step ran (a signal, the last
        child) found it held, and woke nothing. A children wait is given the children's
        count and the ends counted, in one write whose answer (with the ends children
        added meanwhile) says whether to wake it."""
        if wait.kind is WaitKind.CHILDREN:
            tally = await self._tally(lease.collection, lease.doc, lease)
            await self._add_ends(
                lease.collection, lease.id, tally.ended_keys, tally.failed_keys, tally.total
            )
            return
        fields = [WAIT_FIELD, SIGNALS_FIELD, TAKEN_FIELD]
        docs = await self._store.find_fields(lease.collection, exact_id_filter(lease.id), fields, 1)
        if docs:
            verdict, _ = await self._judge(lease.collection, docs[0], wait)
            if verdict is not Verdict.WAITING:
                await self._wake(lease.collection, lease.id, wait.kind, wait.name)

    async def _add_ends(
        self,
        collection: str,
        doc_id: Any,
        ended: Sequence[str],
        failed: Sequence[str],
        total: int | None = None,
    ) -> None:
        """Add children's ends to the wait of ``doc_id`` (if it waits for its children),
        and wake it if they may end the wait: one write, a second for the one that may."""
        query = queries.children_wait_filter(doc_id)
        update = queries.ended_update(ended, failed, total)
        found = await self._store.update_and_read(collection, query, update, [WAIT_FIELD])
        if found is not None and may_end(found.get(WAIT_FIELD)):
            await self._wake(collection, doc_id, WaitKind.CHILDREN)

    async def _judge(
        self, collection: str, doc: Mapping[str, Any], wait: Wait
    ) -> tuple[Verdict, Signal | None]:
        now = self._clock.now()
        if wait.kind is WaitKind.SIGNAL:
            return judge(wait, now, signals=signals_of(doc), taken=taken_of(doc))
        return judge(wait, now, tally=await self._tally(collection, doc))

    async def _tally(
        self, collection: str, doc: Mapping[str, Any], lease: AsyncLease[Any] | None = None
    ) -> Tally:
        """A document's children as its wait counts them. Counted not ended, whatever
        their phase: children in a collection none of this replica's handlers take (it
        cannot tell their end from their start), and any past ``MAX_CHILDREN`` in one
        collection; each said once in the log. A wait is never over early."""
        handlers = self._handlers
        total = 0
        ended: list[str] = []
        failed: list[str] = []
        for where in owns_of(doc, () if lease is None else lease.made):
            children = await self._children_in(where, collection, doc.get("_id"))
            known = any(h.collection == where for h in handlers)
            cut = len(children) >= MAX_CHILDREN
            total += len(children) + cut  # cut: at least one more, not read: going on
            if not known or cut:
                self._unjudged(where, known)
            if not known:
                continue
            failing = self._failing(where)
            for child in children:
                phase = child.get("phase")
                if not isinstance(phase, str) or not steps.could_take(handlers, where, phase):
                    ended.append(child_key(where, child.get("_id")))
                    if phase in failing:
                        failed.append(ended[-1])
        return Tally(total, len(ended), len(failed), tuple(ended), tuple(failed))

    def _unjudged(self, collection: str, known: bool) -> None:
        if collection in self._said:
            return
        self._said.add(collection)
        why = (
            f"has more than {MAX_CHILDREN} children in it: those past them are not read"
            if known
            else "is a collection no handler of this replica takes: their end is not known here"
        )
        self._report.line(
            logging.WARNING,
            f"a wait for children in {collection} counts some as going on for ever: {collection}"
            f" {why} (register its handlers on the replicas that judge the wait)",
            "children-unjudged",
        )

    async def _cancel_children(self, lease: AsyncLease[Any]) -> None:
        """A failed child's siblings still going on, cancelled (its wait's
        ``cancel_siblings``), as an operator's cancel moves them."""
        handlers = self._handlers
        for collection in owns_of(lease.doc, lease.made):
            active = [
                child["_id"]
                for child in await self._children_in(collection, lease.collection, lease.id)
                if isinstance(phase := child.get("phase"), str)
                and steps.could_take(handlers, collection, phase)
            ]
            if active:
                cancelled = self._settings.cancelled_phase
                await self._move(collection, queries.ids_filter(active), cancelled)

    async def _children_in(self, collection: str, owner: str, owner_id: Any) -> list[Document]:
        query = queries.children_filter(owner, owner_id)
        return await self._store.find_fields(
            collection, query, ["phase", OWNER_FIELD], MAX_CHILDREN
        )

    def _end_of(self, lease: AsyncLease[Any], outcome: StepOutcome) -> bool | None:
        """How the step left its document: None, not ended; else ended (deleted, or in a
        phase no handler here claims), True when it failed (its failed or cancelled
        phase)."""
        if outcome is StepOutcome.REMOVED:
            return False
        if outcome not in (StepOutcome.ADVANCED, StepOutcome.FAILED):
            return None
        left = lease.outcome
        phase = left.phase if left is not None else None
        if not isinstance(phase, str) or steps.could_take(self._handlers, lease.collection, phase):
            return None
        return outcome is StepOutcome.FAILED or phase in self._failing(lease.collection)

    def _failing(self, collection: str) -> set[str]:
        """The phases a child of ``collection`` fails into: its handlers' failed phases,
        and the cancelled phase."""
        failing = {h.failed_phase for h in self._handlers if h.collection == collection}
        failing.add(self._settings.cancelled_phase)
        return failing

    async def _wake(
        self, collection: str, doc_id: Any, kind: WaitKind, name: str | None = None
    ) -> bool:
        """Make the document due at once if it waits (for ``kind``) and no step holds it;
        then claimed here if this replica's handlers take it."""
        query = queries.waiting_filter(doc_id, kind, name)
        woke = await self._store.write(collection, query, queries.wake_update())
        if woke:
            await self._come_due(collection, None)
        return woke

    async def _come_due(self, collection: str, phase: str | None) -> None:
        """What was made due in ``collection`` (in ``phase``; None: any) is claimed here
        now by the handlers that take it, not at the next tick."""
        taking = steps.takers(self._handlers, collection, phase)
        if taking:
            self._books.came_due(taking)

    # -- signals ------------------------------------------------------------------------

    async def signal(
        self, target: Target, doc_id: Any, name: str, payload: Any = None
    ) -> Delivered:
        collection, _ = resolve(target)
        await self._steps.measure_if_due()
        sending = queries.delivery(doc_id, name, payload, self._clock.now())
        if await self._store.write(collection, *sending.waking):
            await self._come_due(collection, None)
            return Delivered(sending.signal.id, woke=True)
        if await self._store.write(collection, *sending.storing):
            return Delivered(sending.signal.id, woke=False)
        raise DocumentNotFound(collection, repr(doc_id))


def _waited_for(wait: Wait) -> str:
    return f"signal {wait.name!r}" if wait.kind is WaitKind.SIGNAL else "its children"
