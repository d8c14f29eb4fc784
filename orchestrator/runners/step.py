"""A claimed step as the engines carry it: its lease, and what they note about it."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Generic, TypeVar

from orchestrator.core.lease_api import StepLease

__all__ = ["IN_STEP", "Step"]

L = TypeVar("L", bound=StepLease)


@dataclass
class Step(Generic[L]):
    """A claimed lease and its step.

    ``number`` names it in this replica's events, ``started`` is the local monotonic time
    of its claim, ``latency`` how long its document had been due (when known), ``wait``
    the wait its outcome set (a relock's, a retry's), ``abandoned`` that step_timeout took
    it back, ``task`` the async engine's task running it (which step_timeout cancels),
    ``superseded`` that an error's record found the step's own outcome landed first,
    ``confirmed`` False that its lease may never have been written (a submit's that lost
    its answer): a fenced renewal confirms it before the step runs.
    """

    lease: L
    number: int = 0
    started: float = 0.0
    latency: float | None = None
    wait: float | None = None
    abandoned: bool = False
    task: asyncio.Task[None] | None = None
    superseded: bool = False
    confirmed: bool = True


IN_STEP: ContextVar[object | None] = ContextVar("orchestrator_in_step", default=None)
"""The engine whose step this thread or task is running (a step's context: ``run_once``
from inside it would wait for itself)."""
