"""How a replica takes a step's lease: by a claim (its handler's limits' slots first, a
dead replica's expired lease taken over and said so), or by the release of the step before,
which carried its lease on into the next step in the same write.

Written once, as async code; the sync engine's ``Claims`` is generated from it
(``scripts/synchro.py``). The claim's query is ``orchestrator.core.queries.claims``'s.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from orchestrator.core import audit, steps
from orchestrator.core.clock import Clock, ServerClock
from orchestrator.core.documents import id_json_or_text
from orchestrator.core.errors import ShardKeyRequired, StoreError
from orchestrator.core.limits import Slot
from orchestrator.core.queries import claims
from orchestrator.core.registry import Handler
from orchestrator.core.settings import Settings
from orchestrator.mongo._async.contract import AsyncLeaseStore
from orchestrator.mongo._async.lease import AsyncLease
from orchestrator.runners._async.limits import AsyncLimits
from orchestrator.runners.books import Books
from orchestrator.runners.reporter import Reporter
from orchestrator.runners.step import Step

__all__ = ["AsyncClaims", "Held"]

Held = AsyncLease[Any]
"""A step's lease (its resource type is the handler's business)."""


class AsyncClaims:
    """One replica's ways to a step's lease, on its ``store`` under its ``books``."""

    def __init__(
        self,
        *,
        store: AsyncLeaseStore,
        clock: ServerClock,
        local: Clock,
        settings: Settings,
        books: Books[Held],
        report: Reporter,
        limits: AsyncLimits,
    ) -> None:
        self._store = store
        self._clock = clock
        self._local = local
        self._settings = settings
        self._books = books
        self._report = report
        self._limits = limits

    async def claim(self, handler: Handler) -> Step[Held] | None:
        """Claim a document for ``handler``: its step, not started, or None. A handler with
        cluster-wide limits takes a slot of each first (none free: no claim, None); a
        global limit's slot lasts as long as the lease, from the same time."""
        token = secrets.token_hex(8)
        now = self._clock.now()
        until = now + timedelta(seconds=self._settings.lock_timeout)
        slots: list[Slot] = []
        due: list[datetime | None] = []
        taken: list[str | None] = []
        timing = self._report.events.active

        def seen(before: dict[str, Any]) -> None:
            # Whose expired lease it takes over, and (if listened to) how long it was due,
            # are read from its fields before the claim.
            taken.append(steps.taken_from(before))
            if timing:
                due.append(claims.due_since(before, self._settings.in_house))

        try:
            if handler.limits:
                limited = await self._limits.take(handler, now, until, token)  # gives back
                if limited is None:
                    return None
                slots = limited
            doc = await self._store.claim(
                handler.collection,
                handler.match,
                now - timedelta(seconds=self._clock.uncertainty),
                self._settings.horizon,
                handler.exclusion,
                claims.claim_update(now, until, token, self._settings.replica_id),
                seen,
                handler.plan,
                self._books.live,
            )
            lease: Held | None = None
            if doc is not None:
                lease = self._lease(
                    handler, doc, token, now, taken_from=taken[0] if taken else None
                )
                lease.slots = slots
                if lease.taken_from is not None:
                    await self._taken_over(lease, now)
        except ShardKeyRequired as exc:
            # Said once: the collection's handlers are set aside, so no loop of errors.
            await self._limits.give_back(slots)
            self._books.refuse(handler.collection)
            self._books.count("shard_key_required")
            self._report.line(
                logging.ERROR, str(exc), "shard-key-required", collection=handler.collection
            )
            return None
        except StoreError as exc:
            # The database is unreachable (or the reply was lost after the claim applied:
            # that lease then expires unused). This handler sits the tick out; the others,
            # and the next tick, go on. No step starts: its slots are given back.
            await self._limits.give_back(slots)
            self._books.count("claim_errors")
            self._report.line(
                logging.WARNING,
                f"claim failed; {handler.name} skips this tick: {exc}",
                "error",
                collection=handler.collection,
            )
            return None
        except BaseException:
            # Cancelled between its slots' take and the claim's answer, or while saying it
            # took a lease over (or worse): no step will hold the slots, so they are given
            # back now, not when their lease time passes; a claim that landed leaves its
            # lease to expire unused.
            await self._limits.give_back_broken(slots, handler, token)
            raise
        if lease is None:
            await self._limits.give_back(slots)
            return None
        latency = steps.claim_latency(now, due[0] if due else None)
        return Step(lease, self._books.next_number(), self._local.monotonic(), latency)

    def carried(self, step: Step[Held]) -> Step[Held] | None:
        """The next step ``step``'s release carried its lease on into (one write instead of
        a release and a claim), or None. Its document is as that write left it; it is due
        since it was carried, so its claim latency is nil."""
        carry = step.lease.carried
        if carry is None:
            return None
        lease = self._lease(
            carry.handler,
            carry.doc,
            carry.token,
            carry.claimed_at,
            claimed_at=self._clock.now(),  # its step's clock starts with the step
        )
        return Step(lease, self._books.next_number(), self._local.monotonic(), 0.0)

    def _lease(
        self, handler: Handler, doc: dict[str, Any], token: str, now: datetime, **more: Any
    ) -> Held:
        """A lease this replica wrote on ``doc`` at ``now`` for ``handler``'s step, which
        may carry itself on into the next step (``Books.reserve``)."""
        more.setdefault("claimed_at", now)
        lease: Held = AsyncLease(
            store=self._store,
            clock=self._clock,
            settings=self._settings,
            handler=handler,
            doc=doc,
            token=token,
            locked_at=now,
            expires_at=now + timedelta(seconds=self._settings.lock_timeout),
            **more,
        )
        lease.carrier = self._books.reserve
        return lease

    async def _taken_over(self, lease: Held, now: datetime) -> None:
        """Say that this claim took over a dead (or stalled) replica's lease: in the log, the
        counts, and the audit trail (one write, on a take-over only), which the operators'
        tools show beside the replicas."""
        self._report.taken_over(lease)
        self._books.count("taken_over")
        assert lease.taken_from is not None
        entry = audit.takeover_record(
            at=now,
            by=self._settings.replica_id,
            taken_from=lease.taken_from,
            collection=lease.collection,
            document=id_json_or_text(lease.id),
            phase=lease.phase,
        )
        try:
            await self._store.append_audit(self._settings.audit_collection, entry)
        except StoreError as exc:
            self._report.log(
                logging.WARNING, f"could not record the take-over: {exc}", lease, "taken-over"
            )
