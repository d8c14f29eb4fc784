"""The scheduling core on its own: no database, no thread, no event loop. Each test feeds
it what happened and checks what it decides."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.core.limits import limits_of
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler
from orchestrator.core.scheduler import (
    DUE_WAKERS,
    Claim,
    Found,
    Probe,
    Scheduler,
    heartbeat,
    wakes_at_due,
)
from orchestrator.core.settings import Settings

pytestmark = pytest.mark.pure

SETTINGS = Settings()


def _handler(collection: str, phase: str) -> Handler:
    def func(lease: Any) -> None:
        return None

    return Handler(
        func=func,
        collection=collection,
        match={"phase": phase},
        phase=phase,
        model=None,
        max_attempts=5,
        failed_phase="Failed",
        relock_policy=SETTINGS.relock_policy,
        retry_policy=SETTINGS.retry_policy,
        name=f"{collection}.{phase}",
    )


def _scheduler(*handlers: Handler, slots: int = 4, budget: int = 100) -> Scheduler:
    """Ticked, its probe answered: every collection has work."""
    sched = Scheduler(list(handlers), max_concurrency=slots, budget=budget)
    _tick(sched)
    return sched


def _tick(sched: Scheduler, found: set[str] | None = None) -> Probe:
    """A tick, and its probe answered: ``found`` (every probed collection by default)."""
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe)
    have = set(probe.collections) if found is None else found
    sched.probed(probe, _found(probe, have))
    return probe


def _found(probe: Probe, collections: set[str]) -> Found:
    """Every handler of ``collections`` has work: those the probe asked about (as a store
    answers: never a handler ``known`` to have work)."""
    ready = {
        n
        for n, h in enumerate(probe.handlers)
        if h.collection in collections and n not in probe.known
    }
    return Found(frozenset(ready))


def test_a_tick_probes_every_collection_once_and_claims_nothing_before_its_answer() -> None:
    a, b, c = _handler("jobs", "A"), _handler("jobs", "B"), _handler("other", "C")
    sched = Scheduler([a, b, c], max_concurrency=4, budget=100)
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe) and probe.handlers == (a, b, c)
    assert probe.collections == ("jobs", "other")
    assert [name for name, _ in probe.groups()] == ["jobs", "other"]
    assert Probe.of([c, a, b], 0).handlers == (c, a, b)
    assert Probe.of([a, c, b], 0).handlers == (a, b, c)  # numbered by collection
    assert sched.next() is None and not sched.quiet  # the claims wait for the answer
    sched.probed(probe, _found(probe, {"other"}))
    claim = sched.next()
    assert isinstance(claim, Claim) and claim.handler is c  # only where there is work
    assert sched.next() is None
    sched.claimed(claim, None)
    assert sched.quiet


def test_an_idle_tick_sends_one_probe_and_no_claim() -> None:
    handlers = [_handler(f"c{n}", p) for n in range(5) for p in ("A", "B")]
    sched = Scheduler(handlers, max_concurrency=4, budget=100)
    for _ in range(3):
        _tick(sched, found=set())
        assert sched.next() is None and sched.quiet


def test_a_due_time_wakes_its_handlers_claims_without_a_probe_and_keeps_the_budgets() -> None:
    # A probe per due time made a replica probe as often as documents came due (a relock
    # storm: 12 probes a second per replica on the wire server); now only the handlers
    # that may claim what came due claim, and nothing is probed before the next tick.
    a, b = _handler("jobs", "A"), _handler("jobs", "B")
    sched = _scheduler(a, b, budget=1)
    for _ in range(2):
        claim = sched.next()
        assert isinstance(claim, Claim)
        sched.claimed(claim, None)
    assert sched.quiet
    sched.came_due([a])
    again = sched.next()
    assert isinstance(again, Claim) and again.handler is a
    assert sched.next() is None  # jobs.B stays idle, and no probe is sent
    assert sched.claimed(again, "doc-1") is False
    sched.finished(StepOutcome.RELOCKED)
    sched.came_due([a])
    once_more = sched.next()
    assert isinstance(once_more, Claim)
    assert sched.claimed(once_more, "doc-1") is True  # the same tick: its budget is spent


def test_a_lone_handler_idles_when_its_claim_finds_nothing() -> None:
    a = _handler("jobs", "A")
    sched = _scheduler(a)
    action = sched.next()
    assert isinstance(action, Claim) and action.handler is a
    assert sched.next() is None  # not known to have work: one claim at a time
    assert sched.claimed(action, None) is False
    assert sched.next() is None and sched.quiet


def test_a_handler_with_work_gets_every_free_slot() -> None:
    a = _handler("jobs", "A")
    sched = _scheduler(a, slots=3)
    first = sched.next()
    assert isinstance(first, Claim)
    sched.claimed(first, "doc-1")  # found work: the handler is hot
    claims = [sched.next(), sched.next()]
    assert all(isinstance(c, Claim) for c in claims)
    assert sched.next() is None  # three slots in use
    sched.finished(StepOutcome.ADVANCED)
    assert isinstance(sched.next(), Claim)  # a finished step frees its slot at once


@pytest.mark.parametrize("outcome", list(StepOutcome), ids=str)
def test_a_step_that_frees_work_wakes_an_idle_handler_and_no_other_does(
    outcome: StepOutcome,
) -> None:
    a = _handler("jobs", "A")
    sched = _scheduler(a, slots=2)
    first = sched.next()
    assert isinstance(first, Claim)
    sched.claimed(first, "doc-1")  # its step runs
    second = sched.next()
    assert isinstance(second, Claim)
    sched.claimed(second, None)  # nothing else to claim: idle until something happens
    assert sched.next() is None
    sched.finished(outcome)
    assert sched.busy == 0, "every outcome frees its slot"
    if outcome.frees_work:
        assert isinstance(sched.next(), Claim), f"after {outcome} something may be claimable"
    else:
        assert sched.next() is None and sched.quiet, f"{outcome} leaves the handler idle"


def test_a_failed_probe_lets_the_claims_find_out() -> None:
    a, b = _handler("jobs", "A"), _handler("jobs", "B")
    sched = Scheduler([a, b], max_concurrency=4, budget=100)
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe)
    sched.probed(probe, None)
    handlers = set()
    for _ in range(2):
        action = sched.next()
        assert isinstance(action, Claim)
        handlers.add(action.handler.name)
    assert handlers == {"jobs.A", "jobs.B"}


def test_a_probe_that_raced_with_a_new_tick_idles_no_one() -> None:
    # Found by the randomized test: a probe sent in one tick that answered "nothing" in
    # the next idled its handlers for that whole tick, so work due at the new tick (due
    # relocks, expired leases) waited a tick more, and run_once ended having done nothing.
    a, b = _handler("jobs", "A"), _handler("jobs", "B")
    sched = Scheduler([a, b], max_concurrency=4, budget=100)
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe)
    sched.tick()  # the probe read before this tick began
    sched.probed(probe, Found(frozenset()))
    assert not sched.quiet
    again = sched.next()
    assert isinstance(again, Probe)  # the new tick's own look


def test_a_probe_that_raced_with_freed_work_idles_no_one() -> None:
    a, b, c = _handler("jobs", "A"), _handler("jobs", "B"), _handler("other", "C")
    sched = Scheduler([a, b, c], max_concurrency=4, budget=100)
    _tick(sched, found={"other"})
    step = sched.next()
    assert isinstance(step, Claim) and step.handler is c
    sched.claimed(step, "doc-1")
    sched.due()
    probe = sched.next()
    assert isinstance(probe, Probe)
    sched.finished(StepOutcome.ADVANCED)  # may have made work for jobs.A or jobs.B after the read
    sched.probed(probe, Found(frozenset()))
    found = {sched.next(), sched.next()}
    assert {x.handler.name for x in found if isinstance(x, Claim)} >= {"jobs.A", "jobs.B"}


def test_a_probe_that_finds_work_wakes_handlers_idle_since_an_earlier_answer() -> None:
    a = _handler("jobs", "A")
    sched = Scheduler([a], max_concurrency=4, budget=100)
    _tick(sched, found=set())
    assert sched.quiet
    sched.due()
    _probe = sched.next()
    assert isinstance(_probe, Probe)
    sched.probed(_probe, _found(_probe, {"jobs"}))
    assert isinstance(sched.next(), Claim)


def test_freed_work_and_local_submits_wake_idle_handlers() -> None:
    a = _handler("jobs", "A")
    sched = _scheduler(a)
    claim = sched.next()
    assert isinstance(claim, Claim)
    sched.claimed(claim, None)
    assert sched.next() is None
    sched.came_due([a])  # a local submit of a document it may claim
    assert isinstance(sched.next(), Claim)


def test_a_claim_that_raced_with_freed_work_does_not_idle_its_handler() -> None:
    a = _handler("jobs", "A")
    sched = _scheduler(a, slots=2)
    hot = sched.next()
    assert isinstance(hot, Claim)
    sched.claimed(hot, "doc-1")
    racing = sched.next()  # issued before the step below frees work
    assert isinstance(racing, Claim)
    sched.finished(StepOutcome.UNLOCKED)
    sched.claimed(racing, None)  # found nothing, but it asked before the change
    assert isinstance(sched.next(), Claim)


def test_the_budget_throttles_a_document_claimed_too_often_in_one_tick() -> None:
    a = _handler("jobs", "A")
    sched = _scheduler(a, budget=3)
    throttled = []
    for _ in range(5):
        claim = sched.next()
        assert isinstance(claim, Claim)
        throttled.append(sched.claimed(claim, "doc-1"))
        sched.finished(StepOutcome.UNLOCKED)
    assert throttled == [False, False, False, True, True]
    _tick(sched)
    claim = sched.next()
    assert isinstance(claim, Claim)
    assert sched.claimed(claim, "doc-1") is False  # a new tick, a new budget


def test_each_tick_starts_with_another_handler() -> None:
    handlers = [_handler(f"c{n}", "A") for n in range(3)]
    sched = Scheduler(handlers, max_concurrency=1, budget=100)
    firsts = []
    for _ in range(3):
        _tick(sched)
        claim = sched.next()
        assert isinstance(claim, Claim)
        firsts.append(claim.handler.collection)
        sched.claimed(claim, None)
        while (rest := sched.next()) is not None:
            assert isinstance(rest, Claim)
            sched.claimed(rest, None)
    assert sorted(firsts) == ["c0", "c1", "c2"]


def test_a_stop_claims_nothing_more_and_is_quiet_once_steps_end() -> None:
    a = _handler("jobs", "A")
    sched = _scheduler(a)
    claim = sched.next()
    assert isinstance(claim, Claim)
    sched.claimed(claim, "doc-1")
    sched.stop()
    assert sched.next() is None
    assert not sched.quiet  # a step still runs
    sched.finished(StepOutcome.RELEASED)
    assert sched.quiet
    sched.resume()
    _tick(sched)
    assert isinstance(sched.next(), Claim)


def test_heartbeat_extends_past_half_the_lease_and_times_out_past_step_timeout() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def decide(elapsed: float, since_renewal: float, *, extend: bool = True) -> Any:
        return heartbeat(
            t0 + timedelta(seconds=elapsed),
            claimed_at=t0,
            locked_at=t0 + timedelta(seconds=elapsed - since_renewal),
            lock_timeout=30,
            step_timeout=300,
            extend=extend,
        )

    assert decide(10, 10) is None
    assert decide(15, 15) == "extend"
    assert decide(15, 15, extend=False) is None
    assert decide(200, 5) is None
    assert decide(300, 5) == "time_out"


def test_a_probe_tells_which_handlers_of_a_collection_have_work() -> None:
    a, b = _handler("jobs", "A"), _handler("jobs", "B")
    sched = Scheduler([a, b], max_concurrency=4, budget=100)
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe)
    sched.probed(probe, Found(frozenset({probe.handlers.index(b)})))
    claim = sched.next()
    assert isinstance(claim, Claim) and claim.handler is b
    assert sched.next() is None  # jobs.A has nothing: no claim in vain


def test_a_busy_replicas_probe_asks_only_about_handlers_not_known_to_have_work() -> None:
    # Under load every handler's claims keep taking documents: a tick's probe asking each
    # of them again was the wire server's costliest read per step (a scan per handler on a
    # server that plans no query), and told nothing their claims did not.
    a, b = _handler("jobs", "A"), _handler("jobs", "B")
    sched = Scheduler([a, b], max_concurrency=4, budget=100)
    sched.tick()
    first = sched.next()
    assert isinstance(first, Probe) and first.known == frozenset()
    sched.probed(first, Found(frozenset({first.handlers.index(a)})))
    claim = sched.next()
    assert isinstance(claim, Claim) and claim.handler is a
    sched.claimed(claim, "doc-1")
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe) and probe.known == {probe.handlers.index(a)}
    assert probe.asked("jobs") == (b,)
    during = sched.next()  # jobs.A claims while the probe is out
    assert isinstance(during, Claim) and during.handler is a
    sched.claimed(during, None)  # ...and finds nothing: idle, though the probe never asked
    sched.probed(probe, Found(frozenset()))
    assert sched.next() is None


def test_a_few_replicas_of_a_fleet_wake_at_a_due_time_not_all() -> None:
    assert wakes_at_due(None, 0.99) and wakes_at_due(DUE_WAKERS, 0.99)  # small or unknown
    draws = [n / 1000 for n in range(1000)]
    woken = sum(wakes_at_due(200, d) for d in draws)
    assert woken == 1000 * DUE_WAKERS // 200  # on average DUE_WAKERS of 200


def test_probes_slower_than_the_tick_never_hold_the_claims_back() -> None:
    # On a saturated server a probe took longer than a tick: every answer came after the
    # next tick, was dropped as stale, and the tick's own probe went first again, so no
    # replica claimed anything for tens of seconds while every document waited, due.
    a, b = _handler("jobs", "A"), _handler("other", "B")
    sched = Scheduler([a, b], max_concurrency=4, budget=100)
    sched.tick()
    for _ in range(3):
        probe = sched.next()
        assert isinstance(probe, Probe)
        sched.tick()  # the next tick comes before the answer
        sched.probed(probe, _found(probe, {"jobs"}))
        claim = sched.next()
        assert isinstance(claim, Claim) and claim.handler is a  # what the answer found...
        again = sched.next()
        assert isinstance(again, Probe)  # ...and the new tick's own look meanwhile
        more = sched.next()  # jobs.A again once a claim of it took a document
        assert more is None or (isinstance(more, Claim) and more.handler is a)
        sched.claimed(claim, "doc-1")
        if more is not None:
            sched.claimed(more, "doc-2")
            sched.finished(StepOutcome.UNLOCKED)
        sched.finished(StepOutcome.UNLOCKED)
        sched.tick()
        sched.probed(again, _found(again, {"jobs"}))
        owed = sched.next()  # what that answer found is claimed before the next probe
        assert isinstance(owed, Claim) and owed.handler is a
        sched.claimed(owed, "doc-3")
        sched.finished(StepOutcome.UNLOCKED)


def test_a_replica_of_one_worker_claims_what_a_late_answer_found_before_probing_again() -> None:
    # With one worker and probes slower than the tick, each answer found work, yet the
    # worker's next action was the next tick's probe, never the claim: the replica ran no
    # step at all while the others of its fleet worked.
    a, b = _handler("jobs", "A"), _handler("jobs", "B")
    sched = Scheduler([a, b], max_concurrency=1, budget=100)
    sched.tick()
    probe = sched.next()
    assert isinstance(probe, Probe)
    sched.tick()
    sched.probed(probe, Found(frozenset({probe.handlers.index(a)})))
    claim = sched.next()
    assert isinstance(claim, Claim) and claim.handler is a
    sched.claimed(claim, "doc-1")
    sched.finished(StepOutcome.ADVANCED)
    assert isinstance(sched.next(), Probe)  # the claim was made: the tick's probe now


def test_a_submit_is_lent_a_free_slot_only_when_no_work_of_its_handler_is_known() -> None:
    """A local submit may create its document leased to a free slot: not when every slot
    is taken, nor when its handler is known to have work waiting (that goes first, as a
    claim would take it), nor for a paused or limited handler, nor while stopping."""
    idle, other = _handler("jobs", "A"), _handler("jobs", "B")
    sched = _scheduler(idle, other, slots=2)
    sched.probed(Probe.of([idle, other], 99), Found(frozenset({1})))  # B has work, A none
    assert sched.lend(other) is False
    assert sched.lend(idle) is True
    assert sched.busy == 1
    assert sched.lend(idle) is True
    assert sched.lend(idle) is False  # both slots taken
    sched.unlent()
    assert sched.busy == 1
    sched.pause(frozenset({idle.key}))
    assert sched.lend(idle) is False
    sched.pause(frozenset())
    limited = replace(idle, key="limited", limits=limits_of(1, None))
    sched.register([idle, other, limited])
    assert sched.lend(limited) is False
    sched.stop()
    assert sched.lend(idle) is False
    assert sched.lend(_handler("jobs", "Elsewhere")) is False  # not this replica's


def test_a_lent_slot_given_back_is_free_for_a_claim() -> None:
    """The document was not created leased (its key existed): the slot is free again."""
    handler = _handler("jobs", "A")
    sched = Scheduler([handler], max_concurrency=1, budget=100)
    _tick(sched, found=set())
    assert sched.lend(handler) is True
    assert sched.next() is None  # the one slot is the lent step's
    sched.unlent()
    sched.came_due([handler])
    assert isinstance(sched.next(), Claim)
