"""The life of a step: probe, run or hand back what a claim took (``claiming``), judge the
result by the step's own lease, settle errors, extend long steps' leases and take back
those past step_timeout.

Written once, as async code; the sync engine's ``Steps`` is generated from it
(``scripts/synchro.py``). What is decided on the way is ``orchestrator.core.steps``'s
and ``orchestrator.core.scheduler``'s; the state it changes is the books'.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from orchestrator.core import history, scheduler, steps
from orchestrator.core.clock import Clock
from orchestrator.core.documents import Document
from orchestrator.core.errors import LeaseLost, StoreError
from orchestrator.core.lease_values import Outcome
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.pauses import Pause
from orchestrator.core.queries import trees as tree_queries
from orchestrator.core.registry import Handler
from orchestrator.core.scheduler import Action, Claim, Found, Probe
from orchestrator.core.steps import StepTimeout, describe
from orchestrator.core.trees import changed_from_outside
from orchestrator.core.validation import explain
from orchestrator.mongo._async.clock_probe import measure
from orchestrator.runners._async.limits import AsyncLimits
from orchestrator.runners._async.parts import AsyncReplicaParts
from orchestrator.runners._async.taking import AsyncClaims, Held
from orchestrator.runners._async.trees import AsyncTrees
from orchestrator.runners.calls import AsyncHandlerCalls
from orchestrator.runners.registration import Registration
from orchestrator.runners.step import IN_STEP, Step
from orchestrator.runners.workers import AsyncWorkers, StepEnd, best_effort

__all__ = ["AsyncSteps"]

_CARRYING = (StepOutcome.UNLOCKED, StepOutcome.ADVANCED)
"""The outcomes of a step whose release may have carried its lease into the next step."""


class AsyncSteps:
    """One replica's steps, carried out on its ``store`` under its ``books``."""

    def __init__(  # noqa: PLR0913  the replica's parts a step touches
        self,
        parts: AsyncReplicaParts,
        *,
        engine: object,
        local: Clock,
        crew: AsyncWorkers,
        calls: AsyncHandlerCalls,
        on_due: Callable[[Sequence[Handler]], object],
        reading_pauses: Callable[[], Callable[[list[Pause]], None]],
        registration: Registration,
    ) -> None:
        self.trees = AsyncTrees(parts, registration=registration, steps=self)
        """The waits a claim judges, the wakes a step's end sends, the children and
        signals its leases and the engine send."""
        self._engine = engine  # what a step's context names (``IN_STEP``)
        self._store = parts.store
        self._clock = parts.clock
        self._settings = parts.settings
        self._books = parts.books
        self._report = parts.report
        self._local = local
        self._crew = crew
        self._calls = calls
        self._on_due = on_due  # the timer's job when a due time comes (``_wake_when_due``)
        # Called as a probe is sent, which reads the pauses too: what its answer's pauses
        # are given to (numbered when sent, so an answer that lands late is not applied).
        self._reading_pauses = reading_pauses
        limits = AsyncLimits(parts, on_due=on_due)
        self._claims = AsyncClaims(parts, local=local, limits=limits, family=self.trees)

    # -- the server's clock -------------------------------------------------------------

    async def measure_if_due(self) -> None:
        """Measure the server's clock when a measurement is due (``ServerClock`` does no
        I/O itself); with no estimate yet a failure raises."""
        if self._clock.due:
            await measure(self._clock, self._store)

    def _judgement_time(self) -> datetime:
        """When leases are judged: the server's time, less what this estimate may be off by
        (nothing while the server reports its time), so no skew steals a live lease."""
        return self._clock.now() - timedelta(seconds=self._clock.uncertainty)

    # -- one worker action --------------------------------------------------------------

    async def insert(
        self, collection: str, fields: dict[str, Any], unique: Sequence[str], *, due_now: bool
    ) -> Document:
        """A submit's document, created leased to a free worker here when it may be
        (``AsyncClaims.insert``)."""
        return await self._claims.insert(collection, fields, unique, due_now=due_now)

    async def act(self, action: Action | Step[Held]) -> bool:
        """Carry out one action of the scheduler's, or run a step a submit lent this
        worker (its lease was written with the clock measured); False when the worker's
        step was taken back by step_timeout (its worker is replaced)."""
        if isinstance(action, Step):
            return await self._run_on(action, self._books.stopping)
        try:
            await self.measure_if_due()
        except Exception as exc:
            # No estimate yet and the server unreachable (or answering nonsense: whatever
            # the store raises ends this action, never the worker, whose action would
            # stay in flight and wedge the tick): nothing is claimed by a clock that was
            # never measured; the next action tries again.
            what = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            self._report.line(
                self._report.trouble(logging.WARNING, exc),
                f"cannot measure the server's clock; nothing is claimed until it can: {what}",
                "error",
            )
            self._books.action_failed(action)
            return True
        if isinstance(action, Probe):
            await self._probe(action)
            return True
        return await self._claim_and_run(action)

    async def _probe(self, probe: Probe) -> None:
        found: Found | None = None  # on a StoreError the claims meet it too and report it
        started = self._local.monotonic()
        pauses_found = self._reading_pauses()
        try:
            found = await self._store.probe(
                probe.groups(),
                self._judgement_time(),
                self._settings.horizon,
                self._settings.pauses_collection,
                self._settings.replicas_collection,
                known=probe.known,
            )
            if found.pauses is not None:
                pauses_found(found.pauses)  # before its answer: no paused handler claims
        except StoreError:
            pass
        finally:
            self._books.probed(probe, found)
        took = self._local.monotonic() - started
        if found is not None and found.dues and scheduler.wakes_at_due(found.live, random.random()):
            self._wake_when_due(probe, found)
        for collection in probe.collections:
            asked = probe.asked(collection)
            if asked:  # a collection whose handlers all have work was asked its due time only
                ready = (
                    None
                    if found is None
                    else any(probe.handlers.index(h) in found.ready for h in asked)
                )
                self._report.probed(collection, asked, ready, took)

    def _wake_when_due(self, probe: Probe, found: Found) -> None:
        """When each collection's earliest document the probe saw comes due, if that is
        before the next tick, the handlers that may claim it claim (no probe of
        everything): an idle replica probes once per tick, yet a short wait ends on time,
        and many waits ending between two ticks cost claims of what came due, not a probe
        each (a few replicas of a fleet wake, ``scheduler.wakes_at_due``, not all of them
        at once). Judged as the probe judged it (``_judgement_time``)."""
        now = self._judgement_time()
        for due in found.earliest():
            delay = (due.at - now).total_seconds()
            handlers = tuple(h for h in probe.members(due.collection) if due.wakes(h))
            if 0 < delay < self._settings.tick and handlers:
                wake = functools.partial(self._on_due, handlers)
                self._books.due_in(delay, wake, f"due {due.collection}")

    async def _claim_and_run(self, claim: Claim) -> bool:
        try:
            step = await self._claims.claim(claim.handler)
        except BaseException:
            self._books.claim_broke(claim)
            raise
        stopping = self._books.claimed(claim, step)
        if step is None:
            return True
        return await self._run_on(step, stopping)

    async def _run_on(self, step: Step[Held], stopping: bool) -> bool:
        """Run ``step``, then each step its release carried its lease on into; False when
        step_timeout took one back (its worker is replaced)."""
        while True:
            self._report.claimed(step)
            outcome = await self._run(step, stopping)
            carried = self._claims.carried(step)
            try:
                if carried is not None and outcome not in _CARRYING:
                    # The step ended otherwise (its error could not be recorded): what its
                    # release carried on is handed back, not run.
                    await self._hand_back(carried.lease, f"its previous step ended {outcome}")
                    carried = None
                await self._free_slots(step.lease)
            except BaseException:
                await self._wind_up(step, outcome, carried)
                raise
            if outcome is None or not self._books.finished(step, outcome, carried):
                # step_timeout counted it and freed its slot: not counted again; a lease
                # its release carried on is handed back, not run by a worker let go.
                if carried is not None:
                    await self._hand_back(carried.lease, "its step was taken back")
                return False
            self._report.finished(step, outcome)
            if carried is None:
                # What it may wake (its own wait, its owner's): a released step only. A
                # step carried on ended nothing and wrote no wait, and a cancel here must
                # not leave the step it carried on running on the books with no worker.
                await self.trees.after(step.lease, outcome)
                return True
            step, stopping = carried, self._books.stopping

    async def _wind_up(
        self, step: Step[Held], outcome: StepOutcome | None, carried: Step[Held] | None
    ) -> None:
        """The worker was cancelled (or worse) after ``step`` ended, while it gave back what
        the step held: the step leaves the books at once, with the outcome that landed (no
        await comes first, so the replica's count is right whatever happens next), then its
        global slots are freed and the lease its release carried on is handed back, once
        more if they were under way. These writes are best effort: cancelled again, or
        failing, they leave the slot and the lease to expire."""
        if outcome is not None and self._books.finished(step, outcome):
            self._report.finished(step, outcome)
        with best_effort():
            await self._free_slots(step.lease)
            if carried is not None and carried.lease.held:
                await self._hand_back(carried.lease, "its worker was cancelled")

    async def _free_slots(self, lease: Held) -> None:
        """The step is over (or step_timeout took it back): the slot of its handler's
        global limit is freed, fenced on its lease's token, and the handler may claim again
        here if only the limit held it back. A failure leaves the slot to expire with the
        lease."""
        if not lease.holds_slots:
            return
        try:
            await lease.free_slots()
        except StoreError as exc:
            self._report.log(
                logging.WARNING,
                f"could not free its slot of the global_limit; it expires with the lease: {exc}",
                lease,
                "slot-unfreed",
            )
        self._books.slot_freed(lease.handler)

    # -- a step -------------------------------------------------------------------------

    async def _run(self, step: Step[Held], stopping: bool) -> StepOutcome | None:
        """The step, in its worker; None when step_timeout took it back and counted it.
        A step torn down under it (SystemExit, a cancellation nobody asked for) is
        ``interrupted``; its worker's own cancellation takes it off the books."""
        self._crew.begin_step(step)
        try:
            outcome = await self._step(step, stopping)
        except BaseException as exc:
            end = self._crew.step_end(exc, step)
            if end is StepEnd.RAISE:
                raise
            if end is StepEnd.TIMED_OUT:
                return None
            if end is StepEnd.CANCELLED:
                await self._cancelled(step)
                raise
            outcome = self._interrupted(step)
        if step.abandoned:
            self._report.log(
                logging.WARNING,
                f"step returned after step_timeout ({self._settings.step_timeout:g}s), which"
                " had taken its lease back: its outcome was dropped; its attempt was already"
                " counted (timed out)",
                step.lease,
                "abandoned",
            )
        return outcome

    async def _step(self, step: Step[Held], stopping: bool) -> StepOutcome:
        """A claimed lease's step: run it, or hand the lease back unstarted."""
        lease = step.lease
        now = self._clock.now()
        why = steps.hand_back_reason(stopping=stopping, expired=lease.expired(now))
        if why is not None:
            outcome = await self._hand_back(lease, why)
            if stopping and outcome is StepOutcome.RELEASED:
                self._books.released_on_stop(f"{lease.collection}/{lease.id}")
            return outcome
        unrenewed = await self._renew_to_start(lease, now, confirm=not step.confirmed)
        if unrenewed is not None:
            return unrenewed
        inside = IN_STEP.set(self._engine)
        try:
            return await self._execute(step)
        finally:
            IN_STEP.reset(inside)

    async def _renew_to_start(
        self, lease: Held, now: datetime, *, confirm: bool
    ) -> StepOutcome | None:
        """A lease past half its time when its step starts is renewed first: a lease carried
        on by the step before, whose handler worked on after its outcome, would otherwise
        start the step on a lease about to expire, and another replica would take it over on
        schedule while it runs. So every step starts with at least half a lock timeout, as
        a fresh claim's does, and the heartbeat keeps it from there. ``confirm``: renewed
        whatever its age, the fenced write telling whether it was ever written (a submit's
        whose answer was lost). None: it runs; else the outcome of a lease that could not
        be renewed (not run). ``now``: the server clock's time as the step starts (no await
        since it was read)."""
        decision = (
            "extend"
            if confirm
            else scheduler.heartbeat(
                now,
                claimed_at=lease.claimed_at,
                locked_at=lease.locked_at,
                lock_timeout=self._settings.lock_timeout,
                step_timeout=None,
                extend=True,
            )
        )
        if decision == "extend":
            try:
                await lease.extend()
            except LeaseLost as exc:
                why = "its submit, whose answer was lost, did not write it" if confirm else f"{exc}"
                self._report.lost(f"could not renew a lease before its step: {why}", lease)
                return StepOutcome.LOST
            except StoreError as exc:
                return await self._hand_back(lease, f"its lease could not be renewed: {exc}")
            self._report.extended(lease)
            self._books.count("extended")
        return None

    async def _execute(self, step: Step[Held]) -> StepOutcome:
        lease = step.lease
        handler = lease.handler
        # A waiting document's step judges its wait (``trees``): its handler runs once
        # the wait has ended, in the phase it went on to.
        waits = self.trees.waits(lease)
        if handler.model is not None and not waits:
            try:
                lease.resource = handler.model.model_validate(lease.doc)
            except ValidationError as exc:
                why = explain(exc, handler.model.__name__, handler.model)
                return await self._settle(step, "ValidationError", why, True)
        try:
            if waits:
                result: object = await self.trees.resume(lease)
            else:
                result = await self._calls.call(handler.func, lease)
        except (Exception, asyncio.CancelledError) as exc:  # a cancellation the handler raised
            if self._crew.cancelling(exc):
                raise
            # Judged by the step's own lease, not by the exception: a LeaseLost raised by
            # another lease object, or by a second outcome, is the handler's error. A step
            # step_timeout took back has had its attempt recorded: nothing is written over
            # it, and its write refused (its lease says: an outcome was already recorded)
            # is said once, as a late return (``_run``).
            if lease.lost or step.abandoned:
                if not step.abandoned:
                    self._report.lost(f"lease lost: {describe(exc)}", lease)
                return StepOutcome.LOST
            return await self._settle(step, type(exc).__name__, describe(exc), exc=exc)
        wrong = steps.wrong_result(result, lease.token, handler.name)
        if wrong is not None:
            return await self._settle(step, "TypeError", wrong)
        outcome = result if isinstance(result, Outcome) else None
        if lease.held:
            unlocked = await self._unlock_left(lease)
            if not isinstance(unlocked, Outcome):
                return unlocked
            outcome = unlocked
        return self._done(step, outcome)

    def _done(self, step: Step[Held], outcome: Outcome | None) -> StepOutcome:
        """A step whose outcome landed: its action, its wait kept for the books."""
        if outcome is None:
            # The handler wrote its outcome without returning it, or it returned after
            # step_timeout took the lease back: nothing is left to write.
            self._report.log(
                logging.DEBUG, "step done; its lease was already released", step.lease, "done"
            )
            return StepOutcome.DONE
        self._report.log(logging.DEBUG, "step done", step.lease, outcome.action, wait=outcome.wait)
        step.wait = outcome.wait
        return outcome.action

    async def _unlock_left(self, lease: Held) -> Outcome | StepOutcome:
        """Unlock what the handler left held (it returned without an outcome): the
        unlock's outcome, or how the step ended when it did not land."""
        try:
            return await lease.unlock()
        except LeaseLost as exc:
            self._report.lost(f"lease lost: {exc}", lease)
            return StepOutcome.LOST
        except StoreError as exc:
            self._report.log(
                logging.ERROR,
                f"unlock failed, lease left to expire: {exc}",
                lease,
                StepOutcome.UNRECORDED,
            )
            return StepOutcome.UNRECORDED

    async def _settle(
        self,
        step: Step[Held],
        kind: str,
        message: str,
        permanent: bool = False,
        *,
        exc: BaseException | None = None,
        after: bool = True,
    ) -> StepOutcome:
        """Record a failed step on its document; never raises. ``after``: the handler's
        own error, which after the step's own outcome is only noted (that outcome stands
        and is returned); a time-out records only on a lease still held."""
        lease = step.lease
        trace = history.trace_text(exc, self._settings.traceback_chars) if exc else None
        try:
            recorded = await lease.record_error(
                kind, message, permanent=permanent, after=after, trace=trace
            )
        except LeaseLost as lost:
            if not lease.lost:
                # The step's own outcome, or its attempt's record, landed first: it stands.
                step.superseded = True
                first = lease.outcome
                self._report.log(
                    logging.INFO, f"{kind} in step not recorded: {lost}", lease, "superseded"
                )
                return first.action if first is not None else StepOutcome.LOST
            self._report.lost(f"{kind} in step, and the lease was lost: {lost}", lease)
            outcome = StepOutcome.LOST
        except Exception as inner:
            self._report.log(
                logging.ERROR,
                f"{kind} in step; recording it failed too ({inner!r}): "
                "the lease will expire and the step run again",
                lease,
                StepOutcome.UNRECORDED,
            )
            outcome = StepOutcome.UNRECORDED
        else:
            outcome = recorded.action
            step.wait = recorded.wait
            message = steps.noted_message(message, outcome)
            self._report.log(
                steps.settled_level(outcome),
                f"step raised {kind}: {message}",
                lease,
                outcome,
                wait=recorded.wait,
                exc_info=exc,
            )
        self._report.attempt_failed(step, kind, message, outcome)
        return outcome

    async def _hand_back(self, lease: Held, why: str) -> StepOutcome:
        """Release a lease whose step will not run; counters untouched."""
        try:
            await lease.release()
        except LeaseLost as exc:
            self._report.lost(f"could not hand back an unstarted lease: {exc}", lease)
            return StepOutcome.LOST
        except StoreError as exc:
            self._report.log(
                logging.WARNING,
                f"could not hand back an unstarted lease: {exc}",
                lease,
                StepOutcome.LOST,
            )
            return StepOutcome.LOST
        self._report.log(logging.INFO, f"handed back unstarted lease: {why}", lease, "released")
        return StepOutcome.RELEASED

    def _interrupted(self, step: Step[Held]) -> StepOutcome:
        """SystemExit and the like from a handler: the lease is left to expire, so another
        replica takes the step over; the worker carries on."""
        self._report.log(
            logging.CRITICAL,
            "step interrupted; lease left to expire",
            step.lease,
            StepOutcome.INTERRUPTED,
            exc_info=True,
        )
        return StepOutcome.INTERRUPTED

    async def _cancelled(self, step: Step[Held]) -> None:
        """The step's worker was cancelled, not by step_timeout: the loop is ending (or the
        application cancelled it). The step leaves the books at once (its place is free,
        the heartbeat no longer extends its lease), and its lease is left to expire rather
        than handed back: the step stopped part-way (a ``def`` step's thread may even run
        on), so no other replica may start it before its lease runs out; and a write now
        would hold up the loop's end, which may never run it. The slot of its global limit
        goes with the lease: kept while the lease is, freed (best effort) once the step's
        own outcome released it, as no step holds it then."""
        if not self._books.cancelled(step):
            return
        left = "lease left to expire" if step.lease.held else "its outcome stands"
        self._report.log(
            logging.WARNING,
            f"step cancelled with its worker (the event loop is ending?); {left}",
            step.lease,
            StepOutcome.INTERRUPTED,
        )
        self._report.finished(step, StepOutcome.INTERRUPTED)
        if not step.lease.held:
            with best_effort():
                await self._free_slots(step.lease)

    # -- long steps ---------------------------------------------------------------------

    async def heartbeat(self) -> int:
        """Extend the leases of steps running past half the lock timeout and take back
        those past ``step_timeout``; the leases extended."""
        await self.measure_if_due()
        running = self._books.running()
        if not self._clock.measured:
            return 0
        now = self._clock.now()
        due: list[Held] = []
        late: list[Step[Held]] = []
        for step in running:
            lease = step.lease
            # A step whose lease is gone (released early, or lost) is never extended, but
            # it still times out: a handler that hangs after unlock() must free its slot.
            decision = scheduler.heartbeat(
                now,
                claimed_at=lease.claimed_at,
                locked_at=lease.locked_at,
                lock_timeout=self._settings.lock_timeout,
                step_timeout=self._settings.step_timeout,
                extend=self._settings.heartbeat and lease.held,
            )
            if decision == "time_out":
                late.append(step)
            elif decision == "extend":
                due.append(lease)
        # Every extension is sent at once, before any time-out's record: one slow write
        # must not hold the others back until their leases expire.
        results = await self._crew.all_at_once([lease.extend for lease in due]) if due else []
        extended = 0
        for lease, result in zip(due, results, strict=True):
            if isinstance(result, LeaseLost):
                self._report.lost(f"heartbeat failed: {result}", lease)
            elif isinstance(result, StoreError):
                self._report.log(
                    logging.WARNING, f"heartbeat failed: {result}", lease, StepOutcome.LOST
                )
            elif isinstance(result, BaseException):
                raise result
            else:
                extended += 1
                self._report.extended(lease)
        for step in late:
            await self._time_out(step)
        if extended:
            self._books.count("extended", extended)
        await self._look_for_cancels([s.lease for s in running if s.lease.held])
        return extended

    async def _look_for_cancels(self, held: list[Held]) -> None:
        """Tell running steps whose document an operator moved or deleted meanwhile
        (``lease.cancel_requested``): one read per collection with steps running, none on
        an idle replica. A failure leaves them to find out at their next write."""
        by_collection: dict[str, list[Held]] = {}
        for lease in held:
            by_collection.setdefault(lease.collection, []).append(lease)
        for collection, leases in by_collection.items():
            query = tree_queries.ids_filter([lease.id for lease in leases])
            try:
                docs = await self._store.find_fields(collection, query, ["lockToken"], len(leases))
            except StoreError:
                continue
            found = {repr(doc.get("_id")): doc for doc in docs}
            for lease in leases:
                if not lease.cancel_requested and changed_from_outside(found.get(repr(lease.id))):
                    lease.outside_change()
                    self._report.log(
                        logging.INFO,
                        "its document was moved or deleted from outside while the step runs:"
                        " lease.cancel_requested",
                        lease,
                        "cancel-requested",
                    )

    async def _time_out(self, step: Step[Held]) -> None:
        """A step that never returns must not hold its document forever: count the attempt,
        release the lease (its late writes will then raise LeaseLost) and free its slot.
        A lease the step no longer holds is not written: only the slot is freed."""
        message = f"step ran longer than step_timeout ({self._settings.step_timeout:g}s)"
        if step.lease.held:
            await self._settle(step, StepTimeout.__name__, message, after=False)
            if step.superseded:
                # The step's own outcome landed while the time-out waited to record: the
                # step ended at its deadline and its worker counts it. Should it hang on
                # after its write, the next heartbeat frees its slot (its lease is gone).
                return
        else:
            self._report.log(
                logging.WARNING,
                f"{message}, its lease already gone",
                step.lease,
                StepOutcome.TIMED_OUT,
            )
        await self._free_slots(step.lease)  # it may run on, but holds no lease: nor a slot
        if self._books.timed_out(step, self._crew.let_go):
            self._report.finished(step, StepOutcome.TIMED_OUT)
