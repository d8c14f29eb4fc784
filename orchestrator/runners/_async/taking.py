"""How a replica takes a step's lease: by a claim (its handler's limits' slots first, a
dead replica's expired lease taken over and said so), by the release of the step before,
which carried its lease on into the next step in the same write, or by its own submit,
which created the document already leased to a free worker.

Written once, as async code; the sync engine's ``Claims`` is generated from it
(``scripts/synchro.py``). The claim's query is ``orchestrator.core.queries.claims``'s.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from orchestrator.core import audit, steps
from orchestrator.core.clock import Clock
from orchestrator.core.documents import Document, id_json_or_text
from orchestrator.core.errors import ShardKeyRequired, StoreError
from orchestrator.core.lease import LeaseCore
from orchestrator.core.lease_values import Grant
from orchestrator.core.limits import Slot
from orchestrator.core.queries import claims, submissions
from orchestrator.core.registry import Handler
from orchestrator.core.retention import NO_RETENTION
from orchestrator.mongo._async.lease import AsyncFamily, AsyncLease
from orchestrator.runners._async.limits import AsyncLimits
from orchestrator.runners._async.parts import AsyncReplicaParts
from orchestrator.runners.step import Step

__all__ = ["AsyncClaims", "Held"]

Held = AsyncLease[Any]
"""A step's lease (its resource type is the handler's business)."""


class AsyncClaims:
    """One replica's ways to a step's lease, on its ``store`` under its ``books``."""

    def __init__(
        self,
        parts: AsyncReplicaParts,
        *,
        local: Clock,
        limits: AsyncLimits,
        family: AsyncFamily | None = None,
    ) -> None:
        self._family = family  # what its leases ask about their children
        self._store = parts.store
        self._clock = parts.clock
        self._settings = parts.settings
        self._books = parts.books
        self._report = parts.report
        self._retention = parts.retention
        self._local = local
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
            request = claims.ClaimRequest(
                match=handler.match,
                judged_at=now - timedelta(seconds=self._clock.uncertainty),
                horizon=self._settings.horizon,
                update=claims.claim_update(now, until, token, self._settings.replica_id),
                exclusion=handler.exclusion,
                plan=handler.plan,
                live=self._books.live,
            )
            doc = await self._store.claim(handler.collection, request, seen)
            lease: Held | None = None
            if doc is not None:
                grant = self._grant(doc, token, now, taken_from=taken[0] if taken else None)
                lease = self._lease(handler, grant)
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
                self._report.trouble(logging.WARNING, exc),
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

    async def insert(
        self, collection: str, fields: dict[str, Any], unique: Sequence[str], *, due_now: bool
    ) -> Document:
        """Create a submitted document (``AsyncStore.insert``). Due now, with a worker here
        free for its handler (``Books.lend``), it is created already leased to that worker,
        whose step then runs with no claim: a workflow of n steps costs n writes. Its lease
        is a claim's (this replica's token, ``lock_timeout`` from now, on the books at
        once: the heartbeat keeps it), so a replica that dies after the insert leaves a
        lease to expire as any other. An insert whose answer was lost (an error, a
        cancellation) may have landed: its lease goes to the worker unconfirmed, and a
        fenced renewal tells before the step runs (a document never created is nothing to
        run; one created does not wait out a lease nobody holds)."""
        migrating = self._settings.in_house.migrating  # old pods judge leases their own way
        handler = (
            None if migrating or not due_now else self._books.lend(collection, fields["phase"])
        )
        if handler is None:
            stored = await self._store.insert(collection, fields, unique)
            if due_now:  # its idle handlers look at once; a later start, at its time
                self._books.submitted(collection, stored.get("phase"))
            return stored
        token = secrets.token_hex(8)
        now = self._clock.now()
        until = now + timedelta(seconds=self._settings.lock_timeout)
        leased = submissions.leased(
            fields, claims.claim_update(now, until, token, self._settings.replica_id)
        )
        try:
            stored = await self._store.insert(collection, leased, unique)
        except BaseException:
            self._lend(handler, leased, token, now, confirmed=False)
            raise
        if stored.get("lockToken") == token:
            self._lend(handler, stored, token, now, confirmed=True)
        else:  # one of its unique keys existed: that document is as it was
            self._books.unlent(collection, stored.get("phase"))
        return stored

    def _lend(
        self, handler: Handler, doc: dict[str, Any], token: str, now: datetime, *, confirmed: bool
    ) -> None:
        lease = self._lease(handler, self._grant(doc, token, now))
        step = Step(lease, self._books.next_number(), self._local.monotonic(), 0.0)
        step.confirmed = confirmed
        self._books.lent(step)

    def carried(self, step: Step[Held]) -> Step[Held] | None:
        """The next step ``step``'s release carried its lease on into (one write instead of
        a release and a claim), or None. Its document is as that write left it; it is due
        since it was carried, so its claim latency is nil."""
        carry = step.lease.carried
        if carry is None:
            return None
        # Its step's clock starts with the step; the lease was written at the carry.
        grant = self._grant(carry.doc, carry.token, carry.claimed_at, self._clock.now())
        lease = self._lease(carry.handler, grant)
        return Step(lease, self._books.next_number(), self._local.monotonic(), 0.0)

    def _grant(
        self,
        doc: dict[str, Any],
        token: str,
        now: datetime,
        claimed_at: datetime | None = None,
        taken_from: str | None = None,
    ) -> Grant:
        """What this replica's lease on ``doc``, written at ``now``, grants; its step's
        clock starts at ``claimed_at`` (``now`` when None)."""
        return Grant(
            doc=doc,
            token=token,
            claimed_at=now if claimed_at is None else claimed_at,
            expires_at=now + timedelta(seconds=self._settings.lock_timeout),
            locked_at=now,
            taken_from=taken_from,
        )

    def _lease(self, handler: Handler, grant: Grant) -> Held:
        """A lease for ``handler``'s step, which may carry itself on into the next step
        (``Books.reserve``)."""
        core: LeaseCore[Any] = LeaseCore(
            clock=self._clock,
            settings=self._settings,
            handler=handler,
            grant=grant,
            retention=self._retention.get(handler.collection, NO_RETENTION),
        )
        lease: Held = AsyncLease(store=self._store, core=core)
        lease.carrier = self._books.reserve
        lease.family = self._family
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
