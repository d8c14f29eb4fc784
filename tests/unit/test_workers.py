"""The engines' worker primitives on their own (``orchestrator/runners/workers.py``): the
event loop an ``AsyncWorkers`` binds to and when it moves or refuses to, how a worker's or
a step's end is read from its exception and its task, the wake-ups of workers and of the
waiters of ``run_once`` and ``stop``, and the timer's job defaults; ``Workers``, their
threaded twins, alike. Books with no handler, or one, stand in for the replica.

``HANG_GUARD`` bounds a thread's join, so a regression fails instead of hanging the
suite: it measures nothing."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from apscheduler.schedulers.base import BaseScheduler

from orchestrator import OrchestratorError
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Registry, options
from orchestrator.core.scheduler import Action, Claim, Probe
from orchestrator.core.settings import Settings
from orchestrator.runners.books import LEAVE, Books, Leave
from orchestrator.runners.step import Step
from orchestrator.runners.workers import TIMER_DEFAULTS, AsyncWorkers, StepEnd, WorkerEnd, Workers

HANG_GUARD = 30.0
"""Seconds a thread may take before the test calls it hung (a bound, not a timing)."""


class Held:
    """What the books read of a step's lease."""

    def __init__(self, doc_id: int) -> None:
        self.id = doc_id
        self.collection = "jobs"
        self.token = f"token-{doc_id}"
        self.throttled = False
        self.outcome = None


class Watched(Books[Any]):
    """Books that say when a worker found nothing to do (it is about to wait for news)."""

    def __init__(self, asked: Callable[[], object]) -> None:
        super().__init__(2, 3)
        self._asked = asked

    def next_action(self) -> Action | Leave | None:
        got = super().next_action()
        if got is None:
            self._asked()
        return got


class Scripted(Books[Any]):
    """Books whose next actions are ``answers``, in turn; ``asked`` is called on a None
    (the worker is about to wait for news)."""

    def __init__(self, answers: list[Action | Leave | None], asked: Callable[[], object]) -> None:
        super().__init__(1, 1)
        self._answers = answers
        self._asked = asked

    def next_action(self) -> Action | Leave | None:
        got = self._answers.pop(0)
        if got is None:
            self._asked()
        return got


def job(lease: Any) -> None:
    return None


def with_handler(books: Books[Any]) -> None:
    registry = Registry(Settings())
    registry.add(job, "jobs", {"phase": "Running"}, "Running", options({}))
    books.register(list(registry.handlers))


async def nothing() -> None:
    """A worker's work that ends at once (these tests take the actions themselves)."""


def async_crew(books: Books[Any] | None = None, name: str = "pod-1") -> AsyncWorkers:
    books = books if books is not None else Books(1, 1)
    crew = AsyncWorkers(books, nothing, name)
    books.hire(crew)
    return crew


def threaded_crew(books: Books[Any] | None = None, name: str = "pod-1") -> Workers:
    books = books if books is not None else Books(1, 1)
    crew = Workers(books, lambda: None, name)
    books.hire(crew)
    return crew


class FakeTimer:
    """A timer the books hold while started (never run here)."""

    def add_job(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("no job is scheduled here")


def enter_on(loop: asyncio.AbstractEventLoop, crew: AsyncWorkers) -> None:
    async def enter() -> None:
        crew.enter()

    loop.run_until_complete(enter())


@contextmanager
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of its own, stopped and closed at the end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="other-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(HANG_GUARD)
        assert not thread.is_alive()
        loop.close()


# -- the event loop of an AsyncWorkers ------------------------------------------------------


def test_the_workers_follow_the_replica_to_a_new_loop_once_the_first_one_ended() -> None:
    crew = async_crew()
    asyncio.run(_enter(crew))
    asyncio.run(_enter(crew))  # the first loop is closed and left nothing: it moves


def test_a_call_from_another_loop_is_refused_while_the_first_runs() -> None:
    crew = async_crew()
    with running_loop() as other:
        asyncio.run_coroutine_threadsafe(_enter(crew), other).result(HANG_GUARD)
        with pytest.raises(OrchestratorError, match="still running"):
            asyncio.run(_enter(crew))
    asyncio.run(_enter(crew))  # stopped with nothing on it: it moves then


def test_work_left_on_a_stopped_loop_refuses_a_move_until_it_is_done() -> None:
    books: Books[Any] = Books(1, 1)
    crew = async_crew(books)
    with_handler(books)
    first = asyncio.new_event_loop()
    try:
        enter_on(first, crew)
        claim = books.next_action()
        assert isinstance(claim, Claim)
        running: Step[Any] = Step(Held(1))
        books.claimed(claim, running)
        with pytest.raises(OrchestratorError, match="stopped but not closed"):
            asyncio.run(_enter(crew))
        books.finished(running, StepOutcome.UNLOCKED)
        asyncio.run(_enter(crew))
    finally:
        first.close()


def test_a_loop_closed_with_the_replica_s_work_on_it_refuses_a_move() -> None:
    books: Books[Any] = Books(1, 1)
    crew = async_crew(books)
    with_handler(books)
    first = asyncio.new_event_loop()
    enter_on(first, crew)
    assert isinstance(books.next_action(), Claim)  # a claim in flight: its slot is in use
    first.close()
    with pytest.raises(OrchestratorError, match="closed with its steps or workers"):
        asyncio.run(_enter(crew))


def test_a_replica_started_on_a_loop_that_ended_serves_no_more_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    books: Books[Any] = Books(1, 1)
    crew = async_crew(books, "pod-7")
    timer: Any = FakeTimer()
    first = asyncio.new_event_loop()
    enter_on(first, crew)
    books.serve(timer)
    first.close()
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        asyncio.run(_enter(crew))
    assert books.timer is None
    (record,) = [r for r in caplog.records if r.name == "orchestrator"]
    assert record.__dict__["replica"] == "pod-7" and record.__dict__["outcome"] == "stopped"
    assert "start() it again" in record.getMessage()


def test_a_replica_started_on_a_loop_stopped_but_open_must_be_stopped_there_first() -> None:
    books: Books[Any] = Books(1, 1)
    crew = async_crew(books)
    timer: Any = FakeTimer()
    first = asyncio.new_event_loop()
    try:
        enter_on(first, crew)
        books.serve(timer)
        with pytest.raises(OrchestratorError, match="stop\\(\\) it on that loop first"):
            asyncio.run(_enter(crew))
        assert books.timer is timer
    finally:
        first.close()


async def _enter(crew: AsyncWorkers) -> None:
    crew.enter()


# -- the timers -----------------------------------------------------------------------------


def _job_defaults(timer: BaseScheduler) -> dict[str, Any]:
    """What a job added with no options of its own gets, read from the started timer."""
    timer.start(paused=True)
    try:
        added = timer.add_job(job, "interval", seconds=1, args=[None], id="tick")
        return {k: getattr(added, k) for k in TIMER_DEFAULTS}
    finally:
        timer.shutdown(wait=False)


def test_ticks_and_heartbeats_coalesce_run_one_at_a_time_and_never_make_up_missed_runs() -> None:
    assert TIMER_DEFAULTS == {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
    assert _job_defaults(threaded_crew().timer()) == TIMER_DEFAULTS


@pytest.mark.anyio
async def test_the_async_timer_runs_on_the_loop_the_replica_is_on() -> None:
    timer: Any = async_crew().timer()
    assert str(timer.timezone) == "UTC"
    assert _job_defaults(timer) == TIMER_DEFAULTS


# -- workers and wake-ups, async ------------------------------------------------------------


@pytest.mark.anyio
async def test_a_spawned_worker_is_a_task_named_for_the_replica() -> None:
    names: list[str] = []
    done = asyncio.Event()

    async def work() -> None:
        task = asyncio.current_task()
        assert task is not None
        names.append(task.get_name())
        done.set()

    books: Books[Any] = Books(1, 1)
    crew = AsyncWorkers(books, work, "pod-3")
    books.hire(crew)
    crew.spawn()
    await done.wait()
    assert names == ["orchestrator-pod-3"]


@pytest.mark.anyio
async def test_an_idle_worker_waits_for_news_and_takes_the_action_it_brings() -> None:
    asked = asyncio.Event()
    books = Watched(asked.set)
    crew = async_crew(books)
    with_handler(books)
    books.serve(FakeTimer())
    probe = await crew.next_action()
    assert isinstance(probe, Probe)
    books.probed(probe, None)
    first = await crew.next_action()
    assert isinstance(first, Claim)
    books.claimed(first, None)  # nothing there: idle, and serving, so it waits
    waiting = asyncio.create_task(crew.next_action())
    await asyncio.wait_for(asked.wait(), HANG_GUARD)
    assert not waiting.done()
    books.submitted("jobs", "Running")
    assert isinstance(await asyncio.wait_for(waiting, HANG_GUARD), Claim)


@pytest.mark.anyio
async def test_a_worker_not_needed_any_more_gets_no_action() -> None:
    crew = async_crew()
    assert await crew.next_action() is None  # not serving, nothing to do: it leaves


@pytest.mark.anyio
async def test_the_waiters_of_run_once_and_stop_wake_only_when_the_replica_may_have_settled() -> (
    None
):
    asked = asyncio.Event()
    books = Scripted([None, LEAVE], asked.set)  # a worker waits once, then leaves
    crew = async_crew(books)
    checked = asyncio.Event()
    answer = {"ready": False}

    def ready() -> bool:
        checked.set()
        return answer["ready"]

    waiter = asyncio.create_task(crew.settled(ready, None))
    await asyncio.wait_for(checked.wait(), HANG_GUARD)
    checked.clear()
    idle = asyncio.create_task(crew.next_action())
    await asyncio.wait_for(asked.wait(), HANG_GUARD)
    crew.wake(more_work=True, settling=False)  # news for the workers, not for the waiter
    assert await asyncio.wait_for(idle, HANG_GUARD) is None  # woken, it asked again
    assert not waiter.done() and not checked.is_set()
    answer["ready"] = True
    crew.wake(more_work=False, settling=True)
    assert await asyncio.wait_for(waiter, HANG_GUARD) is True


@pytest.mark.anyio
async def test_a_settled_replica_is_answered_at_once_and_an_unsettled_one_after_its_timeout() -> (
    None
):
    crew = async_crew()
    assert await crew.settled(lambda: True, None) is True
    assert await crew.settled(lambda: False, 0) is False


@pytest.mark.anyio
async def test_calls_made_all_at_once_give_each_its_result_or_its_exception() -> None:
    boom = ValueError("lost")

    async def fine() -> int:
        return 1

    async def broken() -> int:
        raise boom

    assert await AsyncWorkers.all_at_once([fine, broken, fine]) == [1, boom, 1]


# -- how a worker's end is read, async ------------------------------------------------------


async def _ended(
    crew: AsyncWorkers,
    raise_in: Callable[[], Any],
    *,
    cancel: bool,
    step: Step[Any] | None = None,
) -> tuple[WorkerEnd, StepEnd | None]:
    """How a worker reads what ended it: ``raise_in`` raises in its task, or (``cancel``)
    the task is cancelled while it waits; with ``step``, the step's end is read too (on a
    step of its own, as the step's end uncancels)."""
    started = asyncio.Event()
    seen: list[tuple[WorkerEnd, StepEnd | None]] = []

    async def worker() -> None:
        if step is not None:
            crew.begin_step(step)
        started.set()
        try:
            if cancel:
                await asyncio.Event().wait()
            raise_in()
        except BaseException as exc:
            end = crew.worker_end(exc)
            seen.append((end, None if step is None else crew.step_end(exc, step)))
            raise

    task = asyncio.create_task(worker())
    await started.wait()
    if cancel:
        task.cancel()
    with pytest.raises(BaseException):  # noqa: B017  # whatever ended it, re-raised
        await task
    return seen[0]


def _cancelled_error() -> None:
    raise asyncio.CancelledError


def _bug() -> None:
    raise KeyError("a bug")


@pytest.mark.anyio
async def test_a_worker_cancelled_with_its_task_leaves_the_count_and_its_step_the_books() -> None:
    crew = async_crew()
    step: Step[Any] = Step(Held(1))
    assert await _ended(crew, _bug, cancel=True, step=step) == (
        WorkerEnd.CANCELLED,
        StepEnd.CANCELLED,
    )


@pytest.mark.anyio
async def test_a_cancelled_error_nobody_asked_for_is_a_failed_worker_and_an_interrupted_step() -> (
    None
):
    crew = async_crew()
    step: Step[Any] = Step(Held(1))
    assert await _ended(crew, _cancelled_error, cancel=False, step=step) == (
        WorkerEnd.FAILED,
        StepEnd.INTERRUPTED,
    )


@pytest.mark.anyio
async def test_any_other_error_fails_the_worker_and_interrupts_the_step() -> None:
    crew = async_crew()
    step: Step[Any] = Step(Held(1))
    assert await _ended(crew, _bug, cancel=False, step=step) == (
        WorkerEnd.FAILED,
        StepEnd.INTERRUPTED,
    )


@pytest.mark.anyio
async def test_a_coroutine_discarded_with_its_loop_is_not_the_engine_s_to_handle() -> None:
    crew = async_crew()

    def discarded() -> None:
        raise GeneratorExit

    step: Step[Any] = Step(Held(1))
    assert await _ended(crew, discarded, cancel=False, step=step) == (
        WorkerEnd.RAISE,
        StepEnd.RAISE,
    )


@pytest.mark.anyio
async def test_a_cancellation_outside_any_step_is_not_a_step_s() -> None:
    crew = async_crew()
    step: Step[Any] = Step(Held(1))  # never begun: no task runs it
    assert crew.step_end(asyncio.CancelledError(), step) is StepEnd.RAISE


@pytest.mark.anyio
async def test_a_step_let_go_by_step_timeout_ends_timed_out_its_worker_uncounted() -> None:
    crew = async_crew()
    started = asyncio.Event()
    step: Step[Any] = Step(Held(1))
    seen: list[tuple[WorkerEnd, StepEnd]] = []

    async def worker() -> None:
        crew.begin_step(step)
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            worker_end = crew.worker_end(exc)  # read before the step's end uncancels
            seen.append((worker_end, crew.step_end(exc, step)))
            raise

    task = asyncio.create_task(worker())
    await started.wait()
    assert step.task is task
    step.abandoned = True  # as the books mark it when step_timeout takes it back
    assert crew.let_go(step) is True
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [(WorkerEnd.UNCOUNTED, StepEnd.TIMED_OUT)]
    assert crew.let_go(step) is False  # its task is over: nothing to let go


@pytest.mark.anyio
async def test_a_step_let_go_and_cancelled_by_someone_else_too_is_re_raised() -> None:
    crew = async_crew()
    started = asyncio.Event()
    step: Step[Any] = Step(Held(1))
    seen: list[StepEnd] = []

    async def worker() -> None:
        crew.begin_step(step)
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            seen.append(crew.step_end(exc, step))
            raise

    task = asyncio.create_task(worker())
    await started.wait()
    step.abandoned = True
    crew.let_go(step)
    task.cancel()  # the loop ending, say
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [StepEnd.RAISE]


@pytest.mark.anyio
async def test_a_step_that_never_began_has_no_task_to_let_go() -> None:
    crew = async_crew()
    assert crew.let_go(Step(Held(1))) is False


@pytest.mark.anyio
async def test_only_the_task_s_own_cancellation_is_told_apart_from_a_call_s_error() -> None:
    crew = async_crew()
    assert crew.cancelling(asyncio.CancelledError()) is False  # a call raised it
    assert crew.cancelling(KeyError()) is False
    started = asyncio.Event()
    seen: list[bool] = []

    async def cancelled() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            seen.append(crew.cancelling(exc))
            raise

    task = asyncio.create_task(cancelled())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [True]


# -- the threaded twins ---------------------------------------------------------------------


def test_a_spawned_worker_is_a_daemon_thread_named_for_the_replica() -> None:
    ran: list[threading.Thread] = []
    done = threading.Event()

    def work() -> None:
        ran.append(threading.current_thread())
        done.set()

    books: Books[Any] = Books(1, 1)
    crew = Workers(books, work, "pod-3")
    books.hire(crew)
    crew.spawn()
    assert done.wait(HANG_GUARD)
    assert ran[0].name == "orchestrator-pod-3" and ran[0].daemon


def test_an_idle_worker_thread_waits_for_news_and_takes_the_action_it_brings() -> None:
    asked = threading.Event()
    books = Watched(asked.set)
    crew = threaded_crew(books)
    with_handler(books)
    books.serve(FakeTimer())
    probe = crew.next_action()
    assert isinstance(probe, Probe)
    books.probed(probe, None)
    first = crew.next_action()
    assert isinstance(first, Claim)
    books.claimed(first, None)
    got: list[Action | None] = []
    waiting = threading.Thread(target=lambda: got.append(crew.next_action()))
    waiting.start()
    assert asked.wait(HANG_GUARD)
    books.submitted("jobs", "Running")  # under the lock, which the waiting thread gave up to wait
    waiting.join(HANG_GUARD)
    assert not waiting.is_alive()
    assert len(got) == 1 and isinstance(got[0], Claim)


def test_a_worker_thread_not_needed_any_more_gets_no_action() -> None:
    assert threaded_crew().next_action() is None


def test_the_waiters_of_a_threaded_replica_wake_when_it_may_have_settled() -> None:
    books: Books[Any] = Books(1, 1)
    crew = threaded_crew(books)
    checked = threading.Event()
    answer = {"ready": False}

    def ready() -> bool:
        checked.set()
        return answer["ready"]

    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(crew.settled(ready, None)))
    waiter.start()
    assert checked.wait(HANG_GUARD)
    with books.lock:  # the waiter waits, having given the lock up
        answer["ready"] = True
        crew.wake(more_work=False, settling=True)
    waiter.join(HANG_GUARD)
    assert got == [True]
    assert crew.settled(lambda: True, None) is True
    assert crew.settled(lambda: False, 0) is False


def test_one_call_runs_on_the_caller_s_thread_and_several_on_threads_of_their_own() -> None:
    crew = threaded_crew(name="pod-5")
    boom = ValueError("lost")

    def where() -> str:
        return threading.current_thread().name

    def broken() -> str:
        raise boom

    assert crew.all_at_once([where]) == [threading.current_thread().name]
    first, error, last = crew.all_at_once([where, broken, where])
    assert error is boom
    assert isinstance(first, str) and first.startswith("orchestrator-pod-5-beat")
    assert isinstance(last, str) and last.startswith("orchestrator-pod-5-beat")


@pytest.mark.parametrize(
    "exc", [asyncio.CancelledError(), KeyError("a bug"), SystemExit(1)], ids=type
)
def test_a_thread_is_never_cancelled_whatever_it_raises(exc: BaseException) -> None:
    """A ``CancelledError`` on a worker thread is the call's own error: the worker failed,
    the step was interrupted, and step_timeout lets go of a thread by replacing it."""
    crew = threaded_crew()
    step: Step[Any] = Step(Held(1))
    crew.enter()  # no loop to be bound to
    crew.begin_step(step)
    assert step.task is None
    assert crew.cancelling(exc) is False
    assert crew.worker_end(exc) is WorkerEnd.FAILED
    assert crew.step_end(exc, step) is StepEnd.INTERRUPTED
    assert crew.let_go(step) is True
