"""A replica's books on their own (``orchestrator/runners/books.py``): each change of state
they make (registration, pauses, ticks, a worker's next action, a step's claim and end,
a carry's reservation, stop), the workers they spawn and the wake-ups they ask of the
crew. A fake crew records both; no thread, loop or database runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from orchestrator.core.lease_values import Outcome
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler, Registry, options
from orchestrator.core.scheduler import Claim, Found, Probe
from orchestrator.core.settings import Settings
from orchestrator.runners.books import LEAVE, Books
from orchestrator.runners.step import Step

pytestmark = pytest.mark.pure


class Crew:
    """The engine's workers as the books see them: spawns counted, wake-ups recorded."""

    def __init__(self) -> None:
        self.spawned = 0
        self.wakes: list[tuple[bool, bool]] = []  # (more_work, settling), in turn

    def spawn(self) -> None:
        self.spawned += 1

    def wake(self, *, more_work: bool, settling: bool) -> None:
        self.wakes.append((more_work, settling))

    def last(self) -> tuple[bool, bool]:
        return self.wakes[-1]


class Timer:
    """The ticks' timer as the books use it: jobs added, by id."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}

    def add_job(self, job: Any, trigger: str, **kwargs: Any) -> None:
        self.jobs[kwargs["id"]] = {"job": job, "trigger": trigger, **kwargs}


@dataclass
class Held:
    """What the books read of a step's lease."""

    id: int
    collection: str = "jobs"
    token: str = ""
    throttled: bool = False
    outcome: Outcome | None = None

    def __post_init__(self) -> None:
        self.token = self.token or f"token-{self.id}"


def step(doc_id: int, collection: str = "jobs") -> Step[Any]:
    return Step(Held(doc_id, collection))


def handlers(*filters: tuple[str, dict[str, Any]]) -> list[Handler]:
    registry = Registry(Settings())
    for n, (collection, match) in enumerate(filters):

        def func(lease: Any) -> None:
            return None

        func.__name__ = func.__qualname__ = f"handler_{n}"
        phase = match.get("phase")
        registry.add(
            func, collection, match, phase if isinstance(phase, str) else None, options({})
        )
    return list(registry.handlers)


def books_of(*registered: Handler, slots: int = 2, budget: int = 3) -> tuple[Books[Any], Crew]:
    books: Books[Any] = Books(slots, budget)
    crew = Crew()
    books.hire(crew)
    books.register(list(registered))
    return books, crew


def serving(*registered: Handler, slots: int = 2, budget: int = 3) -> tuple[Books[Any], Crew]:
    """Books serving (their first tick spawned the workers), the tick's probe answered:
    every handler has work."""
    books, crew = books_of(*registered, slots=slots, budget=budget)
    assert books.serve(Timer())
    probe = books.next_action()
    assert isinstance(probe, Probe)
    books.probed(probe, Found(frozenset(range(len(probe.handlers)))))
    return books, crew


def claim(books: Books[Any]) -> Claim:
    action = books.next_action()
    assert isinstance(action, Claim), action
    return action


def claims_now(books: Books[Any]) -> list[Handler]:
    """The handlers the free slots claim for now, one claim each until none is left."""
    claimed = []
    while isinstance(action := books.next_action(), Claim):
        claimed.append(action.handler)
    assert action is None, action
    return claimed


def by_handler(books: Books[Any], count: int) -> dict[Handler, Claim]:
    """The next ``count`` claims, by their handler (whose turn comes first varies by tick)."""
    actions = [claim(books) for _ in range(count)]
    return {a.handler: a for a in actions}


# -- ticks and workers ------------------------------------------------------------------------


def test_a_tick_spawns_workers_up_to_the_concurrency_and_wakes_everyone() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = books_of(jobs, slots=3)
    books.tick()
    assert crew.spawned == 3 and books.workers == 3
    assert crew.last() == (True, True)
    books.tick()  # the workers counted are still there: none is added
    assert crew.spawned == 3
    assert books.stats()["ticks"] == 2


def test_a_tick_with_no_handler_spawns_no_worker() -> None:
    books, crew = books_of()
    books.tick()
    assert crew.spawned == 0 and books.workers == 0
    assert books.once_over()


def test_a_tick_of_a_stopping_replica_spawns_no_worker() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = books_of(jobs)
    books.request_stop()
    books.tick()
    assert crew.spawned == 0


def test_a_worker_waits_while_serving_and_leaves_once_the_tick_is_over_otherwise() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs)
    empty = claim(books)
    books.claimed(empty, None)  # nothing found: the handler is idle for the tick
    assert books.next_action() is None  # serving: wait for the next tick or news
    assert books.workers == 2
    books.take_timer()  # no longer serving: the tick is over, so the workers leave
    assert books.next_action() is LEAVE
    assert books.workers == 1
    assert books.next_action() is LEAVE
    assert books.workers == 0
    assert crew.last() == (False, True)  # the last one out wakes the waiters of stop


def test_a_failed_worker_is_counted_its_error_kept_for_run_once_and_replaced_next_tick() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = books_of(jobs)
    books.begin_once()
    assert crew.spawned == 2
    boom = RuntimeError("a bug")
    books.worker_failed(boom)
    assert books.workers == 1
    assert books.stats()["tick_failures"] == 1
    assert crew.last()[0] is True  # another worker may take what it left
    assert books.end_once() == [boom]
    assert books.end_once() == []  # handed over once
    books.tick()
    assert crew.spawned == 3 and books.workers == 2


def test_begin_once_forgets_the_errors_of_the_run_before() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = books_of(jobs)
    books.tick()
    books.worker_failed(RuntimeError("before"))
    books.begin_once()
    assert books.end_once() == []


def test_a_cancelled_worker_leaves_the_count_only_when_it_was_counted() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = books_of(jobs)
    books.tick()
    books.worker_cancelled(counted=True)
    assert books.workers == 1
    books.worker_cancelled(counted=False)  # step_timeout had let it go already
    assert books.workers == 1
    assert crew.last()[0] is False


# -- pauses and refusals --------------------------------------------------------------------


def test_a_paused_handler_is_neither_probed_nor_claimed_for() -> None:
    jobs, mail = handlers(("jobs", {"phase": "Running"}), ("mail", {"phase": "Sending"}))
    books, _ = books_of(jobs, mail)
    books.pause(frozenset({jobs.key}))
    assert books.paused() == {jobs.key}
    books.tick()
    probe = books.next_action()
    assert isinstance(probe, Probe) and probe.handlers == (mail,)
    books.probed(probe, Found(frozenset({0})))
    assert claim(books).handler is mail


def test_resuming_a_handler_while_serving_tops_up_the_workers_and_wakes_them() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs)
    books.pause(frozenset({jobs.key}))
    books.worker_failed(RuntimeError("gone"))  # one worker short
    spawned = crew.spawned
    books.pause(frozenset())
    assert crew.spawned == spawned + 1
    assert crew.last() == (True, True)
    assert claim(books).handler is jobs


def test_resuming_a_handler_of_a_replica_that_does_not_serve_spawns_no_worker() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = books_of(jobs)
    books.pause(frozenset({jobs.key}))
    books.pause(frozenset())  # run_once's workers come with its own tick
    assert crew.spawned == 0 and books.workers == 0


def test_pausing_the_same_handlers_again_changes_nothing() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs)
    books.pause(frozenset({jobs.key}))
    before = (crew.spawned, len(crew.wakes))
    books.pause(frozenset({jobs.key}))
    assert (crew.spawned, len(crew.wakes)) == before


def test_refused_collections_stay_set_aside_whatever_operators_pause_or_resume() -> None:
    jobs, mail, audit = handlers(
        ("jobs", {"phase": "Running"}), ("mail", {"phase": "Sending"}), ("audit", {"phase": "New"})
    )
    books, _ = books_of(jobs, mail, audit)
    books.refuse("mail")
    books.refuse("audit")
    assert books.paused() == frozenset()  # not an operator's pause
    books.pause(frozenset({jobs.key}))
    books.pause(frozenset())  # operators resume everything: mail stays refused
    books.tick()
    probe = books.next_action()
    assert isinstance(probe, Probe) and probe.handlers == (jobs,)


# -- claims ---------------------------------------------------------------------------------


def test_a_claim_that_found_a_document_runs_its_step_and_wakes_another_worker() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs)
    action = claim(books)
    running = step(1)
    assert books.claimed(action, running) is False  # not stopping: it runs
    assert books.running() == [running]
    assert books.stats()["claimed"] == 1
    assert books.has_work()
    assert crew.last()[0] is True  # there may be more: another worker claims


def test_a_claim_that_found_nothing_frees_its_slot_and_wakes_no_one_for_work() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs, slots=1)
    books.claimed(claim(books), None)
    assert books.running() == [] and not books.has_work() and books.idle()
    assert crew.last()[0] is False
    assert "claimed" not in books.stats()


def test_a_claim_that_comes_back_once_stopping_is_handed_back() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs)
    action = claim(books)
    books.request_stop()
    assert books.stopping
    assert books.claimed(action, step(1)) is True


def test_a_document_claimed_past_its_budget_is_marked_throttled() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs, slots=1, budget=2)
    throttled = []
    for _ in range(3):  # the same document claimed three times in one tick
        again = step(7)
        books.claimed(claim(books), again)
        throttled.append(again.lease.throttled)
        books.finished(again, StepOutcome.UNLOCKED)
    assert throttled == [False, False, True]


def test_a_claim_that_broke_or_could_not_start_frees_its_slot() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs, slots=1)
    books.claim_broke(claim(books))
    assert books.idle()
    books.submitted("jobs", "Running")
    books.action_failed(claim(books))
    assert books.idle()
    assert books.stats()["claim_errors"] == 1


def test_a_probe_that_could_not_start_lets_the_claims_find_out() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = books_of(jobs)
    books.tick()
    probe = books.next_action()
    assert isinstance(probe, Probe)
    books.action_failed(probe)
    assert claim(books).handler is jobs


def test_a_probe_s_count_of_live_replicas_is_kept_until_the_next_one_counts() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = books_of(jobs)
    assert books.live is None
    books.tick()
    probe = books.next_action()
    assert isinstance(probe, Probe)
    books.probed(probe, Found(frozenset(), live=5))
    assert books.live == 5
    assert crew.last()[0] is False  # nothing ready: no worker has work
    books.tick()
    probe = books.next_action()
    assert isinstance(probe, Probe)
    books.probed(probe, Found(frozenset({0})))  # this one did not count
    assert books.live == 5
    assert crew.last()[0] is True


def test_a_submit_sends_idle_workers_claiming_at_once_without_a_probe() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs, slots=1)
    books.claimed(claim(books), None)
    assert books.next_action() is None  # idle until something happens
    books.submitted("jobs", "Running")
    assert crew.last() == (True, False)
    assert claim(books).handler is jobs


def test_a_submit_wakes_only_the_handlers_that_may_claim_its_document() -> None:
    first, second, mail = handlers(
        ("jobs", {"phase": "First"}), ("jobs", {"phase": "Second"}), ("mail", {"phase": "First"})
    )
    books, _ = serving(first, second, mail, slots=3)
    for action in by_handler(books, 3).values():
        books.claimed(action, None)  # every handler idle
    books.submitted("jobs", "First")
    assert claims_now(books) == [first]  # not Second's, not mail's: no claim in vain


def test_a_lent_step_runs_before_any_claim_in_the_slot_its_lend_took() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs, slots=1)
    books.claimed(claim(books), None)  # idle: nothing found
    assert books.lend("jobs", "Running") is jobs
    assert books.lend("jobs", "Running") is None  # the one slot is taken
    lent = step(1)
    books.lent(lent)
    assert crew.last()[0] is True
    assert books.running() == [lent]  # on the books: the heartbeat keeps its lease
    assert books.next_action() is lent
    assert books.next_action() is None
    books.finished(lent, StepOutcome.ADVANCED)
    assert books.idle()
    assert books.stats()["lent"] == 1


def test_nothing_is_lent_into_a_phase_no_plain_handler_selects_or_off_duty() -> None:
    jobs, filtered = handlers(
        ("jobs", {"phase": "Running"}), ("jobs", {"phase": "Filtered", "kind": "x"})
    )
    books, _ = books_of(jobs, filtered, slots=2)
    assert books.lend("jobs", "Running") is None  # not serving: run_once has no worker then
    books, _ = serving(jobs, filtered, slots=2)
    assert books.lend("jobs", "Filtered") is None  # the server's to judge
    assert books.lend("jobs", "Elsewhere") is None
    books.request_stop()
    assert books.lend("jobs", "Running") is None


def test_a_lend_given_back_frees_its_slot_and_wakes_the_existing_document_s_handler() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs, slots=1)
    books.claimed(claim(books), None)
    assert books.lend("jobs", "Running") is jobs
    books.unlent("jobs", "Running")  # its key existed, in Running
    assert books.idle()
    assert claim(books).handler is jobs


def test_a_lent_step_timed_out_while_it_waited_is_not_run() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs, slots=1)
    books.claimed(claim(books), None)
    assert books.lend("jobs", "Running") is jobs
    lent = step(1)
    books.lent(lent)
    assert books.timed_out(lent, lambda _step: False)
    assert books.next_action() is not lent


def test_a_freed_slot_of_a_global_limit_wakes_a_worker_only_for_a_limited_handler() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs, slots=1)
    wakes = len(crew.wakes)
    books.slot_freed(jobs)  # not limited: nothing to wake for
    assert len(crew.wakes) == wakes
    action = claim(books)
    books.limited(jobs)
    books.claimed(action, None)
    assert books.next_action() is None
    books.slot_freed(jobs)
    assert crew.last()[0] is True
    assert claim(books).handler is jobs


def test_a_due_time_is_scheduled_on_the_timer_only_while_serving_the_latest_replacing() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = books_of(jobs)
    wake = functools.partial(books.came_due, (jobs,))
    books.due_in(0.5, wake)  # not serving: no timer to ask
    timer = Timer()
    before = datetime.now(UTC)
    books.serve(timer)
    books.due_in(0.5, wake)
    books.due_in(0.25, wake, name="limits")
    assert set(timer.jobs) == {"due", "limits"}
    job = timer.jobs["due"]
    assert job["trigger"] == "date" and job["replace_existing"] is True
    assert job["run_date"] > before
    assert job["job"] is wake


def test_a_due_time_come_sends_its_handlers_claiming_without_a_probe() -> None:
    jobs, other = handlers(("jobs", {"phase": "Running"}), ("jobs", {"phase": "Waiting"}))
    books, crew = serving(jobs, other, slots=2)
    for _ in range(2):
        books.claimed(claim(books), None)
    assert books.next_action() is None  # both idle
    books.came_due([other])
    assert crew.last() == (True, True)
    action = books.next_action()
    assert isinstance(action, Claim) and action.handler is other
    assert books.next_action() is None  # jobs.Running stays idle: nothing came due for it


# -- a step's end ---------------------------------------------------------------------------


def test_a_finished_step_is_counted_by_its_outcome_and_leaves_the_running() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs)
    running = step(1)
    books.claimed(claim(books), running)
    assert books.finished(running, StepOutcome.ADVANCED) is True
    assert books.running() == []
    assert books.stats()["advanced"] == 1
    assert crew.last()[0] is False  # its own worker takes the next action


def test_a_carried_step_keeps_the_slot_and_runs_in_its_place() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs, slots=1)
    first, carried = step(1), step(1)
    carried.lease.token = "carried"
    books.claimed(claim(books), first)
    assert books.finished(first, StepOutcome.ADVANCED, carried) is True
    assert books.running() == [carried]
    assert books.stats()["carried"] == 1
    assert not books.idle()  # its slot went on with it
    assert books.next_action() is None  # and no claim takes it meanwhile


def test_a_release_into_a_phase_no_handler_here_selects_wakes_no_idle_handler() -> None:
    jobs, mail = handlers(("jobs", {"phase": "Running"}), ("mail", {"phase": "Sending"}))
    books, _ = serving(jobs, mail, slots=2)
    claims = by_handler(books, 2)
    running = step(1)
    books.claimed(claims[jobs], running)
    books.claimed(claims[mail], None)  # nothing there: mail is idle for the tick
    running.lease.outcome = Outcome(StepOutcome.ADVANCED, "Done")
    books.finished(running, StepOutcome.ADVANCED)
    assert set(claims_now(books)) == {jobs}  # "Done" is nobody's here: mail stays idle


def test_a_release_into_a_phase_another_handler_selects_wakes_it() -> None:
    jobs, mail = handlers(("jobs", {"phase": "Running"}), ("jobs", {"phase": "Sending"}))
    books, _ = serving(jobs, mail, slots=2)
    claims = by_handler(books, 2)
    running = step(1)
    books.claimed(claims[jobs], running)
    books.claimed(claims[mail], None)  # nothing in Sending yet: idle for the tick
    running.lease.outcome = Outcome(StepOutcome.ADVANCED, "Sending")
    books.finished(running, StepOutcome.ADVANCED)
    assert set(claims_now(books)) == {jobs, mail}


@pytest.mark.parametrize("outcome", [StepOutcome.LOST, StepOutcome.DONE])
def test_an_end_whose_phase_is_not_known_here_wakes_every_idle_handler(
    outcome: StepOutcome,
) -> None:
    jobs, mail = handlers(("jobs", {"phase": "Running"}), ("mail", {"phase": "Sending"}))
    books, _ = serving(jobs, mail, slots=2)
    claims = by_handler(books, 2)
    running = step(1)
    books.claimed(claims[jobs], running)
    books.claimed(claims[mail], None)
    # Its release said "Done", but the document was changed since (lost), or the handler
    # wrote its outcome itself (done): where it is now is not known here.
    running.lease.outcome = Outcome(StepOutcome.ADVANCED, "Done")
    books.finished(running, outcome)
    assert set(claims_now(books)) == {jobs, mail}


def test_a_step_timed_out_frees_its_slot_and_a_fresh_worker_takes_its_place() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs, slots=1)
    running = step(1)
    books.claimed(claim(books), running)
    spawned = crew.spawned
    let_go: list[Step[Any]] = []

    def uncounted(late: Step[Any]) -> bool:
        let_go.append(late)
        return True

    assert books.timed_out(running, uncounted) is True
    assert let_go == [running] and running.abandoned
    assert books.running() == [] and books.idle()
    assert books.stats()["timed_out"] == 1
    assert crew.spawned == spawned + 1 and books.workers == 1
    # The step returns later: counted once, by the time-out.
    assert books.finished(running, StepOutcome.UNLOCKED) is False
    assert "unlocked" not in books.stats()


def test_a_step_timed_out_whose_worker_still_counts_spawns_no_one() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs, slots=1)
    running = step(1)
    books.claimed(claim(books), running)
    spawned = crew.spawned
    assert books.timed_out(running, lambda s: False) is True
    assert crew.spawned == spawned and books.workers == 1


def test_a_step_over_already_is_not_timed_out() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs, slots=1)
    running = step(1)
    books.claimed(claim(books), running)
    books.finished(running, StepOutcome.UNLOCKED)
    assert books.timed_out(running, lambda s: True) is False
    assert "timed_out" not in books.stats()
    assert books.workers == 1


def test_a_cancelled_step_leaves_the_books_once_counted_interrupted() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs, slots=1)
    running = step(1)
    books.claimed(claim(books), running)
    assert books.cancelled(running) is True
    assert books.cancelled(running) is False
    assert books.running() == [] and books.idle()
    assert books.stats()["interrupted"] == 1


def test_waiters_are_woken_once_the_replica_may_have_settled_not_at_every_step() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs, slots=2)
    one, two = step(1), step(2)
    books.claimed(claim(books), one)
    books.claimed(claim(books), two)  # the first found one: the handler claims on
    books.finished(one, StepOutcome.UNLOCKED)
    assert crew.last() == (False, False)  # the other still runs: nothing settled
    books.request_stop()
    assert crew.last() == (True, True)
    books.finished(two, StepOutcome.UNLOCKED)
    assert crew.last() == (False, True)  # stopping and nothing runs: stop may return


# -- carrying a lease on --------------------------------------------------------------------


def test_a_carry_goes_to_the_handler_of_exactly_that_phase_within_the_budget() -> None:
    running, sending = handlers(("jobs", {"phase": "Running"}), ("jobs", {"phase": "Sending"}))
    books, _ = books_of(running, sending, budget=2)
    books.tick()
    held: Any = Held(1)  # what the books read of a LeaseCore
    assert books.reserve(held, "Sending") is sending
    assert books.reserve(held, "Running") is running
    assert books.reserve(held, "Sending") is None  # budget spent
    books.tick()
    assert books.reserve(held, "Sending") is sending


def test_no_carry_into_a_phase_no_plain_handler_selects_or_while_stopping() -> None:
    registered = handlers(
        ("jobs", {"phase": "Running"}), ("jobs", {"phase": "Sending", "urgent": True})
    )
    books, _ = books_of(*registered)
    books.tick()
    held: Any = Held(1)  # what the books read of a LeaseCore
    assert books.reserve(held, "Sending") is None  # the server's to judge
    assert books.reserve(held, "Unknown") is None
    assert books.reserve(cast(Any, Held(1, "mail")), "Running") is None
    books.request_stop()
    assert books.reserve(held, "Running") is None


def test_no_carry_for_a_paused_handler() -> None:
    (running,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = books_of(running)
    books.pause(frozenset({running.key}))
    assert books.reserve(cast(Any, Held(1)), "Running") is None


# -- serving and stopping -------------------------------------------------------------------


def test_serving_starts_once_with_a_tick_and_resumes_a_stopped_replica() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = books_of(jobs)
    books.request_stop()
    timer = Timer()
    assert books.serve(timer) is True
    assert books.timer is timer and not books.stopping
    assert books.stats()["ticks"] == 1 and crew.spawned == 2
    assert books.serve(Timer()) is False
    assert books.timer is timer


def test_taking_the_timer_stops_serving_and_hands_it_over_once() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = books_of(jobs)
    timer = Timer()
    books.serve(timer)
    assert books.take_timer() is timer
    assert books.take_timer() is None and books.timer is None
    assert books.serve(Timer()) is True  # it may start again


def test_a_stop_claims_nothing_more_and_wakes_everyone() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, crew = serving(jobs)
    books.request_stop()
    assert books.stopping
    assert crew.last() == (True, True)
    assert books.next_action() is LEAVE  # not serving, nothing runs: the workers go
    assert not books.once_over(), "over once every worker has left, not before"
    assert books.next_action() is LEAVE
    assert books.once_over()


def test_run_once_runs_its_tick_on_a_stopped_replica() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = books_of(jobs)
    books.request_stop()
    books.begin_once()
    assert not books.stopping
    assert isinstance(books.next_action(), Probe)


def test_the_stop_report_names_leases_handed_back_and_steps_still_running() -> None:
    (jobs,) = handlers(("jobs", {"phase": "Running"}))
    books, _ = serving(jobs)
    books.claimed(claim(books), step(1))
    books.released_on_stop("jobs/2")
    report = books.stop_report()
    assert report.released == ["jobs/2"]
    assert report.still_running == ["jobs/1"]
    books.take_timer()
    books.serve(Timer())  # a new start forgets the last stop's
    assert books.stop_report().released == []


def test_counters_add_up_and_are_read_as_a_copy() -> None:
    books, _ = books_of()
    books.count("extended", 3)
    books.count("extended")
    stats = books.stats()
    stats["extended"] = 0
    assert books.stats() == {"extended": 4}


def test_steps_are_numbered_in_turn() -> None:
    books, _ = books_of()
    assert [books.next_number() for _ in range(3)] == [1, 2, 3]


def test_books_without_a_crew_say_so() -> None:
    books: Books[Any] = Books(1, 1)
    with pytest.raises(RuntimeError, match="no crew"):
        books.tick()


# -- run_once's tick --------------------------------------------------------------------------


def test_run_once_s_tick_is_over_only_when_its_workers_have_left() -> None:
    """The probe found nothing: nothing is left to claim, but the tick's worker has not
    left yet. A submit's wake reaches that worker, which claims: were run_once to return
    there, the step would run after it, outside any run_once, and the next run_once would
    count nothing."""
    (jobs,) = handlers(("jobs", {"phase": "A"}))
    books, _ = books_of(jobs, slots=1, budget=100)
    books.begin_once()
    probe = books.next_action()
    assert isinstance(probe, Probe)
    books.probed(probe, Found(frozenset()))
    assert not books.once_over()

    books.submitted("jobs", "A")
    assert not books.once_over()
    books.claimed(claim(books), None)
    assert books.next_action() is LEAVE
    assert books.once_over()


def test_a_tick_with_every_worker_failed_is_over() -> None:
    """run_once raises the workers' errors rather than wait for work nobody will take."""
    (jobs,) = handlers(("jobs", {"phase": "A"}))
    books, _ = books_of(jobs, slots=1, budget=100)
    books.begin_once()
    assert isinstance(books.next_action(), Probe)
    books.worker_failed(RuntimeError("a bug"))
    assert books.once_over()
