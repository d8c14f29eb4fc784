"""Trees and events from the operators' side, on PyMongo's async API: a signal sent to a
document, a cancel that reaches the documents the cancelled one owns (its children, and
theirs), and the wake of an owner whose child an operator moved to a phase it is done
with. ``TreeActions`` (``_sync/trees.py``) is generated from it by ``scripts/synchro.py``.

The operator's process is no replica: it claims nothing. What it wakes (a document
waiting for the signal sent, an owner waiting for its children) is made due at once
(``lockedUntil`` the epoch), and the next tick of a replica whose handlers take it claims
it and judges its wait; a step holding it meanwhile judges the wait it writes itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from orchestrator.core import replicas, sharding
from orchestrator.core.audit import OperatorAct, operator_record
from orchestrator.core.documents import id_json_or_text
from orchestrator.core.errors import DocumentChanged, DocumentNotFound
from orchestrator.core.queries import operators
from orchestrator.core.queries import trees as queries
from orchestrator.core.trees import OWNER_FIELD, Delivered, Owner, WaitKind, owns_of
from orchestrator.operations._async.reads import AsyncReads
from orchestrator.operations._async.single import AsyncSingleActions, Change
from orchestrator.operations.filters import LIST_PROJECTION, business_key
from orchestrator.operations.results import Cascade, Descendant
from orchestrator.operations.rules import (
    Action,
    Children,
    Live,
    Signed,
    cancelled_phase,
    done_with,
)

__all__ = ["CANCEL_TRIES", "MAX_CASCADE", "AsyncTreeActions", "Budget", "Reach"]

MAX_CASCADE = 10_000
"""Documents one cancel's cascade looks at most (a bulk cancel's, all its cascades
together); past it the cascade stops and says so (``Cascade.cut``)."""
CANCEL_TRIES = 3
"""Reads of a descendant that moved between its read and its cancel before it is left."""


@dataclass
class Budget:
    """How many more documents a cascade may look at (``MAX_CASCADE`` in all), and the
    documents it met already, by collection and id (an owner's cycle, stored garbage,
    is never followed round)."""

    room: int = field(default_factory=lambda: MAX_CASCADE)
    met: set[tuple[str, str]] = field(default_factory=set)


@dataclass(frozen=True)
class Reach:
    """A cancel's cascade as judged once for all its documents: who cancels (``signed``),
    the ``live`` replicas, the server's time ``now``, and what it may still look at
    (``budget``: a bulk cancel's cascades share one)."""

    signed: Signed
    live: Live
    now: datetime
    budget: Budget = field(default_factory=Budget)


@dataclass(frozen=True)
class _Owner:
    """A document whose children a cascade looks for: where it is, its id, and the
    collections its children are in."""

    collection: str
    id: Any
    owns: tuple[str, ...]

    @classmethod
    def of(cls, collection: str, doc: Mapping[str, Any]) -> _Owner:
        return cls(collection, doc.get("_id"), tuple(owns_of(doc)))

    @property
    def name(self) -> str:
        """``collection/id``, the id as text (as a history's reader reads it)."""
        return f"{self.collection}/{self.id}"

    @property
    def ref(self) -> str:
        """``collection/id``, the id as canonical Extended JSON (as the audit trail names
        documents: exactly)."""
        return f"{self.collection}/{id_json_or_text(self.id)}"


class AsyncTreeActions:
    """Signals, cascades and wakes, reading through ``reads`` and moving documents as
    ``single`` does (its fenced write, its history entry, its audit record)."""

    def __init__(self, reads: AsyncReads, single: AsyncSingleActions) -> None:
        self._reads = reads
        self._single = single

    # -- signals ------------------------------------------------------------------------

    async def signal(
        self, collection: str, doc_id: Any, name: str, payload: Any, signed: Signed
    ) -> Delivered:
        """As ``AsyncOperations.signal``: the engine's delivery (``queries.delivery``),
        written by the operator, audited."""
        reads = self._reads
        now = await reads.now()
        sending = queries.delivery(doc_id, name, payload, now)
        woke = True
        after = await reads.reports.operator_update(collection, *sending.waking)
        if after is None:
            woke = False
            after = await reads.reports.operator_update(collection, *sending.storing)
        if after is None:
            raise DocumentNotFound(collection, id_json_or_text(doc_id))
        scope = {"_id": id_json_or_text(doc_id), "signal": name, "woke": "yes" if woke else "no"}
        key = business_key(after, await reads.keys(collection))
        if key is not None:
            scope["key"] = key
        act = OperatorAct("signal", signed.by, signed.why, now)
        await reads.reports.append_audit(
            reads.audit_collection,
            operator_record(
                act,
                collection=collection,
                scope=scope,
                documents=[id_json_or_text(doc_id)],
                count=1,
                keys=[key],
            ),
        )
        return Delivered(sending.signal.id, woke)

    # -- an owner's wake ----------------------------------------------------------------

    async def wake_owner(self, collection: str, moved: Mapping[str, Any], live: Live) -> bool:
        """Wake the owner of ``moved`` (a document an operator just moved) if it is in a
        phase the live replicas are done with and its owner waits for its children: the
        owner judges its wait at its next claim, not a lock timeout later. Whether one
        was woken."""
        owner = Owner.read(moved.get(OWNER_FIELD))
        if owner is None or not done_with(live.records, collection, moved.get("phase")):
            return False
        woken = await self._reads.reports.operator_update(
            owner.collection,
            queries.waiting_filter(owner.id, WaitKind.CHILDREN),
            queries.wake_update(),
        )
        return woken is not None

    # -- a cancel's cascade -------------------------------------------------------------

    async def cascade(self, collection: str, root: Mapping[str, Any], reach: Reach) -> Cascade:
        """Cancel what ``root`` (cancelled already) owns, and what those own in turn,
        breadth first: each descendant the live replicas are not done with is sent to the
        cancelled phase as an operator's cancel sends it (its running step loses its
        lease), its history and an audit record per owner and collection saying whose
        cancel it follows; those done with are left, and their own children looked at
        all the same. At most ``reach.budget.room`` documents are looked at
        (``Cascade.cut`` past them), each once (a cycle of owners is not followed
        round)."""
        budget = reach.budget
        budget.met.add((collection, id_json_or_text(root.get("_id"))))
        target = cancelled_phase(reach.live.records)
        queue = deque([_Owner.of(collection, root)])
        root_ref = queue[0].ref
        cancelled: list[Descendant] = []
        left: list[Descendant] = []
        cut = False
        while queue and not cut:
            owner = queue.popleft()
            for where in owner.owns:
                children = await self._reads.reports.find_many(
                    where,
                    queries.children_filter(owner.collection, owner.id),
                    [("_id", 1)],
                    budget.room + 1,
                    LIST_PROJECTION,
                )
                if len(children) > budget.room:
                    cut, children = True, children[: budget.room]
                done: list[Mapping[str, Any]] = []
                for child in children:
                    mark = (where, id_json_or_text(child.get("_id")))
                    if mark in budget.met:
                        continue
                    budget.met.add(mark)
                    budget.room -= 1
                    queue.append(_Owner.of(where, child))
                    text = str(child.get("_id"))
                    seen = Descendant(where, text, mark[1], owner.name, _phase(child))
                    if await self._cancel(where, child, owner.name, target, reach):
                        cancelled.append(seen)
                        done.append(child)
                    else:
                        left.append(seen)
                if done:
                    await self._record(where, owner.ref, root_ref, target, reach, done=done)
                if cut:
                    break
        return Cascade(Children.CANCEL, tuple(cancelled), tuple(left), cut)

    async def _cancel(
        self, where: str, child: Mapping[str, Any], owner: str, target: str, reach: Reach
    ) -> bool:
        """Cancel one descendant of ``owner`` unless the live replicas are done with it;
        read again when it moved between its read and its cancel (its step advanced,
        say), up to ``CANCEL_TRIES`` reads. Whether it was cancelled."""
        signed, live, now = reach.signed, reach.live, reach.now
        why = f"cancel of its owner {owner}" + (f": {signed.why}" if signed.why else "")
        kept = replicas.retention_of(live.records, where)
        update = operators.operator_move_update(target, now, kept)
        change = Change(Action.CANCEL, update, target, now, replace(signed, why=why))
        shard_key = await self._reads.shard_key(where, live.records)
        seen: Mapping[str, Any] | None = child
        for _ in range(CANCEL_TRIES):
            if seen is None or done_with(live.records, where, seen.get("phase")):
                return False
            try:
                await self._single.act(
                    where, seen, change, live, shard=sharding.shard_values(seen, shard_key)
                )
            except DocumentChanged:
                seen = await self._reads.reports.find_one(
                    where, operators.exact_id_filter(child["_id"])
                )
            except DocumentNotFound:
                return False
            else:
                return True
        return False

    async def _record(
        self,
        where: str,
        owner: str,
        root: str,
        target: str,
        reach: Reach,
        *,
        done: list[Mapping[str, Any]],
    ) -> None:
        """The audit record of the descendants ``done`` in ``where`` cancelled as
        ``owner``'s, in the cancel of ``root`` (each ``_Owner.ref``), by id and business
        key."""
        reads, signed = self._reads, reach.signed
        keys = await reads.keys(where, reach.live.records)
        await reads.reports.append_audit(
            reads.audit_collection,
            operator_record(
                OperatorAct(Action.CANCEL.value, signed.by, signed.why, reach.now),
                collection=where,
                scope={"cascadeFrom": owner, "root": root, "to": target},
                documents=[id_json_or_text(child["_id"]) for child in done],
                count=len(done),
                keys=[business_key(child, keys) for child in done],
            ),
        )


def _phase(doc: Mapping[str, Any]) -> str | None:
    phase = doc.get("phase")
    return None if phase is None else str(phase)
