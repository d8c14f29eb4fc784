"""A handler's hold on one document for one step, on the async store.

Every write a lease makes carries its token in the filter (fencing): once another replica
has claimed the document, this lease's writes match nothing and raise ``LeaseLost``
instead of overwriting the new holder's lease. What each outcome writes, and the state
machine that decides which fence a write carries, are ``orchestrator.core.lease``'s; this
class only carries the writes (the sync ``Lease`` is generated from it).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.core import queries
from orchestrator.core.errors import LeaseLost, StoreError
from orchestrator.core.lease import LeaseCore, Outcome, Write
from orchestrator.mongo.common import DocumentTooLarge

if TYPE_CHECKING:
    from orchestrator.mongo._async.store import AsyncStore

__all__ = ["AsyncLease"]

R = TypeVar("R")


class AsyncLease(LeaseCore[R]):
    """``doc`` is the claimed document as stored; ``resource`` is it validated by the
    handler's model (the same dict for handlers registered on a collection name).

    A plain ``def`` handler in the ``AsyncOrchestrator`` gets a ``ThreadLease`` instead:
    the blocking API of ``Lease``, but not a ``Lease`` (it has no sync store to write
    through; it runs the ``AsyncLease``'s outcomes on the event loop), so it is not an
    instance of this class either; see its docstring.
    """

    def __init__(self, *, store: AsyncStore, **core: Any) -> None:
        super().__init__(**core)
        self._store = store
        self._lock = asyncio.Lock()  # serialises the step's writes with the heartbeat's

    # -- what handlers call ---------------------------------------------------------------

    async def unlock(self, **fields: Any) -> Outcome:
        """Step done, more to do: release now so the next step can be claimed at once."""
        write, wait = self._unlock_write(fields)
        await self._write(write)
        return Outcome("unlocked", self.phase, wait, self.token)

    async def relock(self, wait: float | None = None, **fields: Any) -> Outcome:
        """Waiting on something outside: release, claimable again after ``wait`` seconds
        (by default the handler's relock policy; never less than the floor of one tick)."""
        write, waited = self._relock_write(wait, fields)
        await self._write(write)
        return Outcome("relocked", self.phase, waited, self.token)

    async def advance(self, phase: str, **fields: Any) -> Outcome:
        """Enter ``phase`` (setting ``fields`` with it) and release at once.

        Fenced on the phase the step was claimed in too: if an outside writer (the API
        cancelling, say) changed the phase meanwhile, the advance raises ``LeaseLost``, the
        lease is released, and the document stays in the phase the outside writer chose.
        """
        write, wait = self._advance_write(phase, fields)
        await self._write(write)
        return Outcome("advanced", phase, wait, self.token)

    async def remove(self) -> Outcome:
        """Delete the document (the end of its life), fenced like every write."""
        async with self._lock:
            self._check_allowed("remove")
            try:
                await self._store.delete(self.collection, self.id, self.token)
            except LeaseLost:
                raise self._lost("remove") from None
            self._released(None)
        return Outcome("removed", self.phase, None, self.token)

    async def fail(self, reason: str) -> Outcome:
        """Give up now: the failed phase, with ``reason`` recorded, no further attempts."""
        return await self.record_error("Failed", reason, permanent=True)

    async def extend(self) -> None:
        """Renew the lease for another lock timeout, for a step longer than one."""
        now, until, update = self._extend_write()
        async with self._lock:
            self._check_allowed("extend")
            fence = queries.fenced(self.id, self.token)
            if not await self._store.write(self.collection, fence, update):
                raise self._lost("extend")
            self._extended(now, until)

    # -- what the loop calls --------------------------------------------------------------

    async def record_error(self, kind: str, message: str, *, permanent: bool = False) -> Outcome:
        """Count a failed attempt: retry after the handler's backoff, or, past its
        ``max_attempts`` (or when ``permanent``), move to its failed phase.

        Works on a lease the step already released with an outcome of its own (a handler
        that unlocked, then raised): the attempt still counts, fenced on the document
        being as that release left it. A write the server refuses as too large is tried
        again with less stored: the attempt must count.
        """
        planned = self._error_write(kind, message, permanent)
        *larger, last = planned.forms
        for write in larger:
            try:
                await self._write(write, after=True)
                return planned.outcome
            except DocumentTooLarge:
                continue
        await self._write(last, after=True)
        return planned.outcome

    async def release(self) -> Outcome:
        """Hand back a lease whose step never ran (subject to the budget, like any release)."""
        write, wait = self._release_write()
        await self._write(write)
        return Outcome("released", self.phase, wait, self.token)

    # -- internals -------------------------------------------------------------------------

    async def _write(self, write: Write, *, after: bool = False) -> None:
        """A releasing write, fenced as the lease's state says; serialised with the
        heartbeat's extends. ``after``: allowed on a lease this step released itself."""
        async with self._lock:
            self._check_allowed(write.action, after)
            query = self._fence(write.phase_change)
            if not await self._store.write(self.collection, query, write.update):
                if self.held and write.phase_change:
                    await self._release_after_outside_change()
                raise self._lost(write.action)
            self._released(write)

    async def _release_after_outside_change(self) -> None:
        """The phase-fenced write matched nothing: if the token still matches, the phase was
        changed from outside while the step ran; let the document go at once."""
        with contextlib.suppress(StoreError):  # if it fails, the lease expires on its own
            await self._store.write(
                self.collection, queries.fenced(self.id, self.token), queries.release_update()
            )
