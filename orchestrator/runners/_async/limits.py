"""A replica's side of the cluster-wide limits (``global_limit``, ``rate_limit``): the slots
taken before a limited handler's claim, and given back when the claim finds nothing.

What a slot is and how it is judged is ``orchestrator.core.limits``'s; a step's held slot
is renewed and freed by its lease (``AsyncLease.extend``, ``free_slots``). Written once, as
async code; the sync engine's ``Limits`` is generated from it (``scripts/synchro.py``).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from orchestrator.core.errors import StoreError
from orchestrator.core.limits import Limit, RateWait, Slot
from orchestrator.core.queries import limit_slots
from orchestrator.core.registry import Handler
from orchestrator.runners._async.parts import AsyncReplicaParts
from orchestrator.runners.workers import best_effort

__all__ = ["AsyncLimits"]


class AsyncLimits:
    """Takes a slot of each of a handler's limits before its claim (one find-and-modify
    each), so a handler without limits costs nothing more.

    No free slot: the claim is not sent and the handler is idle here until the next tick,
    or until one of this replica's own steps frees a slot of it (``Books.slot_freed``). A
    rate limit's next free slot is read then (one read), so this replica does not ask again
    before it, nor before ``SLOTS_RECHECK`` has passed (``RateWait``: another replica's
    give-back frees a slot early), and, when it comes before the next tick, wakes then
    (``Books.due_in``). A take after ``SLOTS_RECHECK`` that finds none free reads nothing
    more while the time read is ahead: a slot given back is free at once, so a take finds
    it."""

    def __init__(
        self, parts: AsyncReplicaParts, *, on_due: Callable[[Sequence[Handler]], object]
    ) -> None:
        self._store = parts.store
        self._clock = parts.clock
        self._settings = parts.settings
        self._books = parts.books
        self._report = parts.report
        self._on_due = on_due
        self._lock = threading.Lock()  # the times below, read and set from any worker
        self._not_before: dict[tuple[str, Limit], RateWait] = {}
        """Per rate limit found full, when its next slot comes free, as last read, and when
        to ask again: not asked before."""
        self._given_back: Counter[tuple[str, Limit]] = Counter()
        """Per rate limit, slots this replica gave back: a read of the next free one made
        across a give-back may have seen that slot taken, and is not kept."""

    async def take(
        self, handler: Handler, now: datetime, until: datetime, token: str
    ) -> list[Slot] | None:
        """A slot of each of ``handler``'s limits for the lease ``token`` claimed at ``now``
        until ``until``, or None (none taken) when one has no free slot. Raises
        ``StoreError`` with none held; so does a take cancelled under way, which gives back
        what it took before it raises (``give_back_broken``)."""
        judged = now - timedelta(seconds=self._clock.uncertainty)
        taken: list[Slot] = []
        try:
            for limit in handler.limits:
                slot = await self._take(handler, limit, now, judged, until=until, token=token)
                if slot is None:
                    await self.give_back(taken)
                    self._books.limited(handler)
                    self._report.line(
                        logging.DEBUG,
                        f"{handler.name} waits for a slot: its {limit.kind} limit"
                        f" ({limit.describe()}) is reached across the replicas",
                        "limited",
                        collection=handler.collection,
                        handler=handler.name,
                    )
                    return None
                taken.append(slot)
        except BaseException:  # a StoreError, or the worker cancelled while it took them
            unsure = handler.limits[len(taken)] if len(taken) < len(handler.limits) else None
            await self.give_back_broken(taken, handler, token, unsure)
            raise
        return taken

    async def _take(
        self,
        handler: Handler,
        limit: Limit,
        now: datetime,
        judged: datetime,
        *,
        until: datetime,
        token: str,
    ) -> Slot | None:
        held_until = until if limit.follows_lease else now + timedelta(seconds=limit.period)
        with self._lock:
            known = self._not_before.get((handler.key, limit))
            given_back = self._given_back[(handler.key, limit)]
        if known is not None and judged < known.ask_at:
            self._books.count("limited")
            return None  # its next slot comes free later: nothing to ask the server yet
        update = limit_slots.take_slot_update(token, held_until, self._settings.replica_id, now)
        before = await self._store.take_slot(
            self._settings.slots_collection, handler.key, limit, judged, update
        )
        if before is None:
            self._books.count("limited")
            if not limit.follows_lease:
                await self._wait_for_rate(handler, limit, judged, given_back, known)
            return None
        slot = Slot(
            handler.key,
            limit,
            str(before["_id"]),
            token,
            held_until,
            before.get("until"),
            before.get("token"),
        )
        if slot.recovered:
            self._books.count("slots_recovered")
            self._report.line(
                logging.INFO,
                f"took back a slot of {handler.name}'s global_limit its holder never freed"
                " (it died or stalled past its lease)",
                "slot-recovered",
                collection=handler.collection,
                handler=handler.name,
            )
        return slot

    async def _wait_for_rate(
        self,
        handler: Handler,
        limit: Limit,
        judged: datetime,
        given_back: int,
        known: RateWait | None,
    ) -> None:
        """A rate limit reached: when its next slot comes free, or ``SLOTS_RECHECK`` from
        now if sooner, this replica asks again (and wakes when the slot comes free, if that
        is before the next tick). ``given_back``: this replica's give-backs of the limit
        before its take; one since, and what was read is not kept. ``known``: the wait
        this take ended; its time read, still ahead, stands (no slot frees by its time
        before it, and one given back would have been taken), so nothing is read again."""
        if known is not None and judged < known.free_at:
            free_at: datetime | None = known.free_at
        else:
            free_at = await self._store.next_slot(
                self._settings.slots_collection, handler.key, limit
            )
        if free_at is None or free_at <= judged:
            return
        with self._lock:
            if self._given_back[(handler.key, limit)] != given_back:
                return
            self._not_before[(handler.key, limit)] = RateWait.of(free_at, judged)
        delay = (free_at - judged).total_seconds()
        if 0 < delay < self._settings.tick:
            wake = functools.partial(self._on_due, (handler,))
            self._books.due_in(delay, wake, f"limit {handler.key}")

    async def give_back_broken(
        self,
        slots: list[Slot],
        handler: Handler,
        token: str,
        unsure: Limit | None = None,
    ) -> None:
        """Give back ``slots``, taken for a claim that broke off (an error, or its worker
        cancelled: no step will ever hold them), and, ``unsure``, the slot of that limit
        whose take was under way: its write may have landed with ``token``. A global slot so
        taken is freed by its token; a rate slot cannot be restored unread and counts its
        start for its period. Never raises, even cancelled again: what is not given back
        expires at its time."""
        with best_effort():
            await self.give_back(slots)
            if unsure is not None and unsure.follows_lease:
                fence = limit_slots.held_slot_filter(handler.key, unsure, token)
                await self._store.write(
                    self._settings.slots_collection, fence, limit_slots.free_slot_update()
                )

    async def give_back(self, slots: list[Slot]) -> None:
        """The claim these slots were taken for found no document (or failed): a global
        slot is freed, a rate slot restored as it was (the start it counted never
        happened), each fenced on its token. Never raises: a slot not given back expires.
        A rate slot given back may be free now: its next free time is read afresh (a
        worker of this replica, claiming meanwhile, may have read it taken)."""
        name = self._settings.slots_collection
        for slot in slots:
            if slot.limit.follows_lease:
                update = limit_slots.free_slot_update()
            else:
                update = limit_slots.restore_slot_update(slot.before_until, slot.before_token)
            slot.freed = True
            try:
                await self._store.write(name, limit_slots.slot_fence(slot.id, slot.token), update)
            except StoreError as exc:
                self._report.line(
                    logging.WARNING,
                    f"could not give back a slot of {slot.key}; it expires at its time: {exc}",
                    "slot-unfreed",
                )
            if not slot.limit.follows_lease:
                with self._lock:  # once it landed: a take from now on sees it free
                    self._given_back[(slot.key, slot.limit)] += 1
                    self._not_before.pop((slot.key, slot.limit), None)
