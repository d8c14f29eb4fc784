"""The workflows both sides run, and the pattern the orchestrator replaces.

A step's work is a plain function of the document, adapted to a lease handler of either
engine (``register``, ``register_async``) and to the classic loop, so every side runs the
very same work on the same store.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from orchestrator import AsyncLease, AsyncOrchestrator, Lease, Orchestrator, Outcome
from orchestrator.core.clock import Clock
from orchestrator.core.queries import lease_writes
from orchestrator.core.queries.claims import ClaimRequest, claim_update
from orchestrator.mongo import Store

Work = Callable[[dict[str, Any]], tuple[str | None, dict[str, Any]]]
"""A step: the next phase (None: stay and continue at once) and the fields to set."""


@dataclass(frozen=True)
class Step:
    collection: str
    phase: str
    work: Work


def chain(collection: str, phases: Sequence[str], done: str = "Done") -> list[Step]:
    """A workflow that advances through ``phases`` to ``done``, one step each."""
    nexts = [*phases[1:], done]
    return [
        Step(collection, phase, partial(_to, nxt)) for phase, nxt in zip(phases, nexts, strict=True)
    ]


def _to(phase: str, _doc: Any) -> tuple[str, dict[str, Any]]:
    return phase, {}


def counting(collection: str, phase: str, steps: int, done: str = "Done") -> Step:
    """One phase that unlocks ``steps - 1`` times (counting in ``n``), then advances."""

    def work(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        n = int(doc.get("n", 0)) + 1
        return (done, {"n": n}) if n >= steps else (None, {"n": n})

    return Step(collection, phase, work)


def register(orch: Orchestrator, steps: Sequence[Step]) -> None:
    for step in steps:
        orch.phase(step.collection, step.phase)(_handler(step.work))


def _handler(work: Work) -> Callable[[Lease[Any]], Outcome]:
    def handle(lease: Lease[Any]) -> Outcome:
        nxt, fields = work(lease.doc)
        return lease.unlock(**fields) if nxt is None else lease.advance(nxt, **fields)

    return handle


def register_async(orch: AsyncOrchestrator, steps: Sequence[Step]) -> None:
    """``register`` for the async engine: the same work in ``async def`` handlers."""
    for step in steps:
        orch.phase(step.collection, step.phase)(_async_handler(step.work))


def _async_handler(work: Work) -> Callable[[AsyncLease[Any]], Awaitable[Outcome]]:
    async def handle(lease: AsyncLease[Any]) -> Outcome:
        nxt, fields = work(lease.doc)
        if nxt is None:
            return await lease.unlock(**fields)
        return await lease.advance(nxt, **fields)

    return handle


class Tally:
    """Counts documents reaching a phase, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1


def finishing(steps: Sequence[Step], tally: Tally, done: str = "Done") -> list[Step]:
    """The same steps, counting every document that reaches ``done``."""

    def wrap(work: Work) -> Work:
        def counted(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
            nxt, fields = work(doc)
            if nxt == done:
                tally.add()
            return nxt, fields

        return counted

    return [Step(s.collection, s.phase, wrap(s.work)) for s in steps]


def release_update(nxt: str | None, fields: dict[str, Any], clock: Clock) -> dict[str, Any]:
    if nxt is None:
        return lease_writes.unlock_update(fields)
    return lease_writes.advance_update(nxt, clock.now(), fields)


class ClassicReplica:
    """The pattern as usually written: one job per handler, each claiming at most one
    document per tick with ``find_one_and_update`` and unlocking it with a plain update by
    ``_id``; the next step waits for the next tick. A tick's jobs fire together, so all
    claims of one tick happen before any of its steps runs (a document advanced by one job
    is not seen by another job of the same tick)."""

    def __init__(
        self,
        db: Any,
        steps: Sequence[Step],
        clock: Clock,
        replica_id: str,
        *,
        lock_timeout: float = 30.0,
        write_concern: str | int = "majority",
    ) -> None:
        self._store = Store(db, write_concern)
        self._steps = list(steps)
        self._clock = clock
        self._replica = replica_id
        self._lock_timeout = lock_timeout

    def tick(self) -> int:
        """One tick of every job; returns the steps run."""
        claimed = []
        for step in self._steps:
            now = self._clock.now()
            until = now + timedelta(seconds=self._lock_timeout)
            doc = self._store.claim(
                step.collection,
                ClaimRequest(
                    {"phase": step.phase},
                    now,
                    3600.0,
                    claim_update(now, until, secrets.token_hex(8), self._replica),
                ),
            )
            if doc is not None:
                claimed.append((step, doc))
        for step, doc in claimed:
            nxt, fields = step.work(doc)
            self._store.collection(step.collection).update_one(
                {"_id": doc["_id"]}, release_update(nxt, fields, self._clock)
            )
        return len(claimed)
