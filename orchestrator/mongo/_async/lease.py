"""A handler's hold on one document for one step (``AsyncLease``, and ``Lease`` generated
from it).

Every write a lease makes carries its token in the filter (fencing): once another replica
has claimed the document, this lease's writes match nothing and raise ``LeaseLost``
instead of overwriting the new holder's lease. What each outcome writes, and which
fence it carries, are decided by the ``LeaseCore`` (``orchestrator.core.lease``) this lease
holds, in the state its table gives (``orchestrator.core.lease_state``); this class sends
the writes and tells the core what the store answered (the sync ``Lease`` is generated
from it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import pymongo

from orchestrator.core.errors import LeaseLost, StoreError
from orchestrator.core.lease import Carrier, LeaseCore
from orchestrator.core.lease_values import Carry, Outcome, Write
from orchestrator.core.outcomes import LeaseWrite
from orchestrator.core.queries import lease_writes, limit_slots
from orchestrator.core.registry import resolve
from orchestrator.core.trees import (
    OWNER_FIELD,
    TAKEN_FIELD,
    WAIT_FIELD,
    Need,
    Owner,
    Signal,
    Wait,
    WaitKind,
    owns_of,
    signals_of,
)
from orchestrator.mongo.driver_errors import DocumentTooLarge

if TYPE_CHECKING:
    from orchestrator.core.documents import Document
    from orchestrator.core.limits import Slot
    from orchestrator.core.registry import Handler, Target
    from orchestrator.core.resource import Resource
    from orchestrator.mongo._async.contract import AsyncLeaseStore

__all__ = ["AsyncFamily", "AsyncLease"]

R = TypeVar("R")

_UNCONFIRMED = "its extension was not confirmed before it expired"
_EXPIRED = "it expired before its extension was sent"
_SLOT_TAKEN = "its slot of the handler's global_limit was taken (it expired) before its renewal"


class AsyncFamily(Protocol):
    """What a lease asks of its engine about the documents its own owns (the engine's
    ``trees``: it knows the models, the handlers and the collections)."""

    async def create_child(
        self,
        lease: AsyncLease[Any],
        target: Target,
        name: str,
        doc: Mapping[str, Any] | Resource,
    ) -> Document:
        """The child ``name`` of ``lease``'s document, made unless it is there."""

    async def children(self, lease: AsyncLease[Any]) -> list[Document]:
        """The children of ``lease``'s document, whatever their phase."""

    async def move_children(self, lease: AsyncLease[Any], phase: str) -> int:
        """Its children not in ``phase`` sent there; how many."""


class AsyncLease(Generic[R]):
    """``doc`` is the claimed document as stored; ``resource`` is it validated by the
    handler's model (the same dict for handlers registered on a collection name).

    It holds a ``LeaseCore`` (``_core``): each method below plans its write there, checks
    it against the lease's state, sends it, and fires the state's event with the answer.

    A plain ``def`` handler in the ``AsyncOrchestrator`` gets a ``ThreadLease`` instead:
    the blocking API of ``Lease``, but not a ``Lease`` (it has no sync store to write
    through; it runs the ``AsyncLease``'s outcomes on the event loop), so it is not an
    instance of this class either; annotate such handlers ``BlockingLease``, which both
    satisfy.
    """

    def __init__(self, *, store: AsyncLeaseStore, core: LeaseCore[R]) -> None:
        self._core = core
        self._store = store
        self._lock = asyncio.Lock()  # serialises the step's writes with the heartbeat's
        self.family: AsyncFamily | None = None
        """Set by the engine: what makes and finds this document's children."""

    # -- what it says about itself (the core's) -------------------------------------------

    @property
    def doc(self) -> dict[str, Any]:
        return self._core.doc

    @property
    def resource(self) -> R:
        return self._core.resource

    @resource.setter
    def resource(self, value: R) -> None:
        self._core.resource = value

    @property
    def handler(self) -> Handler:
        return self._core.handler

    @property
    def token(self) -> str:
        return self._core.token

    @property
    def id(self) -> Any:
        return self._core.id

    @property
    def collection(self) -> str:
        return self._core.collection

    @property
    def phase(self) -> str | None:
        return self._core.phase

    @property
    def held(self) -> bool:
        """True until this lease is released or found lost."""
        return self._core.held

    @property
    def lost(self) -> bool:
        """True once a write found the document held by another lease (or its phase
        changed from outside): nothing more may be written for this step."""
        return self._core.lost

    @property
    def outcome(self) -> Outcome | None:
        """The step's own outcome, once one landed: the first one stands."""
        return self._core.outcome

    @property
    def claimed_at(self) -> datetime:
        return self._core.claimed_at

    @property
    def locked_at(self) -> datetime:
        return self._core.locked_at

    @property
    def expires_at(self) -> datetime:
        return self._core.expires_at

    def expired(self, now: datetime) -> bool:
        """True once this lease's expiry has passed: another replica may hold it now."""
        return self._core.expired(now)

    # -- what the engine reads and sets ---------------------------------------------------

    @property
    def taken_from(self) -> str | None:
        return self._core.taken_from

    @property
    def throttled(self) -> bool:
        return self._core.throttled

    @throttled.setter
    def throttled(self, value: bool) -> None:
        self._core.throttled = value

    @property
    def carrier(self) -> Carrier | None:
        return self._core.carrier

    @carrier.setter
    def carrier(self, value: Carrier | None) -> None:
        self._core.carrier = value

    @property
    def carried(self) -> Carry | None:
        return self._core.carried

    @property
    def slots(self) -> list[Slot]:
        return self._core.slots

    @slots.setter
    def slots(self, value: list[Slot]) -> None:
        self._core.slots = value

    @property
    def holds_slots(self) -> bool:
        return self._core.holds_slots

    # -- what handlers call ---------------------------------------------------------------

    async def unlock(self, **fields: Any) -> Outcome:
        """Step done, more to do: release now so the next step can be claimed at once."""
        async with self._lock:
            return await self._write(*self._core.unlock_write(fields))

    async def relock(self, wait: float | None = None, **fields: Any) -> Outcome:
        """Waiting on something outside: release, claimable again after ``wait`` seconds
        (by default the handler's relock policy; never less than the floor of one tick)."""
        async with self._lock:
            return await self._write(*self._core.relock_write(wait, fields))

    async def advance(self, phase: str, **fields: Any) -> Outcome:
        """Enter ``phase`` (setting ``fields`` with it) and release at once.

        Fenced on the phase the step was claimed in too: if an outside writer (the API
        cancelling, say) changed the phase meanwhile, the advance raises ``LeaseLost``, the
        lease is released, and the document stays in the phase the outside writer chose.
        """
        async with self._lock:
            return await self._write(*self._core.advance_write(phase, fields))

    async def remove(self) -> Outcome:
        """Delete the document (the end of its life), fenced like ``advance``: on the
        token and on the phase the step was claimed in, so a document whose phase an
        outside writer changed meanwhile (the API cancelling) is kept, and released."""
        core = self._core
        outcome = core.remove_outcome()
        async with self._lock:
            core.check(LeaseWrite.REMOVE)
            if not await self._store.delete(core.collection, core.fence(True)):
                await self._release_after_outside_change()
                raise core.lose(LeaseWrite.REMOVE)
            core.removed(outcome)
        return outcome

    async def fail(self, reason: str) -> Outcome:
        """Give up now: the failed phase, with ``reason`` recorded, no further attempts."""
        return await self.record_error("Failed", reason, permanent=True, after=False)

    async def extend(self) -> None:
        """Renew the lease for another lock timeout, for a step longer than one.

        The write must be confirmed before the lease expires: another replica may claim
        the document from then on, so an extension that fails, or is confirmed only
        after the expiry, leaves the lease lost (the step's later writes raise
        ``LeaseLost``). On a server the write is bounded by the time left
        (``pymongo.timeout``), so it does not outlive the lease it extends. The slot of the
        handler's ``global_limit``, if any, is renewed first, to the same expiry, so the
        step never holds its lease without its slot; a slot taken meanwhile leaves the
        lease lost, and a lease lost frees its slot.
        """
        core = self._core
        now, until, update = core.extend_write()
        async with self._lock:
            core.check(LeaseWrite.EXTEND)
            left = core.seconds_left()
            if left <= 0:
                raise await self._lose(LeaseWrite.EXTEND, _EXPIRED)
            fence = core.fence(False)  # held: the token, and the shard key if declared
            try:
                with pymongo.timeout(left):
                    kept = await self._renew_slots(until)
                    matched = kept and await self._store.write(core.collection, fence, update)
            except StoreError:
                if core.seconds_left() <= 0:
                    raise await self._lose(LeaseWrite.EXTEND, _UNCONFIRMED) from None
                core.extension_unconfirmed(until)
                raise
            if not kept:
                raise await self._lose(LeaseWrite.EXTEND, _SLOT_TAKEN)
            if not matched:
                raise await self._lose(LeaseWrite.EXTEND)
            if core.seconds_left() <= 0:
                raise await self._lose(LeaseWrite.EXTEND, _UNCONFIRMED)
            core.extended(now, until)

    async def free_slots(self) -> None:
        """Free the slots of the handler's ``global_limit`` this step holds (its step ended,
        or step_timeout took it back), each fenced on this lease's token: a slot another
        step took since is not touched. Each is freed once; a failure (``StoreError``)
        leaves it to expire with the lease; a free cancelled under way is tried again by
        the next call (its write may not have been sent)."""
        async with self._lock:
            await self._free_slots()

    async def _renew_slots(self, until: datetime) -> bool:
        """Renew the held global slots to ``until``; False when one was taken meanwhile
        (it expired and another step took it): it is not this step's any more."""
        name = self._core.settings.slots_collection
        for slot in self._core.held_slots():
            fence = limit_slots.slot_fence(slot.id, slot.token)
            if not await self._store.write(name, fence, limit_slots.extend_slot_update(until)):
                slot.freed = True
                return False
            slot.until = until
        return True

    async def _free_slots(self) -> None:
        name = self._core.settings.slots_collection
        for slot in self._core.held_slots():
            fence = limit_slots.slot_fence(slot.id, slot.token)
            try:
                await self._store.write(name, fence, limit_slots.free_slot_update())
            except StoreError:
                slot.freed = True
                raise
            slot.freed = True

    async def _lose(self, action: LeaseWrite, reason: str | None = None) -> LeaseLost:
        """``LeaseCore.lose``, its global slots freed first (if that fails they expire with
        it)."""
        with contextlib.suppress(StoreError):
            await self._free_slots()
        return self._core.lose(action, reason)

    # -- progress and a cancel seen while running ----------------------------------------

    async def progress(self, fraction: float, note: str | None = None) -> None:
        """Say how far the step is (``fraction`` from 0 to 1, a short ``note``): stored on
        the document (``orchestratorProgress``) for the page and ``find``, fenced as an
        extension is (``LeaseLost`` once the lease is gone). At most one write per
        ``Settings.progress_interval``: a call inside it is kept, and written by the next
        call past it or by the step's outcome, in that same write. A bad fraction or note
        is a one-line ``ConfigError``, nothing written."""
        core = self._core
        async with self._lock:
            core.check(LeaseWrite.EXTEND)
            update = core.progress_write(fraction, note)
            if update is None:
                return
            if not await self._store.write(core.collection, core.fence(False), update):
                raise await self._lose(LeaseWrite.EXTEND)
            core.progress_written()

    @property
    def cancel_requested(self) -> bool:
        """True once the heartbeat found the document moved by an operator (a cancel, a
        retry) or deleted while the step runs: a long step may stop early. Its next write
        raises ``LeaseLost`` either way. (``lost`` says the lease is gone, whoever took
        it: another replica after it expired, too.)"""
        return self._core.cancel_requested

    def outside_change(self) -> None:
        """The engine's: the heartbeat found the document changed from outside."""
        self._core.cancel_requested = True

    # -- trees and events (``orchestrator.core.trees``) ----------------------------------

    @property
    def owner(self) -> Owner | None:
        """The document that owns this one (its parent), or None."""
        return Owner.read(self.doc.get(OWNER_FIELD))

    @property
    def signals(self) -> list[Signal]:
        """The signals sent to this document, oldest first (the latest ``MAX_SIGNALS``)."""
        return signals_of(self.doc)

    def signal(self, name: str) -> Signal | None:
        """The latest signal named ``name`` (the one a wait for it ended on), or None."""
        found = [s for s in self.signals if s.name == name]
        return found[-1] if found else None

    async def create_child(
        self, target: Target, name: str, doc: Mapping[str, Any] | Resource
    ) -> Document:
        """Make the child ``name`` of this document in ``target`` (a collection or a
        model), owned by it, in its first phase and due at once; idempotent: a retried
        step finds the child it made (its ``_id`` derives from this document and
        ``name`` unless ``doc`` gives one). Returns it as stored."""
        self._core.check(LeaseWrite.EXTEND)
        made = await self._family_of().create_child(self, target, name, doc)
        collection, _ = resolve(target)
        if collection not in self._core.made:
            self._core.made.append(collection)
        return made

    async def children(self) -> list[Document]:
        """This document's children, whatever their phase (``_id``, ``phase`` and owner)."""
        return await self._family_of().children(self)

    async def move_children(self, phase: str) -> int:
        """Send this document's children not in ``phase`` there, as an operator's move
        does (a step running on one loses its lease at its next write): a deletion's
        first step, say, before it waits for them. A retried step moves none twice."""
        self._core.check(LeaseWrite.EXTEND)
        return await self._family_of().move_children(self, phase)

    async def wait_for(
        self,
        name: str,
        *,
        then: str,
        timeout: Any = None,
        on_timeout: str | None = None,
    ) -> Outcome:
        """Release until a signal ``name`` comes (``orch.signal``; one sent before is
        found too, unless an earlier wait ended on it), then enter ``then`` at once; with
        ``timeout`` (seconds), ``on_timeout`` (or the failed phase) once it passes."""
        wait = self._core.plan_wait(
            WaitKind.SIGNAL, then=then, name=name, timeout=timeout, on_timeout=on_timeout
        )
        return await self.wait_on(wait)

    async def wait_for_children(
        self,
        *,
        then: str,
        need: Any = Need.ALL,
        on_failure: str | None = None,
        cancel_siblings: bool = False,
        timeout: Any = None,
        on_timeout: str | None = None,
    ) -> Outcome:
        """Release until this document's children have ended (``need``: ``"all"``,
        ``"any"`` or a number; ended: in a phase no handler claims, or deleted), then
        enter ``then`` at once. A child that failed (its failed or cancelled phase) counts
        as ended unless ``on_failure`` names the phase it sends this one to (with
        ``cancel_siblings``, the others are cancelled first). ``timeout`` and
        ``on_timeout`` as ``wait_for``'s."""
        wait = self._core.plan_wait(
            WaitKind.CHILDREN,
            then=then,
            need=need,
            on_failure=on_failure,
            cancel_siblings=cancel_siblings,
            timeout=timeout,
            on_timeout=on_timeout,
        )
        return await self.wait_on(wait)

    @property
    def made(self) -> list[str]:
        """The collections this step made children in."""
        return list(self._core.made)

    @property
    def waiting(self) -> Wait | None:
        """The wait this step's outcome stored, if it was one."""
        return self._core.waiting

    async def wait_on(self, wait: Wait) -> Outcome:
        """Store ``wait`` (the engine's: a wait judged and not over, written again)."""
        owns = owns_of(self.doc, self._core.made)
        async with self._lock:
            return await self._write(*self._core.wait_write(wait, owns))

    async def end_wait(self, phase: str, taken: list[str] | None) -> Outcome:
        """Enter ``phase``, the stored wait over (the engine's); ``taken``: the inbox's
        signals waits have ended on, the one this one did last."""
        managed: dict[str, Any] = {WAIT_FIELD: None}
        if taken is not None:
            managed[TAKEN_FIELD] = taken
        async with self._lock:
            return await self._write(*self._core.advance_write(phase, {}, managed))

    def _family_of(self) -> AsyncFamily:
        if self.family is None:
            raise StoreError("this lease has no engine to make or find its children")
        return self.family

    # -- what the loop calls --------------------------------------------------------------

    async def record_error(
        self,
        kind: str,
        message: str,
        *,
        permanent: bool = False,
        after: bool = True,
        trace: str | None = None,
    ) -> Outcome:
        """Count a failed attempt: retry after the handler's backoff, or, past its
        ``max_attempts`` (or when ``permanent``), move to its failed phase. Once per step:
        a second record raises ``LeaseLost``.

        ``after``: also on a lease the step already released with an outcome of its own
        (a handler that advanced, then raised): that outcome stands and is returned, and
        the error is only noted on the document, fenced on its being as that release left
        it. A write the server refuses as too large is tried again with less stored: the
        attempt must count. ``trace``: the error's traceback, as stored
        (``history.trace_text``).
        """
        core = self._core
        async with self._lock:
            # Planned and written under one hold of the lock: the state it was planned for
            # (held, or released by the step's own outcome) is the state it is fenced on.
            core.check(LeaseWrite.RECORD, after)
            planned = core.error_write(kind, message, permanent, trace)
            if not planned.forms:  # noted after a remove: no document to note it on
                return planned.outcome
            *larger, last = planned.forms
            for write in larger:
                try:
                    return await self._apply(write, planned.outcome)
                except DocumentTooLarge:
                    continue
            return await self._apply(last, planned.outcome)

    async def release(self) -> Outcome:
        """Hand back a lease whose step never ran (subject to the budget, like any release)."""
        async with self._lock:
            return await self._write(*self._core.release_write())

    # -- internals -------------------------------------------------------------------------

    async def _write(self, write: Write, outcome: Outcome) -> Outcome:
        """A releasing write by the handler, planned and written under one hold of the lock
        (the caller's), which serialises it with the heartbeat's extends: so the lease it
        may carry on starts when it was planned (``Write.at``), with no wait between. An
        unlock or advance into work this replica does next carries the lease on in the
        same write (``LeaseCore.carry_plan``); if that finds the document changed from
        outside (or the lease lost), or the server refuses it as too large, the plain
        write decides, as it would have alone."""
        core = self._core
        core.check(write.action)
        carry = core.carry_plan(write)
        if carry is not None:
            try:
                doc = await self._store.carry(core.collection, carry.fence, carry.update)
            except DocumentTooLarge:  # the next claim does not fit: release, lighter
                doc = None
            if doc is not None:
                carry.doc = doc
                return core.carried_on(write, outcome, carry)
        return await self._apply(write, outcome)

    async def _apply(self, write: Write, outcome: Outcome) -> Outcome:
        """Carry ``write`` out, fenced as the lease's state says (the caller holds the lock
        and checked the state), in its lighter forms in turn while the server refuses one
        as too large. Returns the step's outcome: ``outcome``, or the one its release
        gave first."""
        core = self._core
        query = core.fence(write.phase_change)
        if not await self._lightest(query, write):
            if core.held and write.phase_change:
                await self._release_after_outside_change()
            raise core.lose(write.action)
        return core.landed(write, outcome)

    async def _lightest(self, query: dict[str, Any], write: Write) -> bool:
        """Whether ``write`` matched: its first form the server takes (``DocumentTooLarge``
        from the last, if none fits)."""
        *larger, last = write.forms
        for update in larger:
            with contextlib.suppress(DocumentTooLarge):
                return await self._store.write(self.collection, query, update)
        return await self._store.write(self.collection, query, last)

    async def _release_after_outside_change(self) -> None:
        """The phase-fenced write matched nothing: if the token still matches, the phase was
        changed from outside while the step ran; let the document go at once."""
        fence = self._core.fence(False)
        with contextlib.suppress(StoreError):  # if it fails, the lease expires on its own
            await self._store.write(self.collection, fence, lease_writes.release_update())

    def __repr__(self) -> str:
        core = self._core
        return (
            f"<{type(self).__name__} {core.collection}/{core.id} phase={core.phase} "
            f"{core.state.value}>"
        )
