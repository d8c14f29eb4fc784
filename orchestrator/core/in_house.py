"""The in-house pattern's leases, honoured while a fleet migrates from it.

Pods of the in-house pattern claim with ``lockedAt < now - lockTimeout`` and write
``lockedAt`` alone. While ``Settings.legacy_lock_timeout`` (its public name) is set, the
replicas honour such a lease as one expiring at ``lockedAt + timeout``, and stamp every
``lockedUntil`` they write with the ``lockedAt`` in-house pods read the same moment by, so
both kinds of pod judge every lease alike. ``InHouse`` carries that timeout (None: no
migration, every method a no-op or False) and is the one place the judgement is made:
the store writes and fences with it, the claim and probe filter with it, the operators'
tools and page read a document's lease with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from orchestrator.core.clock import UTC_EPOCH, as_utc, bson_time
from orchestrator.core.resource import EPOCH

if TYPE_CHECKING:
    from orchestrator.core.replicas import ReplicaRecord

SLACK = timedelta(milliseconds=1)
"""The in-house claim takes a document whose ``lockedAt < now - timeout``: strictly, so an
in-house lease still holds at ``lockedAt + timeout`` and is free one millisecond later,
while a ``lockedUntil`` is free from its own moment on (``$not: {$gt: now}``)."""

IN_HOUSE_INDEX: list[tuple[str, int]] = [("phase", 1), ("lockedAt", 1)]
"""Serves the probe's branch finding when the earliest in-house lease runs out (and the
in-house pods' own claim): made with the claim index while the timeout is set."""

IN_HOUSE_HOLDER = "an in-house pod"
"""Who holds a document an in-house lease holds, as operators' tools name it: its pods
write no name (the ``lockedBy`` it may carry is an earlier replica's)."""


@dataclass(frozen=True, slots=True)
class InHouse:
    """The in-house pods' lock timeout in seconds (``Settings.legacy_lock_timeout``), None
    when no fleet is migrating."""

    timeout: float | None = None

    @classmethod
    def honoured_by(cls, records: Iterable[ReplicaRecord]) -> InHouse:
        """The in-house pods' lock timeout the live replicas honour (the longest, should
        they disagree: the judgement that takes no in-house lease early), none when none
        does: how the operators' tools, which have no settings, judge in-house leases."""
        values = [r.legacy_lock_timeout for r in records if r.legacy_lock_timeout is not None]
        return cls(max(values) if values else None)

    @property
    def migrating(self) -> bool:
        return self.timeout is not None

    @property
    def _span(self) -> timedelta:
        """From a ``lockedAt`` to the first moment the in-house claim takes the document."""
        assert self.timeout is not None, "no in-house lease is honoured without its timeout"
        return timedelta(seconds=self.timeout) + SLACK

    def expiry(self, locked_at: datetime) -> datetime:
        """When an in-house lease taken at ``locked_at`` runs out, as a ``lockedUntil`` says
        it: the first moment the in-house query takes the document (aware UTC)."""
        return as_utc(locked_at) + self._span

    def floor(self, now: datetime) -> datetime:
        """The ``lockedAt`` of an in-house lease that runs out at ``now``: a later one holds."""
        return bson_time(now - self._span)

    def stamp(self, until: datetime) -> datetime:
        """The ``lockedAt`` an in-house pod judges as this library judges
        ``lockedUntil=until`` (``expiry``'s inverse): a lease, a relock's wait or a retry's
        backoff ends for both at one moment. A release at once writes the epoch itself, as
        the in-house unlock does (its ``TASK_LOCK_INIT_TIME``), whatever the timeout.

        The one place a stamp is decided from an expiry: ``until`` is taken as stored
        (``bson_time``) first, so the stamp a write stores (``stamped``, from the stored
        ``lockedUntil``) and the one a lease's fence names (``fence``, from the lease's own
        expiry) are one, whatever the setting's digits."""
        if as_utc(until) <= UTC_EPOCH:
            return EPOCH
        return bson_time(bson_time(until) - self._span)

    def stamped(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """``fields`` (a new document, or an update's ``$set``) with the ``lockedAt`` that
        tells in-house pods its ``lockedUntil``, while migrating and that is a date."""
        until = fields.get("lockedUntil")
        if self.timeout is None or not isinstance(until, datetime):
            return dict(fields)
        return {**fields, "lockedAt": self.stamp(until)}

    def update(self, update: Mapping[str, Any]) -> Mapping[str, Any]:
        """A write that in-house pods read as this library reads it, while migrating: one
        that sets ``lockedUntil`` (a claim, a carry, an extension, any release, relock,
        retry or failure) sets the matching ``lockedAt`` with it (``stamp``). The store
        applies it to every write it sends (and ``stamped`` to every document it inserts),
        and the operators' tools ``operator_update`` to their changes, so no lease write can
        be left out; ``update`` itself when there is nothing to add."""
        sets = update.get("$set")
        if self.timeout is None or not isinstance(sets, Mapping) or "lockedUntil" not in sets:
            return update
        return {**update, "$set": self.stamped(sets)}

    def operator_update(self, update: Mapping[str, Any]) -> Mapping[str, Any]:
        """An operator's change (``update``) as in-house pods read it, also when no live
        replica publishes the timeout (while old pods run, none may be live): one that
        frees the document at once writes the epoch ``lockedAt`` whatever the timeout, as
        the in-house unlock does (what ``stamp`` gives the epoch for any timeout, and
        nothing reads after the migration). Written only with the timeout, a replica's
        relock left its ``lockedAt`` ahead of now, holding the document for the old pods
        (and the replicas honouring them) until that wait ended."""
        sets = update.get("$set")
        if self.timeout is not None or not isinstance(sets, Mapping):
            return self.update(update)
        until = sets.get("lockedUntil")
        if not isinstance(until, datetime) or as_utc(until) > UTC_EPOCH:
            return update
        return {**update, "$set": {**sets, "lockedAt": EPOCH}}

    def fence(self, query: Mapping[str, Any], untils: Sequence[datetime]) -> dict[str, Any]:
        """A lease's fence (``lease_writes.fenced``, ``released_fence``) also naming the
        ``lockedAt`` its last write stamped with ``lockedUntil`` (one of ``untils``: an
        extension whose reply was lost may have landed), while migrating: an in-house
        pod's claim rewrites only ``lockedAt`` and leaves the token as it was, so without
        it a holder that stalled past its lease would still write over the in-house pod's
        work."""
        if self.timeout is None:
            return dict(query)
        stamps = [self.stamp(until) for until in untils]
        return {**query, "lockedAt": stamps[0] if len(stamps) == 1 else {"$in": stamps}}

    def free(self, now: datetime, horizon: float) -> dict[str, Any]:
        """Documents no in-house lease holds at ``now`` (only while migrating): ``lockedAt``
        is not a date whose ``expiry`` falls in ``(now, now + horizon]``, the window in
        which ``claims.claim_filter`` takes a ``lockedUntil`` to hold. As there, what is
        no date (missing, null, a string, a number) holds nothing, so a malformed
        ``lockedAt`` never keeps a document from being claimed (the claim writes a date
        over it), and a date further ahead than ``horizon`` is a lease that would never
        run out: free too."""
        floor = self.floor(now)
        return {
            "$or": [
                {"lockedAt": {"$not": {"$gt": floor}}},
                {"lockedAt": {"$gt": bson_time(floor + timedelta(seconds=horizon))}},
            ]
        }

    def holds(self, doc: Mapping[str, Any], now: datetime) -> bool:
        """Whether an in-house pod holds ``doc`` at ``now``: a ``lockedAt`` that holds it
        (``expiry`` after ``now``, as the status counts judge it) while no ``lockedUntil``
        does. A replica's own writes keep the two alike, so only an in-house claim or
        relock leaves ``lockedAt`` alone holding it; its ``lockedBy`` and ``lockToken``,
        if any, are an earlier replica's."""
        locked = doc.get("lockedAt")
        if self.timeout is None or not isinstance(locked, datetime):
            return False
        at = as_utc(now)
        until = doc.get("lockedUntil")
        if isinstance(until, datetime) and as_utc(until) > at:
            return False
        return self.expiry(locked) > at


NO_IN_HOUSE = InHouse()
"""No fleet migrating: no in-house lease is honoured, and writes carry no stamp of theirs
(but an operator's release at once: ``InHouse.operator_update``)."""
