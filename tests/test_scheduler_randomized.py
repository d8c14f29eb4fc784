"""Randomized tests of the scheduling core on its own (``orchestrator.core.scheduler``).

A hypothesis state machine plays the runners' part: it asks the ``Scheduler`` for actions
and feeds it what a runner would see, in any order a runner could see it: ticks, probes and
claims coming back (found, empty, failed), steps ending with every outcome, local submits,
stops and restarts, handlers registered late, time passing and heartbeats (at the runners'
cadence, and in between as ``run_once``'s waits call them). Beside the scheduler it keeps a
small model written from the promises, not from the code: what is in flight, what each
handler is known to lack, what each document used of its budget, when each lease runs out.
Each promise broken raises its own ``Broken`` subclass, so hypothesis shrinks distinct
defects separately.

Promises checked (``n``: handlers registered):

- capacity: claims in flight plus steps running never exceed ``max_concurrency``, and the
  scheduler's ``busy`` is exactly that count;
- budgets: a claim reports its document throttled exactly when that document was claimed
  more than ``max_unlocks_per_tick`` times since the tick began;
- no idle handler is claimed for: a handler is idle once a read for it (its own claim, or
  its collection's probe) that began after the last event that may have made work appear
  (tick, local submit, a step ending in a way that frees work) found nothing; until then it
  is not;
- one claim at a time for a handler not known to have work (its last claim found nothing);
- a due time a probe announced wakes the handlers it names, and no probe: they are not
  idle until a read that began after it finds nothing for them;
- probing: a tick is followed by one probe of every
  handler, before any claim of a handler not known to have work (known: the latest probe
  answer found work for it, or its last claim came back with a document); while a probe
  is out only known handlers are claimed for; a probe's answer idles exactly the handlers
  of the collections it found nothing on (unless work may have appeared since it was
  sent), and what it found is known even then: probes slower than the ticks never hold
  the claims back;
- carrying on: a step that frees its document may carry its lease into the next step
  (``carry``) only while not stopping and within the document's budget, which it uses;
  its slot stays taken and it frees no work;
- liveness: ``next()`` answers "nothing to do" only when nothing may be done (stopping,
  capacity full, or no handler eligible); so a tick whose reads are all back never stalls;
- fairness: a handler that stays eligible is passed over for at most ``n - 1`` claims of
  other handlers (within a tick: a tick restarts the round robin elsewhere);
- the end of a tick: ``quiet`` holds exactly when nothing is in flight, no step runs, and
  the replica is stopping or every handler is idle;
- stop: nothing is handed out after a stop (until resumed); a claim that comes back after
  the stop sees ``stopping`` and is handed back; a stop with nothing running is quiet;
- heartbeat: with heartbeats at the runners' cadence (every lock_timeout / 6), a lease
  whose step still runs never reaches its expiry; no lease is renewed before half its
  timeout, nor with the heartbeat off; a step past ``step_timeout`` is taken back at the
  first heartbeat at or after it, never before.

The default ("ci") profile is derandomized and takes a few seconds;
``HYPOTHESIS_PROFILE=soak uv run pytest tests/test_scheduler_randomized.py`` explores more.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler
from orchestrator.core.scheduler import Claim, Found, Probe, Scheduler, heartbeat
from orchestrator.core.settings import Settings

pytestmark = pytest.mark.pure

SETTINGS = Settings()
COLLECTIONS = ("jobs", "mail", "keys")
DOCS = ("d0", "d1", "d2", "d3")
OUTCOMES = tuple(StepOutcome)
MAX_HANDLERS = 5
START = datetime(2026, 1, 1, tzinfo=UTC)

PROFILES = {
    "ci": settings(
        max_examples=100,
        stateful_step_count=50,
        derandomize=True,  # the same examples on every run; the soak explores
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    ),
    "soak": settings(
        max_examples=5000,
        stateful_step_count=150,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    ),
}


class Broken(AssertionError):
    """A promise of the scheduling core was broken."""


class OverCapacity(Broken):
    pass


class BusyMiscounted(Broken):
    pass


class BudgetMisjudged(Broken):
    pass


class IdleClaimed(Broken):
    """A handler known to have nothing was claimed for, or one not known so was idled."""


class TooManyClaims(Broken):
    """Several claims in flight for a handler not known to have work."""


class ProbeMisplaced(Broken):
    pass


class Stalled(Broken):
    """``next()`` gave nothing although something could be done."""


class Starved(Broken):
    pass


class QuietWrong(Broken):
    pass


class ClaimedWhileStopping(Broken):
    pass


class LeaseExpiredWhileRunning(Broken):
    pass


class RenewedNeedlessly(Broken):
    """A lease renewed before half its timeout, or with the heartbeat off."""


class TimeoutMissed(Broken):
    pass


class TimeoutEarly(Broken):
    pass


def _handler(collection: str, number: int) -> Handler:
    def func(lease: Any) -> None:
        return None

    return Handler(
        func=func,
        collection=collection,
        match={"phase": f"P{number}"},
        phase=f"P{number}",
        model=None,
        max_attempts=5,
        failed_phase="Failed",
        relock_policy=SETTINGS.relock_policy,
        retry_policy=SETTINGS.retry_policy,
        name=f"{collection}.P{number}",
    )


@dataclass(repr=False)
class Read:
    """A probe or claim the scheduler handed out, not yet back."""

    action: Probe | Claim
    epoch: int  # the model's count of "work may have appeared" events when it was issued

    def __repr__(self) -> str:
        what = (
            self.action.collections if isinstance(self.action, Probe) else self.action.handler.name
        )
        return f"<{type(self.action).__name__} {what} at epoch {self.epoch}>"


@dataclass
class Running:
    """A step running (or being handed back) on a claimed lease; times in milliseconds."""

    claimed_at: int
    locked_at: int
    handed_back: bool  # claimed after a stop: the runner hands it back unstarted
    handler: int = 0
    doc: str = ""
    held: bool = True  # False once a renewal failed (the lease was lost)


class SchedulerMachine(RuleBasedStateMachine):
    """One replica's scheduler and a model of what it was told."""

    def __init__(self) -> None:
        super().__init__()
        self.handlers: list[Handler] = []
        self.sched = Scheduler([], max_concurrency=1, budget=1)
        self.reads: list[Read] = []
        self.steps: list[Running] = []
        self.epoch = 0  # events that may have made work appear: tick, wake, freeing step
        self.idle: set[int] = set()
        self.hot: set[int] = set()  # handlers whose last claim came back with a document
        self.found: set[int] = set()  # handlers the latest probe answer found work for
        self.owed = False  # an answer found work (or work was known): a claim goes first
        self.probe_due = False  # a probe is owed before any claim
        self.claims: Counter[str] = Counter()  # claims per document this tick
        self.passed: Counter[int] = Counter()  # claims of others while eligible
        self.stopping = False
        self.now = 0  # milliseconds
        self.last_beat = 0

    @initialize(
        collections=st.lists(st.sampled_from(COLLECTIONS), min_size=1, max_size=4),
        slots=st.integers(1, 4),
        budget=st.integers(1, 3),
        lock_timeout=st.sampled_from([12, 30, 60]),
        step_timeout=st.one_of(st.none(), st.sampled_from([1.0, 1.5, 4.0])),
        extend=st.booleans(),
    )
    def setup(
        self,
        collections: list[str],
        slots: int,
        budget: int,
        lock_timeout: int,
        step_timeout: float | None,
        extend: bool,
    ) -> None:
        self.handlers = [_handler(c, n) for n, c in enumerate(collections)]
        self.slots, self.budget = slots, budget
        self.lock_timeout = lock_timeout * 1000  # milliseconds, as every time here
        self.step_timeout = None if step_timeout is None else int(step_timeout * self.lock_timeout)
        self.extend = extend
        self.interval = self.lock_timeout // 6  # the runners' heartbeat interval
        self.sched = Scheduler(self.handlers, max_concurrency=slots, budget=budget)
        self._tick()

    # -- the model's view ---------------------------------------------------------------

    def _claims_out(self, index: int) -> int:
        return sum(
            1
            for r in self.reads
            if isinstance(r.action, Claim) and r.action.handler is self.handlers[index]
        )

    def _probing(self) -> bool:
        return any(isinstance(r.action, Probe) for r in self.reads)

    def _busy(self) -> int:
        return sum(1 for r in self.reads if isinstance(r.action, Claim)) + len(self.steps)

    def _eligible(self, index: int) -> bool:
        known = index in self.hot or index in self.found
        return (
            index not in self.idle
            and (known or (not self.probe_due and not self._probing()))
            and (index in self.hot or not self._claims_out(index))
        )

    def _owed_now(self) -> bool:
        """A claim is owed and may be made: a found or hot handler, not idle, free to claim."""
        return self.owed and any(
            i not in self.idle and (i in self.hot or not self._claims_out(i))
            for i in self.found | self.hot
        )

    def _work_may_appear(self) -> None:
        self.epoch += 1
        self.idle.clear()

    def _tick(self) -> None:
        self.sched.tick()
        self._work_may_appear()
        self.claims.clear()
        self.passed.clear()  # the round robin starts elsewhere
        self.probe_due = True

    # -- what happens -------------------------------------------------------------------

    # Every rule ends with the workers doing a few things (``_work``): hypothesis leaves
    # some rules out of each run (swarm testing), and the workers must never be left out.

    @rule(data=st.data())
    def work(self, data: st.DataObject) -> None:
        """Nothing else happens: the workers work."""
        self._work(data, minimum=1)

    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        self._tick()
        self._work(data)

    @rule(data=st.data())
    def came_due(self, data: st.DataObject) -> None:
        """A due time a probe announced, or a local submit, comes for some handlers: they
        may claim again, with no probe of everything."""
        woken = data.draw(st.sets(st.sampled_from(range(len(self.handlers)))), label="woken")
        self.sched.came_due([self.handlers[i] for i in sorted(woken)])
        if woken:
            self.epoch += 1  # a read that began before it idles no one
            self.idle -= woken
        self._work(data)

    def _work(self, data: st.DataObject, minimum: int = 0) -> None:
        """The workers do a few of the things workers do, in any order: ask for an action,
        see a probe or a claim come back, end a step."""
        for _ in range(data.draw(st.integers(minimum, 8), label="moves")):
            moves = ["ask", *(["read"] if self.reads else []), *(["step"] if self.steps else [])]
            move = data.draw(st.sampled_from(moves), label="move")
            if move == "ask":
                self._ask()
            elif move == "read":
                self._read_returns(data)
            else:
                self._step_ends(data)

    def _ask(self) -> bool:
        eligible = [i for i in range(len(self.handlers)) if self._eligible(i)]
        can_act = not self.stopping and self._busy() < self.slots and self.handlers
        owed = False
        if self.probe_due and not self._probing() and can_act:
            owed = self.owed = self._owed_now()
        can_probe = self.probe_due and not self._probing() and not owed
        action = self.sched.next()
        if action is None:
            if can_act and (can_probe or eligible):
                raise Stalled(f"nothing to do, yet {'a probe' if can_probe else eligible} could")
            return False
        if self.stopping:
            raise ClaimedWhileStopping(f"{action} after stop()")
        if self._busy() >= self.slots:
            raise OverCapacity(f"{action} with {self._busy()} of {self.slots} slots in use")
        if isinstance(action, Probe):
            if not can_probe or set(action.handlers) != set(self.handlers):
                raise ProbeMisplaced(
                    f"probe of {action.handlers}; due: {self.probe_due}, claim owed: {owed}"
                )
            known = {self.handlers.index(action.handlers[n]) for n in action.known}
            if known != self.hot | self.found:
                raise ProbeMisplaced(
                    f"the probe takes {sorted(known)} as known to have work, "
                    f"not {sorted(self.hot | self.found)}"
                )
            self.probe_due = False
        else:
            self._check_claim(action, eligible)
            self.owed = False
        self.reads.append(Read(action, self.epoch))
        return True

    def _check_claim(self, claim: Claim, eligible: list[int]) -> None:
        index = self.handlers.index(claim.handler)
        name = claim.handler.name
        if (
            (self.probe_due or self._probing())
            and index not in self.hot
            and index not in self.found
        ):
            raise ProbeMisplaced(f"{name}, not known to have work, claimed before the answer")
        if index in self.idle:
            raise IdleClaimed(f"{name} is known to have nothing")
        if index not in self.hot and self._claims_out(index):
            raise TooManyClaims(f"{name}: a second claim, not known to have work")
        if index not in eligible:
            raise ProbeMisplaced(f"{name} claimed while its collection's probe is out")
        for other in range(len(self.handlers)):
            if other == index or other not in eligible:
                self.passed[other] = 0
                continue
            self.passed[other] += 1
            if self.passed[other] > len(self.handlers) - 1:
                who = self.handlers[other].name
                raise Starved(f"{who} passed over {self.passed[other]} times in a row")

    def _read_returns(self, data: st.DataObject) -> None:
        """A probe comes back: something claimable, nothing, or the read failed (None); or
        a claim: with a document, or without (nothing found, or the claim failed: the
        runners tell the scheduler both alike)."""
        read = self.reads.pop(data.draw(st.integers(0, len(self.reads) - 1), label="read"))
        if isinstance(read.action, Probe):
            found = data.draw(
                st.one_of(st.none(), st.sets(st.sampled_from(COLLECTIONS))), label="probe found"
            )
            self._probe_returns(read, read.action, found)
        else:
            doc = data.draw(st.sampled_from((*DOCS, None)), label="claimed")
            self._claim_returns(read, read.action, doc)

    def _probe_returns(self, read: Read, probe: Probe, found: set[str] | None) -> None:
        ready = frozenset(
            n
            for n, h in enumerate(probe.handlers)
            if found is not None and h.collection in found and n not in probe.known
        )
        self.sched.probed(probe, None if found is None else Found(ready))
        if found is None:
            return
        if probe.known:
            self.owed = True  # known work is claimed before the next probe, as found work is
        # those it asked about: a handler registered since, or known to have work, was not
        for position, handler in enumerate(probe.handlers):
            if position in probe.known:
                continue
            index = self.handlers.index(handler)
            if handler.collection in found:
                self.idle.discard(index)
                self.found.add(index)
                self.owed = True
                continue
            self.found.discard(index)
            if read.epoch == self.epoch:
                self.idle.add(index)

    def _claim_returns(self, read: Read, claim: Claim, doc: str | None) -> None:
        index = self.handlers.index(claim.handler)
        throttled = self.sched.claimed(claim, doc)
        if doc is None:
            self.hot.discard(index)
            self.found.discard(index)
            if read.epoch == self.epoch:
                self.idle.add(index)
            if throttled:
                raise BudgetMisjudged("a claim that found nothing reported a throttled document")
            return
        self.hot.add(index)
        key = f"{claim.handler.collection}/{doc}"
        self.claims[key] += 1
        if throttled != (self.claims[key] > self.budget):
            raise BudgetMisjudged(
                f"{key}: claim {self.claims[key]} this tick, budget {self.budget}, "
                f"throttled={throttled}"
            )
        if self.sched.stopping != self.stopping:
            raise ClaimedWhileStopping("the scheduler and the replica disagree on stopping")
        self.steps.append(
            Running(self.now, self.now, handed_back=self.stopping, handler=index, doc=key)
        )

    def _step_ends(self, data: st.DataObject) -> None:
        """A step ends with an outcome (a lease claimed after a stop is handed back
        unstarted: released, or lost)."""
        step = self.steps.pop(data.draw(st.integers(0, len(self.steps) - 1), label="step"))
        outcome = data.draw(
            st.sampled_from(
                (StepOutcome.RELEASED, StepOutcome.LOST) if step.handed_back else OUTCOMES
            ),
            label="outcome",
        )
        if outcome.frees_work and not step.handed_back:
            onto = data.draw(st.integers(0, len(self.handlers) - 1), label="carried into")
            handler = self.handlers[onto]
            doc = step.doc.split("/", 1)[1]
            carried = self.sched.carry(handler, doc)
            key = f"{handler.collection}/{doc}"
            if carried != (not self.stopping and self.claims[key] < self.budget):
                raise BudgetMisjudged(f"{key}: carried={carried}, {self.claims[key]} this tick")
            if carried:
                self.claims[key] += 1
                self.sched.finished(outcome, carried=True)
                self.steps.append(Running(self.now, self.now, False, onto, key))
                return
        self.sched.finished(outcome)
        if outcome.frees_work:
            self._work_may_appear()

    @precondition(lambda self: not self.stopping)
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        self.sched.stop()
        self.stopping = True
        self._work(data)

    @precondition(lambda self: self.stopping)
    @rule(data=st.data())
    def start_again(self, data: st.DataObject) -> None:
        """``start()`` after ``stop()``: resumed, then a tick."""
        self.sched.resume()
        self.stopping = False
        self._tick()
        self._work(data)

    @precondition(lambda self: len(self.handlers) < MAX_HANDLERS)
    @rule(collection=st.sampled_from(COLLECTIONS), data=st.data())
    def register(self, collection: str, data: st.DataObject) -> None:
        """A handler registered while the replica runs (registration only appends)."""
        self.handlers.append(_handler(collection, len(self.handlers)))
        self.sched.register(self.handlers)
        self.idle.clear()
        self.passed.clear()
        self._work(data)

    # -- time and the heartbeat (times in whole milliseconds: exact) --------------------

    @rule(
        intervals=st.integers(0, 8),
        ms=st.integers(0, 9_999),
        beat=st.booleans(),
        data=st.data(),
    )
    def time_passes(self, intervals: int, ms: int, beat: bool, data: st.DataObject) -> None:
        """Time passes, some heartbeat intervals and some milliseconds; the runners' timer
        beats every interval meanwhile, and ``run_once`` waiting beats too, in between
        (``beat``)."""
        end = self.now + intervals * self.interval + ms % self.interval
        while self.last_beat + self.interval <= end:
            self._advance(self.last_beat + self.interval)
            self._beat()
        self._advance(end)
        if beat:
            self._beat()
        self._work(data)

    @precondition(lambda self: any(s.held for s in self.steps))
    @rule(data=st.data())
    def renewal_fails(self, data: st.DataObject) -> None:
        """A renewal (or a write of the step) found the lease lost: no more beats for it."""
        held = [s for s in self.steps if s.held]
        held[data.draw(st.integers(0, len(held) - 1), label="step")].held = False
        self._work(data)

    def _advance(self, to: int) -> None:
        for step in self.steps:
            expiry = step.locked_at + self.lock_timeout
            if self.extend and step.held and to >= expiry:
                raise LeaseExpiredWhileRunning(
                    f"a lease renewed at {step.locked_at} ms ran out at {expiry} ms, "
                    f"before the beat at {to} ms"
                )
        self.now = to

    def _beat(self) -> None:
        self.last_beat = self.now
        for step in list(self.steps):
            if not step.held:
                continue
            decision = heartbeat(
                START + timedelta(milliseconds=self.now),
                claimed_at=START + timedelta(milliseconds=step.claimed_at),
                locked_at=START + timedelta(milliseconds=step.locked_at),
                lock_timeout=self.lock_timeout / 1000,
                step_timeout=None if self.step_timeout is None else self.step_timeout / 1000,
                extend=self.extend,
            )
            ran = self.now - step.claimed_at
            due = self.step_timeout is not None and ran >= self.step_timeout
            if decision == "time_out":
                if not due:
                    raise TimeoutEarly(f"taken back after {ran} ms ({self.step_timeout})")
                self.steps.remove(step)
                self.sched.finished(StepOutcome.TIMED_OUT)
                self._work_may_appear()
                continue
            if due:
                raise TimeoutMissed(f"still running after {ran} ms ({self.step_timeout} ms)")
            if decision == "extend":
                renewed = self.now - step.locked_at
                if not self.extend or renewed < self.lock_timeout / 2:
                    raise RenewedNeedlessly(
                        f"renewed {renewed} ms after the last renewal (heartbeat={self.extend})"
                    )
                step.locked_at = self.now

    # -- what must hold after every event ------------------------------------------------

    @invariant()
    def capacity(self) -> None:
        if self.sched.busy != self._busy():
            raise BusyMiscounted(f"busy {self.sched.busy}, model {self._busy()}")
        if self._busy() > self.slots:
            raise OverCapacity(f"{self._busy()} of {self.slots} slots in use")

    @invariant()
    def quiet_when_over(self) -> None:
        over = (
            not self.reads
            and not self.steps
            and (
                self.stopping
                or (
                    all(i in self.idle for i in range(len(self.handlers)))
                    and not (self.probe_due and self.handlers)
                )
            )
        )
        if self.sched.quiet != over:
            raise QuietWrong(
                f"quiet={self.sched.quiet}: {len(self.reads)} read(s) out, "
                f"{len(self.steps)} step(s), stopping={self.stopping}, idle {sorted(self.idle)} "
                f"of {len(self.handlers)}, probe due={self.probe_due}"
            )


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
