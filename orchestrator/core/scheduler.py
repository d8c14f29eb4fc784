"""What a replica does next, decided without doing any of it.

The scheduler is told what happened (a tick began, a probe or claim came back, a step
ended, work may have appeared, a stop was asked) and answers with the next action (probe
a collection, claim for a handler) or with nothing to do now. It performs no I/O and
knows no threads or event loops, so the threaded and the asyncio runner carry out the
same decisions, and its tests need neither. The runners call it under their own lock.

Continuous scheduling falls out of it: every worker asks for an action whenever it is
free, so a slot freed by a finished step is used at once, whatever else is running.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from orchestrator.core.outcomes import StepOutcome

if TYPE_CHECKING:
    from orchestrator.core.registry import Handler


@dataclass(frozen=True)
class Probe:
    """Read once whether any of ``handlers`` (all on ``collection``) could claim now: an idle
    tick then costs one read per collection, not one claim per handler. ``generation``, as
    for a claim: a probe that raced with a new tick or newly freed work idles no one."""

    collection: str
    handlers: tuple[Handler, ...]
    generation: int


@dataclass(frozen=True)
class Claim:
    """Claim one document for ``handler``; ``generation`` says what the scheduler knew
    when it asked, so a claim that raced with newly freed work does not idle the handler."""

    handler: Handler
    generation: int


Action = Probe | Claim


class Scheduler:
    """Slots, per-tick budgets, fairness and idleness for one replica's handlers.

    ``max_concurrency`` bounds claims in flight plus steps running; ``budget`` is how many
    times one document may be claimed in one tick before its releases wait a tick
    (``max_unlocks_per_tick``), so no handler, or set of handlers, can spin on it.
    """

    def __init__(self, handlers: Sequence[Handler], *, max_concurrency: int, budget: int) -> None:
        self._handlers = list(handlers)
        self._max = max_concurrency
        self._budget = budget
        self._busy = 0
        self._idle: set[int] = set()
        self._unprobed: list[str] = []
        self._probing: set[str] = set()
        self._claims: Counter[tuple[str, str]] = Counter()
        self._inflight: Counter[int] = Counter()  # claims under way, by handler
        self._hot: set[int] = set()  # handlers whose last claim found a document
        self._generation = 0
        self._start = 0  # first handler of this tick: a new one each tick, for fairness
        self._cursor = 0
        self._stopping = False
        self._paused: frozenset[str] = frozenset()  # keys of handlers an operator paused

    # -- what happened ------------------------------------------------------------------

    def register(self, handlers: Sequence[Handler]) -> None:
        """The handler list changed: registration only appends, so indexes stay valid."""
        self._handlers = list(handlers)
        self._idle.clear()

    def tick(self) -> None:
        """A new tick: due relocks and expired leases may be claimable now; budgets reset."""
        self._claims.clear()
        self._idle.clear()
        count = len(self._handlers)
        self._start = (self._start + 1) % count if count else 0
        self._cursor = self._start
        by_collection: Counter[str] = Counter(
            h.collection for h in self._handlers if h.key not in self._paused
        )
        self._unprobed = [c for c, n in by_collection.items() if n > 1 and c not in self._probing]
        self._generation += 1

    def wake(self) -> None:
        """Work may have appeared (a local submit): look again before the next tick."""
        self._idle.clear()
        self._generation += 1

    def stop(self) -> None:
        """Claim nothing more; steps already running finish (or are left to expire)."""
        self._stopping = True

    def resume(self) -> None:
        """Claim again after a stop (the replica was started again)."""
        self._stopping = False

    def pause(self, keys: frozenset[str]) -> bool:
        """Claim nothing for the handlers whose keys are ``keys`` (``pauses.paused``) from
        now on, and for the others again; steps running go on. Returns whether it changed:
        a resumed handler may have work waiting, so its idleness is forgotten."""
        if keys == self._paused:
            return False
        resumed = self._paused - keys
        self._paused = keys
        if resumed:
            self._idle.clear()
            self._generation += 1
        return True

    @property
    def paused(self) -> frozenset[str]:
        return self._paused

    def probed(self, probe: Probe, found: bool | None) -> None:
        """``found`` None: the probe failed; the claims will meet the same trouble and say so."""
        self._probing.discard(probe.collection)
        if found is False and probe.generation == self._generation:
            self._idle.update(i for i, h in enumerate(self._handlers) if h in probe.handlers)

    def claimed(self, claim: Claim, doc_key: str | None) -> bool:
        """A claim came back with a document (``doc_key``) or without one (None, also when
        it failed: that handler sits the rest of the tick out). Returns whether the
        document used its budget for this tick: its release must then wait a tick."""
        index = self._handlers.index(claim.handler)
        self._inflight[index] -= 1
        if doc_key is None:
            self._busy -= 1
            self._hot.discard(index)
            if claim.generation == self._generation:
                self._idle.add(index)
            return False
        self._hot.add(index)
        key = (claim.handler.collection, doc_key)
        self._claims[key] += 1
        return self._claims[key] > self._budget

    def finished(self, outcome: StepOutcome) -> None:
        """A step ended (or a claimed lease was handed back without running)."""
        self._busy -= 1
        if outcome.frees_work:
            self._idle.clear()
            self._generation += 1

    # -- what to do ---------------------------------------------------------------------

    def next(self) -> Action | None:
        """The next action for a free worker, or None: nothing to do until something
        happens (capacity full, every handler idle, or stopping)."""
        if self._stopping or self._busy >= self._max or not self._handlers:
            return None
        if self._unprobed:
            collection = self._unprobed.pop(0)
            self._probing.add(collection)
            members = tuple(
                h
                for h in self._handlers
                if h.collection == collection and h.key not in self._paused
            )
            return Probe(collection, members, self._generation)
        count = len(self._handlers)
        for step in range(count):
            index = (self._cursor + step) % count
            handler = self._handlers[index]
            if index in self._idle or handler.collection in self._probing:
                continue
            if handler.key in self._paused:
                continue
            if self._inflight[index] and index not in self._hot:
                continue  # not known to have work: one claim at a time finds out
            self._cursor = (index + 1) % count  # round robin: the next worker tries the next
            self._busy += 1
            self._inflight[index] += 1
            return Claim(handler, self._generation)
        return None

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def busy(self) -> int:
        """Slots in use: claims in flight and steps running."""
        return self._busy

    @property
    def quiet(self) -> bool:
        """The tick is over: nothing runs, and no handler has anything left to claim."""
        if self._busy or self._probing or any(self._inflight.values()):
            return False
        if self._stopping:
            return True
        return all(i in self._idle or h.key in self._paused for i, h in enumerate(self._handlers))


HeartbeatDecision = Literal["extend", "time_out"] | None


def heartbeat(
    now: datetime,
    *,
    claimed_at: datetime,
    locked_at: datetime,
    lock_timeout: float,
    step_timeout: float | None,
    extend: bool,
) -> HeartbeatDecision:
    """What the heartbeat does for one running step: take back a step past
    ``step_timeout``, renew a lease past half its timeout, or nothing."""
    if step_timeout is not None and (now - claimed_at).total_seconds() >= step_timeout:
        return "time_out"
    if extend and (now - locked_at).total_seconds() >= lock_timeout / 2:
        return "extend"
    return None
