"""A replica's books: everything about its work that changes, changed in one place.

The scheduler, the steps running, the workers counted, the counters, the timer, whether it
serves: each change is a method here, made under the one lock, with the wake-up it calls
for (``Crew.wake``). The engines read and write their state only through these methods,
so a change of state is never spread over a step's code (h11's ``_state.py`` rule).
Engine-neutral: the async engine and its generated sync twin share it.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from apscheduler.schedulers.base import BaseScheduler

from orchestrator.core import steps
from orchestrator.core.lease import LeaseCore
from orchestrator.core.lease_api import StepLease
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.scheduler import Action, Claim, Found, Probe, Scheduler
from orchestrator.core.steps import StopReport
from orchestrator.runners.step import Step

if TYPE_CHECKING:
    from orchestrator.core.registry import Handler

__all__ = ["LEAVE", "Books", "Crew", "Leave"]

L = TypeVar("L", bound=StepLease)


_UNKNOWN_PHASE = frozenset({StepOutcome.LOST, StepOutcome.DONE, StepOutcome.TIMED_OUT})
"""Outcomes after which the document's phase is not known here: they wake the workers."""


class Leave(Enum):
    """A worker's answer from the books: nothing to do, and it is not needed any more."""

    LEAVE = "leave"


LEAVE = Leave.LEAVE


class Crew(Protocol):
    """What the books ask of an engine's workers (``orchestrator.runners.workers``)."""

    def wake(self, *, more_work: bool, settling: bool) -> None:
        """Wake one idle worker (``more_work``), or every waiter (``settling``)."""

    def spawn(self) -> None:
        """Start one more worker."""


class Books(Generic[L]):
    """The state of one replica's work, guarded by ``lock`` (which the crew's waits use)."""

    def __init__(self, max_concurrency: int, budget: int) -> None:
        self.lock = threading.RLock()
        self._max = max_concurrency
        self._sched = Scheduler([], max_concurrency=max_concurrency, budget=budget)
        self._crew: Crew | None = None
        self._running: dict[str, Step[L]] = {}
        self._lent: deque[Step[L]] = deque()  # on the books, waiting for a free worker
        self._workers = 0  # workers that will take another action
        self._serving = False  # workers stay for the next tick (start() until stop())
        self._stats: Counter[str] = Counter()
        self._released_on_stop: list[str] = []
        self._errors: list[BaseException] = []  # what workers met during run_once
        self._timer: BaseScheduler | None = None  # ticks and heartbeats, while started
        self._numbers = itertools.count(1)
        self._has_handlers = False
        self._operator_paused: frozenset[str] = frozenset()
        self._refused: frozenset[str] = frozenset()  # handlers set aside (``refuse``)
        self._live: int | None = None  # live replicas, as the last probe counted them

    def hire(self, crew: Crew) -> None:
        """The workers these books wake and spawn (set once, by the engine)."""
        self._crew = crew

    @property
    def crew(self) -> Crew:
        if self._crew is None:
            raise RuntimeError("the books have no crew yet")
        return self._crew

    # -- what is read -------------------------------------------------------------------

    @property
    def timer(self) -> BaseScheduler | None:
        return self._timer

    @property
    def workers(self) -> int:
        return self._workers

    def has_work(self) -> bool:
        """Steps running or slots in use (the async engine will not leave a loop then)."""
        with self.lock:
            return bool(self._running) or bool(self._sched.busy)

    def running(self) -> list[Step[L]]:
        with self.lock:
            return list(self._running.values())

    def next_number(self) -> int:
        return next(self._numbers)

    def stats(self) -> dict[str, int]:
        with self.lock:
            return dict(self._stats)

    @property
    def live(self) -> int | None:
        """The live replicas of the fleet, as the last probe counted them (None: none did)."""
        with self.lock:
            return self._live

    @property
    def stopping(self) -> bool:
        with self.lock:
            return self._sched.stopping

    def once_over(self) -> bool:
        """The tick is over: when the replica does not serve, once every worker has left
        (they leave when nothing is left to claim, or fail: their errors are raised by
        run_once); when it serves, once nothing is left to claim. Not before they left: a
        worker still about when run_once returned would take the next submit's wake and
        run that step between the caller's calls, counted by no run_once."""
        if self._serving:
            return self._sched.quiet or not self._workers
        return not self._workers

    def idle(self) -> bool:
        """No slot in use: what ``stop`` waits for."""
        return not self._sched.busy

    # -- registration and counters ----------------------------------------------------

    def register(self, handlers: list[Handler]) -> None:
        with self.lock:
            self._sched.register(handlers)
            self._has_handlers = bool(handlers)

    def pause(self, keys: frozenset[str]) -> None:
        """The handlers operators paused (their keys) are these now: claim nothing for
        them; a handler resumed may have work waiting, so the workers look again."""
        with self.lock:
            self._operator_paused = keys
            if self._sched.pause(keys | self._refused) and self._serving:
                self._top_up()

    def refuse(self, collection: str) -> None:
        """The server refuses this replica's claims on ``collection`` until its settings
        change (``ShardKeyRequired``): its handlers are set aside, as if paused, so no
        probe or claim goes there again and no error is logged at every tick."""
        with self.lock:
            keys = {h.key for h in self._sched.handlers if h.collection == collection}
            self._refused = self._refused | keys
            self._sched.pause(self._operator_paused | self._refused)

    def paused(self) -> frozenset[str]:
        with self.lock:
            return self._operator_paused

    def count(self, name: str, by: int = 1) -> None:
        with self.lock:
            self._stats[name] += by

    def submitted(self, collection: str, phase: object) -> None:
        """A document due now was submitted here (or found there at a submit): the idle
        handlers that may claim it look at once, not at the next tick; the others, which
        would claim in vain, stay idle."""
        with self.lock:
            woken = steps.takers(self._sched.handlers, collection, phase)
            self._sched.came_due(woken)
            if woken:
                self._notify(more_work=True, everyone=len(woken) > 1)

    def lend(self, collection: str, phase: object) -> Handler | None:
        """The handler to whose next step a local submit may create its document, due now
        in ``phase``, already leased (``Scheduler.lend``: a free slot here is taken for
        it), or None: created free, to be claimed. Only while serving: a replica driven by
        ``run_once`` has no worker between its calls to run it."""
        with self.lock:
            if not self._serving or not isinstance(phase, str):
                return None
            handler = steps.carry_target(self._sched.handlers, collection, phase)
            if handler is None or not self._sched.lend(handler):
                return None
            return handler

    def lent(self, step: Step[L]) -> None:
        """A submit created its document leased to ``step`` (or may have: its answer was
        lost): on the books from now on, so the heartbeat keeps its lease alive, and run by
        the next free worker, whose slot ``lend`` took."""
        with self.lock:
            self._stats["lent"] += 1
            self._running[step.lease.token] = step
            self._lent.append(step)
            self._notify(more_work=True)

    def unlent(self, collection: str, phase: object) -> None:
        """The document ``lend`` reserved a slot for was not created leased here (one of
        its unique keys existed, in ``phase``): the slot is free again, and the handlers
        that may claim that document look."""
        with self.lock:
            self._sched.unlent()
            self.submitted(collection, phase)

    # -- workers ------------------------------------------------------------------------

    def next_action(self) -> Action | Step[L] | Leave | None:
        """A free worker's next action (a step a submit lent it first: its slot is taken),
        ``LEAVE`` when it is not needed any more (the replica does not serve and the tick
        is over), or None: wait for news. The caller holds the lock (the crew's wait)."""
        while self._lent:
            step = self._lent.popleft()
            if not step.abandoned:  # step_timeout took it back while it waited: not run
                return step
        action = self._sched.next()
        if action is not None:
            return action
        if self._serving or not self._sched.quiet:
            return None
        self._workers -= 1
        self._notify(more_work=False)
        return LEAVE

    def tick(self) -> None:
        """A new tick: fresh budgets, and workers to use them."""
        with self.lock:
            self._stats["ticks"] += 1
            self._sched.tick()
            self._top_up()

    def _top_up(self) -> None:
        missing = self._max - self._workers
        for _ in range(missing if self._has_handlers and not self._sched.stopping else 0):
            self._workers += 1
            self.crew.spawn()
        self._notify(more_work=True, everyone=True)  # a new tick: every idle worker may have work

    def worker_failed(self, exc: BaseException) -> None:
        """A worker met something that is not a StoreError: a bug, or the process dying."""
        with self.lock:
            self._workers -= 1  # the next tick puts a fresh worker in its place
            self._stats["tick_failures"] += 1
            self._errors.append(exc)
            self._notify(more_work=True)

    def worker_cancelled(self, *, counted: bool) -> None:
        """A worker's task was cancelled (the loop is ending, or the application did it)."""
        with self.lock:
            if counted:
                self._workers -= 1
            self._notify(more_work=False)

    # -- actions ------------------------------------------------------------------------

    def action_failed(self, action: Action) -> None:
        """An action could not start (the server's clock cannot be measured)."""
        with self.lock:
            self._stats["claim_errors"] += 1
            if isinstance(action, Probe):
                self._sched.probed(action, None)
            else:
                self._sched.claimed(action, None)
            self._notify(more_work=False)

    def probed(self, probe: Probe, found: Found | None) -> None:
        with self.lock:
            if found is not None and found.live is not None:
                self._live = found.live
            self._sched.probed(probe, found)
            self._notify(more_work=found is None or bool(found.ready))

    def came_due(self, handlers: Sequence[Handler]) -> None:
        """A due time came (the timer's: a probe announced it, or a rate limit's next
        slot) for work ``handlers`` may claim: they claim now, not at the next tick, and
        nothing is probed."""
        with self.lock:
            self._sched.came_due(handlers)
            self._notify(more_work=True, everyone=True)

    def due_in(self, seconds: float, job: Callable[[], object], name: str = "due") -> None:
        """Call ``job`` (which calls ``came_due``) in ``seconds``, before the next tick,
        while serving: one such wake at a time per ``name``, the latest asked replacing the
        one before (a collection's due time, a rate limit's next slot)."""
        with self.lock:
            timer = self._timer if self._serving else None
        if timer is not None:  # outside the lock: the timer has its own
            when = datetime.now(UTC) + timedelta(seconds=seconds)
            timer.add_job(job, "date", run_date=when, id=name, replace_existing=True)

    def claim_broke(self, claim: Claim) -> None:
        """A claim ended in something unexpected: its slot is freed."""
        with self.lock:
            self._sched.claimed(claim, None)

    def claimed(self, claim: Claim, step: Step[L] | None) -> bool:
        """A claim came back (``step``, or None: nothing found); True when the replica was
        stopping by then (the step is handed back, not run)."""
        with self.lock:
            key = None if step is None else str(step.lease.id)
            throttled = self._sched.claimed(claim, key)
            if step is not None:
                self._stats["claimed"] += 1
                step.lease.throttled = throttled
                self._running[step.lease.token] = step
            self._notify(more_work=step is not None)
            return self._sched.stopping

    def limited(self, handler: Handler) -> None:
        """``handler`` found no free slot of its cluster-wide limits: its claim comes back
        empty, and it waits for the next tick or a slot freed here (``slot_freed``)."""
        with self.lock:
            self._sched.limited(handler)

    def slot_freed(self, handler: Handler) -> None:
        """A step of this replica freed a slot of ``handler``'s global limit: if the limit
        kept ``handler`` idle here, a worker claims for it now."""
        with self.lock:
            if self._sched.unlimited(handler):
                self._notify(more_work=True)

    def reserve(self, lease: LeaseCore[Any], phase: str) -> Handler | None:
        """A ``Carrier``: the handler that takes ``lease``'s document on in ``phase`` at
        once, its budget counted (``Scheduler.carry``), or None: release it."""
        with self.lock:
            handler = steps.carry_target(self._sched.handlers, lease.collection, phase)
            if handler is None or not self._sched.carry(handler, str(lease.id)):
                return None
            return handler

    def _frees_work_here(self, step: Step[L], outcome: StepOutcome) -> bool:
        """Whether the document ``step`` let go of may be one of these handlers' to claim:
        so it is when its phase is not known here (no outcome landed, or one that lost it)."""
        left = step.lease.outcome
        if left is None or not isinstance(left.phase, str) or outcome in _UNKNOWN_PHASE:
            return True
        return steps.could_take(self._sched.handlers, step.lease.collection, left.phase)

    def finished(self, step: Step[L], outcome: StepOutcome, carried: Step[L] | None = None) -> bool:
        """A step is over; False when step_timeout had counted it already (not again).
        ``carried``: the next step its release took the lease on into, which keeps its
        slot and is running from now on."""
        with self.lock:
            if step.abandoned:
                return False
            # Plain names (str of a StrEnum: its value): stats() prints and serialises as before.
            self._stats[str(outcome)] += 1
            del self._running[step.lease.token]
            if carried is None:
                self._sched.finished(outcome, wakes=self._frees_work_here(step, outcome))
            else:  # it keeps its slot and frees nothing: whom it would wake is not asked
                self._sched.finished(outcome, carried=True)
                self._stats["carried"] += 1
                self._running[carried.lease.token] = carried
            self._notify(more_work=False)  # its worker takes the next action itself
            return True

    def timed_out(self, step: Step[L], uncounted: Callable[[Step[L]], bool]) -> bool:
        """step_timeout takes ``step`` back: its slot is freed and a fresh worker takes its
        place when ``uncounted(step)`` (the crew let go of its worker). False when it was
        over already."""
        with self.lock:
            if step.abandoned or step.lease.token not in self._running:
                return False
            step.abandoned = True
            del self._running[step.lease.token]
            self._stats[StepOutcome.TIMED_OUT.value] += 1
            self._sched.finished(StepOutcome.TIMED_OUT)
            if uncounted(step):
                self._workers -= 1
            self._top_up()
            self._notify(more_work=True)
            return True

    def cancelled(self, step: Step[L]) -> bool:
        """A step's worker was cancelled, not by step_timeout: it leaves the books (False
        when it had left them already)."""
        with self.lock:
            if self._running.pop(step.lease.token, None) is None:
                return False
            self._stats[StepOutcome.INTERRUPTED.value] += 1
            self._sched.finished(StepOutcome.INTERRUPTED)
            self._notify(more_work=False)
            return True

    def released_on_stop(self, name: str) -> None:
        with self.lock:
            self._released_on_stop.append(name)

    # -- run_once, start, stop ----------------------------------------------------------

    def begin_once(self) -> None:
        """``run_once``'s tick: a stopped replica runs a tick by hand, as a new one does."""
        with self.lock:
            self._errors.clear()
            if not self._serving:
                self._sched.resume()
        self.tick()

    def end_once(self) -> list[BaseException]:
        """What workers met during ``run_once``."""
        with self.lock:
            errors, self._errors = self._errors, []
            return errors

    def serve(self, timer: BaseScheduler) -> bool:
        """Serve from now on with ``timer``; False when already started."""
        with self.lock:
            if self._timer is not None:
                return False
            self._timer = timer
            self._serving = True
            self._released_on_stop.clear()
            self._sched.resume()
        self.tick()
        return True

    def request_stop(self) -> None:
        """Claim nothing more."""
        with self.lock:
            self._sched.stop()
            self._serving = False
            self._notify(more_work=True, everyone=True)

    def take_timer(self) -> BaseScheduler | None:
        """Stop serving: the timer, to shut down."""
        with self.lock:
            timer, self._timer = self._timer, None
            self._serving = False
            return timer

    def stop_report(self) -> StopReport:
        with self.lock:
            still = [f"{s.lease.collection}/{s.lease.id}" for s in self._running.values()]
            return StopReport(list(self._released_on_stop), still)

    # -- waking -------------------------------------------------------------------------

    def _notify(self, *, more_work: bool, everyone: bool = False) -> None:
        """Something happened (the caller holds the lock): ``more_work``, there may be
        work for one more worker; ``everyone``, every idle worker may have work (a tick, a
        submit, a stop). The waiters of run_once and stop are woken only when the replica
        may have settled: waking them whenever no step runs, which at concurrency 1 is
        after every step, cost each step a wake-up of a waiter that went back to sleep."""
        sched = self._sched
        settling = (
            everyone or sched.quiet or not self._workers or (sched.stopping and not sched.busy)
        )
        self.crew.wake(more_work=more_work, settling=settling)
