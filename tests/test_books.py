"""A replica's books on their own: a crew that only counts, no thread, no event loop. Each
test feeds them what the workers did and checks what they decide."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.registry import Handler
from orchestrator.core.scheduler import Claim, Found, Probe
from orchestrator.core.settings import Settings
from orchestrator.runners.books import LEAVE, Books

pytestmark = pytest.mark.pure

SETTINGS = Settings()


class CountingCrew:
    """Workers that are only counted: the test takes their actions for them."""

    def __init__(self) -> None:
        self.spawned = 0

    def wake(self, *, more_work: bool, settling: bool) -> None:
        """Nobody waits here: the test asks the books itself."""

    def spawn(self) -> None:
        self.spawned += 1


def _books(phase: str = "A") -> Books[Any]:
    def func(lease: Any) -> None:
        return None

    handler = Handler(
        func=func,
        collection="jobs",
        match={"phase": phase},
        phase=phase,
        model=None,
        max_attempts=5,
        failed_phase="Failed",
        relock_policy=SETTINGS.relock_policy,
        retry_policy=SETTINGS.retry_policy,
        name=f"jobs.{phase}",
    )
    books: Books[Any] = Books(max_concurrency=1, budget=100)
    books.hire(CountingCrew())
    books.register([handler])
    return books


def test_run_once_s_tick_is_over_only_when_its_workers_have_left() -> None:
    """The probe found nothing: nothing is left to claim, but the tick's worker has not
    left yet. A submit's wake reaches that worker, which claims: were run_once to return
    there, the step would run after it, outside any run_once, and the next run_once would
    count nothing."""
    books = _books()
    books.begin_once()
    probe = books.next_action()
    assert isinstance(probe, Probe)
    books.probed(probe, Found(frozenset(), None))
    assert not books.once_over()

    books.submitted()
    claim = books.next_action()
    assert isinstance(claim, Claim)
    assert not books.once_over()

    books.claimed(claim, None)
    assert books.next_action() is LEAVE
    assert books.once_over()


def test_a_tick_with_every_worker_failed_is_over() -> None:
    """run_once raises the workers' errors rather than wait for work nobody will take."""
    books = _books()
    books.begin_once()
    probe = books.next_action()
    assert isinstance(probe, Probe)
    books.worker_failed(RuntimeError("a bug"))
    assert books.once_over()
