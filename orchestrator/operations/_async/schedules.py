"""An operator's schedules, on PyMongo's async API: listing them, one with its recent runs,
pause and resume, trigger now and backfill a range, each recorded with who and why in the
audit trail. ``ScheduleActions`` (``_sync/schedules.py``) is generated from it by
``scripts/synchro.py``.

A trigger or a backfill is a request pushed onto the schedule's document (``requests``):
the next step of the schedule, on whichever replica claims it, starts the fire times it
names, each as the document ``run_id(name, fire)`` (one that exists is not started again),
and takes the request off. So that this step comes at once rather than at the next fire,
the schedule is then made claimable now, only while no step holds it (``wake_filter``): a
holder's own write decides its wait, and it read the document before the request was
there. While a step holds it, the wake is tried again ``WAKE_TRIES`` times,
``WAKE_PAUSE`` seconds apart (a schedule's step takes a fire function's call or a few),
until it lands or the request is served; past that the request waits for the schedule's
next step, at its next fire at the latest.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from orchestrator.core.audit import OperatorAct, operator_record
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError, OperatorError, Refusal
from orchestrator.core.fire_times import fires_between
from orchestrator.core.queries import schedules as queries
from orchestrator.core.queries.operators import exact_id_filter
from orchestrator.core.replicas import disagreements
from orchestrator.core.schedules import MAX_BACKFILL, ScheduleSpec, run_id, spec_of
from orchestrator.operations._async.reads import AsyncReads
from orchestrator.operations.pacing import pause_between_async
from orchestrator.operations.rules import Signed
from orchestrator.operations.schedule_report import (
    MAX_RUNS,
    RUN_PROJECTION,
    Backfilled,
    ScheduleRow,
    ScheduleRun,
    Triggered,
)

__all__ = [
    "MAX_SCHEDULES",
    "WAKE_PAUSE",
    "WAKE_TRIES",
    "AsyncScheduleActions",
]

MAX_SCHEDULES = 10_000
"""Schedules a listing reads at most."""
WAKE_TRIES = 10
"""Tries to make a schedule claimable at once after a request while a step holds it."""
WAKE_PAUSE = 0.2
"""Seconds between two of those tries."""


class AsyncScheduleActions:
    """The schedules of ``collection`` (the replicas' ``schedules_collection``), reading
    through ``reads``; the audit trail is the collection ``reads`` names."""

    def __init__(self, reads: AsyncReads, collection: str) -> None:
        self._reads = reads
        self.collection = collection

    async def rows(self, *, runs: bool = True) -> list[ScheduleRow]:
        """Every schedule, by name, with the live replicas' disagreement on its spec, and
        (``runs``) its last run's phase now."""
        reports = self._reads.reports
        docs = await reports.find_many(self.collection, {}, queries.SCHEDULES_SORT, MAX_SCHEDULES)
        found = disagreements(await self._reads.replicas())
        rows = [ScheduleRow.read(doc).with_disagreement(found) for doc in docs]
        return [await self._with_run(row) for row in rows] if runs else rows

    async def row(self, name: str) -> ScheduleRow:
        """As ``rows``, for the schedule ``name``; ``OperatorError`` when there is none."""
        found = disagreements(await self._reads.replicas())
        row = ScheduleRow.read(await self._document(name)).with_disagreement(found)
        return await self._with_run(row)

    async def runs(self, row: ScheduleRow, limit: int) -> list[ScheduleRun]:
        """The documents schedule ``row`` started, the newest fire first (none when its
        stored spec names no collection)."""
        if not 1 <= limit <= MAX_RUNS:
            raise OperatorError(f"a schedule's runs are listed 1 to {MAX_RUNS} at a time")
        if row.collection is None:
            return []
        docs = await self._reads.reports.find_many(
            row.collection, queries.runs_filter(row.name), queries.RUNS_SORT, limit, RUN_PROJECTION
        )
        return [ScheduleRun.read(doc) for doc in docs]

    async def pause(self, name: str, paused: bool, signed: Signed) -> bool:
        """Pause (``paused``) or resume the schedule: no replica claims a paused one, so
        none of its fires start (they are missed, or caught up within its window, once
        resumed). False when it was so already."""
        now = await self._reads.now()
        reports = self._reads.reports
        done = await reports.operator_update(
            self.collection, queries.pause_filter(name, paused), queries.pause_update(paused)
        )
        if done is None:
            await self._document(name)  # unknown: refused; else it was so already
            return False
        await self._record("pause" if paused else "resume", name, now, signed, {})
        return True

    async def trigger(self, name: str, signed: Signed) -> Triggered:
        """Start one run now: the fire time is the server's time."""
        await self._document(name)
        now = as_utc(bson_time(await self._reads.now()))
        rid = secrets.token_hex(8)
        request = {"id": rid, "kind": "trigger", "start": now, **_signed(signed)}
        woken, until = await self._request(name, rid, request, now)
        await self._record("trigger", name, now, signed, {"fire": now.isoformat()})
        return Triggered(name, rid, now, run_id(name, now), woken, until)

    async def backfill(
        self, name: str, start: datetime, end: datetime, signed: Signed
    ) -> Backfilled:
        """Start every fire time of the schedule in [``start``, ``end``] that has no
        document yet (one that ran is not run again), at most ``MAX_BACKFILL``."""
        start, end = as_utc(bson_time(start)), as_utc(bson_time(end))
        if end < start:
            raise OperatorError(f"a backfill's end ({end:%Y-%m-%dT%H:%M:%SZ}) is before its start")
        spec = _spec(name, await self._document(name))
        fires, _ = fires_between(
            spec.times, start - timedelta(microseconds=1), end, MAX_BACKFILL + 1
        )
        if len(fires) > MAX_BACKFILL:
            raise OperatorError(
                f"schedule {name!r} ({spec.describe()}) fires more than {MAX_BACKFILL} times"
                " in that range: backfill it in parts"
            )
        if not fires:
            raise OperatorError(f"schedule {name!r} ({spec.describe()}) never fires in that range")
        now = await self._reads.now()
        rid = secrets.token_hex(8)
        request = {"id": rid, "kind": "backfill", "start": start, "end": end, **_signed(signed)}
        woken, until = await self._request(name, rid, request, now)
        scope = {"from": start.isoformat(), "to": end.isoformat(), "fires": str(len(fires))}
        await self._record("backfill", name, now, signed, scope)
        return Backfilled(name, rid, start, end, len(fires), woken, until)

    async def _request(
        self, name: str, rid: str, request: Mapping[str, Any], now: datetime
    ) -> tuple[bool, datetime | None]:
        """Push ``request``, then make the schedule claimable now (see the module's
        text): whether that landed, and else when the holder's lease ends."""
        reports = self._reads.reports
        pushed = await reports.operator_update(
            self.collection, exact_id_filter(name), queries.request_update(request)
        )
        if pushed is None:
            await self._document(name)  # deleted meanwhile: refused
        for attempt in range(WAKE_TRIES):
            if attempt:
                await pause_between_async(WAKE_PAUSE)
            woke = await reports.operator_update(
                self.collection, queries.wake_filter(name), queries.wake_update(now)
            )
            if woke is not None:
                return True, None
            doc = await self._document(name)
            requests = doc.get("requests")
            if not isinstance(requests, list) or not any(
                isinstance(r, Mapping) and r.get("id") == rid for r in requests
            ):
                return True, None  # served by the step that held it
        until = doc.get("lockedUntil")
        return False, as_utc(until) if isinstance(until, datetime) else None

    async def _with_run(self, row: ScheduleRow) -> ScheduleRow:
        if row.last is None or row.last.run is None or row.collection is None:
            return row
        doc = await self._reads.reports.find_one(row.collection, exact_id_filter(row.last.run))
        return row.with_run(doc)

    async def _document(self, name: str) -> Document:
        doc = await self._reads.reports.find_one(self.collection, exact_id_filter(name))
        if doc is not None:
            return doc
        names = await self._reads.reports.find_many(
            self.collection, {}, queries.SCHEDULES_SORT, 21, {"_id": 1}
        )
        known = ", ".join(str(d.get("_id")) for d in names[:20]) or "none"
        if len(names) > 20:
            known += ", ..."
        raise OperatorError(
            f"no schedule {name!r} in {self.collection!r} (it has: {known})",
            refusal=Refusal.NOT_FOUND,
        )

    async def _record(
        self, action: str, name: str, now: datetime, signed: Signed, scope: Mapping[str, str]
    ) -> None:
        reads = self._reads
        await reads.reports.append_audit(
            reads.audit_collection,
            operator_record(
                OperatorAct(action, signed.by, signed.why, now),
                collection=self.collection,
                scope={"schedule": name, **scope},
                documents=[name],
                count=1,
            ),
        )


def _spec(name: str, doc: Mapping[str, Any]) -> ScheduleSpec:
    try:
        return spec_of(name, doc.get("spec"))
    except ConfigError as exc:
        raise OperatorError(
            f"schedule {name!r} stores no readable spec ({exc}): its fire times are unknown"
            " until a replica declaring it writes its own"
        ) from None


def _signed(signed: Signed) -> dict[str, str]:
    return {"by": signed.by, "why": signed.why}
