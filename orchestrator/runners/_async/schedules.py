"""A replica's schedules: their declarations, their documents, and the step that fires them.

Each schedule is a document of ``Settings.schedules_collection`` whose ``lockedUntil`` is
its next fire: the tick's probe finds it due like any other work, one replica claims it,
and the step below starts each due fire's document (``core.schedules``: one ``_id`` per
fire time, so a retried or repeated step finds it there) and relocks the schedule until
its next fire. No leader, no extra read per tick, and a dead replica's claim expires as
any other lease.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.core.events import ScheduleFiredEvent
from orchestrator.core.fire_times import Cron, Every, FireTimes
from orchestrator.core.lease_values import Outcome
from orchestrator.core.queries import schedules as queries
from orchestrator.core.registry import Target, resolve
from orchestrator.core.scheduler import heartbeat
from orchestrator.core.schedules import (
    SCHEDULE_PHASE,
    Decision,
    DuePlan,
    FireResult,
    Overlap,
    ScheduleSpec,
    ScheduleState,
    Source,
    check_name,
    decide,
    due_plan,
    jitter_of,
    on_grid,
    run_document,
    run_id,
    spec_of,
    takeover,
)
from orchestrator.mongo import AsyncLease
from orchestrator.mongo._async.contract import AsyncLeaseStore
from orchestrator.runners.reporter import Reporter

if TYPE_CHECKING:
    from orchestrator.runners._async.engine import AsyncOrchestrator

__all__ = ["AsyncSchedules", "Declared"]

_IS_SYNC = False

MAX_ERROR = 500
"""Characters of a fire function's error kept on the schedule's document."""
MAX_RUNS_READ = 2000
"""Runs of a schedule one step reads at most to tell a missed fire from one a dead step
started (those are at most one step's share; more are an operator's backfills)."""
RESPEC_ATTEMPTS = 5
"""Reads of a schedule's document a replica writing its own spec over another makes while
steps keep moving it (each move is a fire passed); past them it tries at its next tick."""
STEP_ATTEMPTS = 1_000_000
"""A schedule's step fails only when the store does (a function's failure is recorded on
the fire): it retries, with the retry policy's backoff, rather than leave for the failed
phase, where no fire would come."""

FireFunc = Callable[[datetime], Any]


@dataclass(frozen=True)
class Declared:
    """A schedule as this replica's code declares it: its spec, its function, and the
    target its documents are submitted to (a collection, or a model that validates them)."""

    spec: ScheduleSpec
    func: FireFunc
    target: Target


@dataclass
class _Fired:
    fire: datetime
    result: FireResult
    run: str | None = None
    error: str | None = None


class AsyncSchedules:
    """The schedules of one replica (``AsyncOrchestrator.schedule``)."""

    def __init__(self, engine: AsyncOrchestrator, store: AsyncLeaseStore, report: Reporter) -> None:
        self._engine = engine
        self._store = store
        self._reporter = report
        self.declared: dict[str, Declared] = {}
        self._covered: set[str] = set()  # names a registered step handler claims
        self._written: set[str] = set()  # names whose document this replica made sure of

    # -- declaring ----------------------------------------------------------------------

    def declare(  # noqa: PLR0913  the documented keywords of ``schedule``
        self,
        name: str,
        target: Target,
        *,
        cron: str | None,
        every: float | timedelta | None,
        timezone: str,
        overlap: Overlap | str,
        catch_up: float | timedelta,
        coalesce: bool,
        jitter: float | timedelta,
        check: Callable[[Callable[..., Any]], None],
    ) -> Callable[[FireFunc], FireFunc]:
        """Validate now (a misspelt cron fails at import), register when decorating."""
        check_name(name)
        if name in self.declared:
            raise ConfigError(f"schedule {name!r} is declared twice")
        collection, _ = resolve(target)
        try:
            policy = Overlap(overlap)
        except ValueError:
            choices = ", ".join(o.value for o in Overlap)
            raise ConfigError(f"schedule {name!r}: overlap is one of {choices}") from None
        if not isinstance(coalesce, bool):
            raise ConfigError(f"schedule {name!r}: coalesce is True or False")
        spec = ScheduleSpec(
            name=name,
            collection=collection,
            times=_times(name, cron, every, timezone),
            overlap=policy,
            catch_up=_seconds(catch_up, name, "catch_up"),
            coalesce=coalesce,
            jitter=_seconds(jitter, name, "jitter"),
        )

        def decorate(func: FireFunc) -> FireFunc:
            if not callable(func):
                raise ConfigError(f"schedule {name!r}: decorate a function, not {func!r}")
            check(func)
            if name in self.declared:
                raise ConfigError(f"schedule {name!r} is declared twice")
            self.declared[name] = Declared(spec, func, target)
            return func

        return decorate

    # -- before the first claim ---------------------------------------------------------

    def register(self) -> None:
        """Register the step for the schedules declared since the last call (before the
        first claim: at ``start``, ``ensure_indexes`` or ``run_once``)."""
        fresh = [name for name in self.declared if name not in self._covered]
        if not fresh:
            return
        self._check_overlaps(fresh)
        engine = self._engine
        engine.when(
            engine.settings.schedules_collection,
            queries.claim_match(fresh),
            max_attempts=STEP_ATTEMPTS,
        )(self.step)
        self._covered.update(fresh)

    @property
    def collections(self) -> list[str]:
        """The collections this replica's schedules submit to (their runs' index)."""
        return list(dict.fromkeys(d.spec.collection for d in self.declared.values()))

    @property
    def unpublished(self) -> bool:
        """Schedules are declared here whose documents ``publish`` has not made sure of."""
        return any(name not in self._written for name in self.declared)

    async def publish(self) -> None:
        """Make sure of the documents of the schedules declared here: one made by the
        first replica, or the stored spec replaced by this replica's declaration when they
        differ (the replica started last wins)."""
        for name in [n for n in self.declared if n not in self._written]:
            if await self._write_document(self.declared[name].spec):
                self._written.add(name)

    def _check_overlaps(self, names: list[str]) -> None:
        """A policy other than allow_all tells a running run from a finished one by the
        handlers of its collection: they must be registered here."""
        for name in names:
            spec = self.declared[name].spec
            if spec.overlap is not Overlap.ALLOW_ALL and not self._matches(spec.collection):
                raise ConfigError(
                    f"schedule {name!r}: overlap={spec.overlap.value} needs the handlers of"
                    f" {spec.collection!r} registered on this replica (a run is running while"
                    " one of them would claim it); register them, or use overlap='allow_all'"
                )

    def _matches(self, collection: str) -> list[Mapping[str, Any]]:
        return [h.match for h in self._engine.handlers if h.collection == collection]

    async def _write_document(self, spec: ScheduleSpec) -> bool:
        """Make the schedule's document, or write this spec over another one stored; False
        when steps kept moving the stored one meanwhile (``publish`` tries again later)."""
        engine = self._engine
        store = self._store
        name = engine.settings.schedules_collection
        now = engine.clock.now()
        first = spec.times.after(now)
        if first is None:
            return True  # refused at declaration: a spec that never fires is never declared
        until = first + jitter_of(spec.name, first, spec.jitter)
        made = queries.schedule_document(spec, first, until, engine.replica_id, now)
        for attempt in range(RESPEC_ATTEMPTS):
            stored = await store.insert(name, made, ("_id",))
            if attempt == 0:
                self._warn_stopped(spec.name, stored.get("phase"))
            if spec.same(stored.get("spec")) or await self._respec(spec, stored, now):
                return True
        return False

    def _warn_stopped(self, name: str, phase: object) -> None:
        if phase != SCHEDULE_PHASE:
            self._reporter.line(
                logging.WARNING,
                f"schedule {name!r} is in phase {phase!r}, not {SCHEDULE_PHASE!r}: it fires"
                " no more until an operator retries it into that phase (pause a schedule"
                " rather than cancel it)",
                "schedule-stopped",
                schedule=name,
            )

    async def _respec(self, spec: ScheduleSpec, stored: Mapping[str, Any], now: datetime) -> bool:
        """Another spec is stored (an earlier deploy, an edit, or garbage): this one fires,
        from where the stored one had got to (``takeover``), so no fire time falls between
        the two and none is counted twice. False when a step moved the stored next fire
        meanwhile (this one read too early). When no step holds the document its wait
        changes too; else the step's own write decides it (and the next step goes on from
        that step's next fire, on this spec's times)."""
        store = self._store
        name = self._engine.settings.schedules_collection
        state = ScheduleState.read(stored)
        try:
            old: ScheduleSpec | None = spec_of(spec.name, stored.get("spec"))
        except ConfigError:
            old = None  # garbage: it fired nothing to account for
        runs: list[datetime] = []
        if old is not None and state.next is not None:
            query = queries.runs_since_filter(spec.name, state.next)
            runs = await store.run_fires(old.collection, query, MAX_RUNS_READ)
        taken = takeover(old, spec, state.next, runs, now)
        if taken.first is None:
            return True
        counts = taken.counted(state.counts)
        until = taken.first + jitter_of(spec.name, taken.first, spec.jitter)
        replica = self._engine.replica_id
        unmoved = queries.next_filter(spec.name, state.next)
        awake = queries.respec_update(spec, taken.first, replica, counts, until)
        if await store.write(name, {**unmoved, **queries.wake_filter(spec.name)}, awake):
            return True
        held = queries.respec_update(spec, taken.first, replica, counts, None)
        return await store.write(name, unmoved, held)

    # -- the step -----------------------------------------------------------------------

    async def step(self, lease: AsyncLease[Any]) -> Outcome:
        """Start what is due, then wait for the next fire."""
        doc = lease.doc
        name = doc["_id"]
        declared = self.declared[name]  # the claim names only schedules declared here
        fields: dict[str, Any] = {}
        try:
            spec = spec_of(name, doc.get("spec"))
        except ConfigError:
            spec = declared.spec  # a stored spec that is no spec: this replica's is written
            fields["spec"] = spec.stored()
        state = ScheduleState.read(doc)
        now = self._engine.clock.now()
        # The stored next fire on this spec's times: a step of the spec before it (a
        # rolling deploy) may have written its own after this spec was.
        known = state.next and spec.times.after(state.next - timedelta(microseconds=1))
        plan = due_plan(spec, known or spec.times.after(now), now)
        queue = [(state.buffered, Source.BUFFERED)] if state.buffered is not None else []
        queue += [(fire, Source.DUE) for fire in plan.start]
        for request in state.requests:
            queue += [(fire, Source.REQUESTED) for fire in request.fires(spec.times)]
        fired: list[_Fired] = []
        missed = await self._missed(spec, plan, fired)
        existing = await self._existing(spec, [*plan.coalesced, *(fire for fire, _ in queue)])
        for fire in plan.coalesced:
            started = run_id(name, fire) in existing
            result = FireResult.STARTED if started else FireResult.COALESCED
            fired.append(_Fired(fire, result, run_id(name, fire) if started else None))
        buffered = await self._run(spec, declared, queue, fired, existing=existing, lease=lease)
        if missed:
            at = plan.missed_last or now
            self._report(name, at, FireResult.MISSED, now, count=missed)
            fields["lastMissed"] = {"first": plan.missed_first, "last": plan.missed_last}
        for item in fired:
            self._report(name, item.fire, item.result, now, run=item.run, error=item.error)
        await self._serve(name, lease, state)
        fields.update(
            counts=_counted(state.counts, fired, missed), buffered=buffered, next=plan.next
        )
        if fired:
            last = fired[-1]
            fields["last"] = {
                "fire": last.fire,
                "at": now,
                "result": last.result.value,
                "run": last.run,
                "error": last.error,
            }
        if plan.more:
            return await lease.unlock(**fields)
        return await lease.relock(self._wait(spec, plan.next, buffered), **fields)

    async def _missed(self, spec: ScheduleSpec, plan: DuePlan, fired: list[_Fired]) -> int:
        """How many fires ``plan`` missed: those before the catch-up window, but for any
        whose document is there (a step that started it died before its write, so long
        ago that its fire has left the window since): that one was started."""
        if not plan.missed or plan.missed_first is None:
            return 0
        query = queries.runs_between_filter(spec.name, plan.missed_first, plan.window)
        there = await self._store.run_fires(spec.collection, query, MAX_RUNS_READ)
        started = on_grid(spec.times, there)
        fired.extend(_Fired(fire, FireResult.STARTED, run_id(spec.name, fire)) for fire in started)
        return max(plan.missed - len(started), 0)

    async def _existing(self, spec: ScheduleSpec, fires: list[datetime]) -> set[str]:
        """Which of ``fires`` have their document already: a step that submitted them
        died before its write (or they were asked for twice)."""
        if not fires:
            return set()
        ids = [run_id(spec.name, fire) for fire in fires]
        query = queries.existing_runs_filter(ids)
        return set(await self._store.find_ids(spec.collection, query, len(ids)))

    async def _run(
        self,
        spec: ScheduleSpec,
        declared: Declared,
        queue: list[tuple[datetime, Source]],
        fired: list[_Fired],
        *,
        existing: set[str],
        lease: AsyncLease[Any],
    ) -> datetime | None:
        """Start (or skip, buffer) each fire of ``queue`` in order (``existing``: the ids
        whose documents are there); the fire left buffered."""
        ids = [run_id(spec.name, fire) for fire, _ in queue]
        active: bool | None = None
        buffered: datetime | None = None
        for (fire, source), rid in zip(queue, ids, strict=True):
            if rid in existing:
                # Started by an earlier step whose holder died before its write (or by an
                # operator's request): the fire time has its document. One an operator
                # asked for again is not counted again.
                if source is not Source.REQUESTED:
                    fired.append(_Fired(fire, FireResult.STARTED, rid))
                continue
            if active is None:
                active = await self._active(spec)
            decision = decide(spec.overlap, active, buffered is not None, source)
            if decision is Decision.SKIP:
                fired.append(_Fired(fire, FireResult.SKIPPED))
                continue
            if decision is Decision.BUFFER:
                if source is not Source.BUFFERED:
                    fired.append(_Fired(fire, FireResult.BUFFERED))
                buffered = fire
                continue
            if decision is Decision.CANCEL_AND_START:
                await self._still_held(lease)
                await self._cancel_previous(spec)
            outcome = await self._start(spec, declared, fire, rid, lease=lease)
            if source is Source.REQUESTED and outcome.result is FireResult.STARTED:
                outcome.result = FireResult.REQUESTED
            fired.append(outcome)
            if outcome.result is FireResult.STARTED:
                active = True
                existing.add(rid)
        return buffered

    async def _still_held(self, lease: AsyncLease[Any]) -> None:
        """A step that stalled (a slow function, a paused process) renews its lease before
        it writes anything more, as the heartbeat would: if another replica took the
        schedule meanwhile, the renewal raises ``LeaseLost`` and this step ends, having
        started nothing that the other one now accounts for."""
        due = heartbeat(
            self._engine.clock.now(),
            claimed_at=lease.claimed_at,
            locked_at=lease.locked_at,
            lock_timeout=self._engine.settings.lock_timeout,
            step_timeout=None,
            extend=True,
        )
        if due == "extend":
            await lease.extend()

    async def _active(self, spec: ScheduleSpec) -> bool:
        if spec.overlap is Overlap.ALLOW_ALL:
            return False
        query = queries.active_runs_filter(spec.name, self._matches(spec.collection))
        return bool(await self._store.find_ids(spec.collection, query, 1))

    async def _cancel_previous(self, spec: ScheduleSpec) -> None:
        engine = self._engine
        query = queries.active_runs_filter(spec.name, self._matches(spec.collection))
        update = queries.cancel_runs_update(engine.settings.cancelled_phase, engine.clock.now())
        await self._store.write_many(spec.collection, query, update)

    async def _start(
        self,
        spec: ScheduleSpec,
        declared: Declared,
        fire: datetime,
        rid: str,
        *,
        lease: AsyncLease[Any],
    ) -> _Fired:
        """Call the schedule's function for ``fire`` and submit what it returns. A
        function that raises, or returns what is no document or what the server refuses
        for good, fails this fire only (it is recorded; the next fire comes); a store that
        fails for now fails the step (retried: the same ``_id`` then finds the document
        if the submit landed)."""
        try:
            value = await _call(declared.func, fire)
        except Exception as exc:
            return _Fired(fire, FireResult.FAILED, error=_said(exc))
        if value is None:
            return _Fired(fire, FireResult.DECLINED)
        try:
            doc = run_document(spec.name, fire, value)
            await self._still_held(lease)
            await self._engine.submit(declared.target, doc, unique="_id")
        except ConfigError as exc:
            return _Fired(fire, FireResult.FAILED, error=_said(exc))
        except StoreError as exc:
            if exc.transient:
                raise  # the step is retried, this fire with it
            # The server refuses this document for good (a validator): a retry would meet
            # the same refusal and hold every later fire back.
            return _Fired(fire, FireResult.FAILED, error=_said(exc))
        return _Fired(fire, FireResult.STARTED, rid)

    async def _serve(self, name: str, lease: AsyncLease[Any], state: ScheduleState) -> None:
        """Take the requests this step served (and stored garbage) off the document."""
        store = self._store
        collection = self._engine.settings.schedules_collection
        held = queries.held_filter(name, lease.token)
        if state.requests:
            await store.write(
                collection, held, queries.served_update([r.id for r in state.requests])
            )
        if state.dropped:
            await store.write(collection, held, queries.dropped_update(state.dropped))

    def _wait(
        self, spec: ScheduleSpec, following: datetime | None, buffered: datetime | None
    ) -> float:
        """Seconds until the next fire is due (its jitter past), within ``max_wait``; while
        a fire is buffered, a look every tick whether its previous run ended: a look
        fewer would start it later, and with it every fire after (each would find the one
        before it just started, and wait behind it in turn)."""
        settings = self._engine.settings
        wait = settings.max_wait
        if following is not None:
            until = following + jitter_of(spec.name, following, spec.jitter)
            wait = min(wait, max((until - self._engine.clock.now()).total_seconds(), 0.0))
        if buffered is not None:
            wait = min(wait, settings.tick)
        return wait

    def _report(
        self,
        name: str,
        fire: datetime,
        result: FireResult,
        now: datetime,
        *,
        run: str | None = None,
        error: str | None = None,
        count: int = 1,
    ) -> None:
        lag = (now - fire).total_seconds() if result is FireResult.STARTED else None
        self._reporter.schedule_fired(
            ScheduleFiredEvent(
                self._engine.replica_id, name, fire, result.value, lag, run, count, error
            )
        )


def _counted(counts: Mapping[str, int], fired: list[_Fired], missed: int) -> dict[str, int]:
    """The schedule's counts with this step's fires added (a buffered fire is counted
    when it starts or is skipped; ``missed`` fire times at once)."""
    total = dict(counts)
    for item in fired:
        if item.result is not FireResult.BUFFERED:
            total[item.result.value] = total.get(item.result.value, 0) + 1
    if missed:
        total[FireResult.MISSED.value] = total.get(FireResult.MISSED.value, 0) + missed
    return total


async def _call(func: FireFunc, fire: datetime) -> object:
    """The schedule's function for ``fire``: awaited when ``async def``; on the async
    engine a plain one runs on a thread, as a plain handler does."""
    if _IS_SYNC:
        return func(fire)
    if inspect.iscoroutinefunction(func):
        result: object = await func(fire)
        return result
    return await asyncio.to_thread(func, fire)


def _said(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


def _times(
    name: str, cron: str | None, every: float | timedelta | None, timezone: str
) -> FireTimes:
    if (cron is None) == (every is None):
        raise ConfigError(f"schedule {name!r}: give cron=... or every=..., one of them")
    if cron is not None:
        if not isinstance(cron, str):
            raise ConfigError(f"schedule {name!r}: cron is a crontab string, not {cron!r}")
        return Cron(cron, timezone)
    if timezone != "UTC":
        raise ConfigError(f"schedule {name!r}: timezone applies to cron only")
    return Every(_seconds(every, name, "every"))


def _seconds(value: object, name: str, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"schedule {name!r}: {what} is seconds or a timedelta, not {value!r}")
    return float(value)
