"""A randomized, stateful test of the lease invariants the README promises.

Several replicas share one in-memory database and one ``FakeClock``: threaded
``Orchestrator`` objects driven by ``run_once``, and ``AsyncOrchestrator`` objects (each on
an event loop of its own, over the async view of the same database) with ``async def``
handlers or plain ``def`` ones. Hypothesis interleaves ticks, clock advances, wall-clock
steps of single replicas, handler outcomes of every kind (wrong ones included), an outcome
followed by an exception (unlock, relock, advance or remove, then raise), removals,
cancellations of every kind (``concurrent.futures.CancelledError`` or
``asyncio.CancelledError`` raised: the handler's error; an async step's own task
cancelled: its lease left to expire, the replica going on; an async worker cancelled outside
its handler, right after its step's outcome landed or between a slot's take and its claim:
the step leaves the books and no slot stays taken), crashes, stalls past the lease
(before the step's first lease call, or between it and the rest), the stalled replica's
heartbeat (its extension confirmed in time, its reply slow or late, or its write stalled
while the other replicas tick past the expiry), operator unlock and retry racing claims
(through ``orchestrator.operations``, guarded by what the operator saw, as the command
line and the page do), outside phase changes (a cancel) racing a stalled ``remove()``, malformed
documents, colliding submits, submits with a later start (seconds or a datetime,
some past a replica's ``max_wait``) and a priority, replicas with different lock
timeouts and ``max_wait`` (600 s and 30 days), handlers that share one name (made by one
helper function) on different phases, and handlers with cluster-wide limits
(``global_limit``, ``rate_limit``: a step holding its lease holds its slot, no slot is
left taken by a step that ended, no more starts per period than the rate); it shrinks
any failure to a short list of steps.

Every write to the collection goes through a recorder that sees the documents before and
after it and attributes it to the lease that attempted it (by the token its filter names:
``lockToken``, or ``lastToken`` for an error recorded after the step's own release), so
each invariant is judged from what was written, independently of how the library decides:
no live lease or wait is taken, no stale write lands, the first outcome stands (an error
after an unlock or relock is one failed attempt of that phase, after an advance only a
note, after a remove nothing), only the holder's ``remove()`` in the phase it claimed
deletes, a lease whose extension was confirmed after its expiry is lost, an operator's
action applies only to the document as the operator saw it, a submit stores the start
and priority asked (and refuses a start past its replica's ``max_wait``), no claim takes
a document while one of a higher priority that its handler could claim is free, and
every document some handler may claim is claimed once every wait has run out. Each
invariant raises its own ``Violation`` subclass: hypothesis then reports distinct defects
separately, each with its own shrunk example.

The machine drives time: ``run_once``'s own heartbeat (every second of real time) is off
(``run_once(heartbeat=False)``), so a stalled step's lease is extended only when an
example says so, and every example replays exactly.

CI runs the "ci" profile (the same examples every time), then the "random" one with a seed
it prints (``--hypothesis-seed``: a failure replays from it);
``HYPOTHESIS_PROFILE=soak uv run pytest tests/test_invariants.py -s`` runs longer, and ``-s``
prints the figures (runs, actions and steps of each kind, stale writes attempted/landed).
The invariants are judged in one fixed order, what a worker met first (``invariants_hold``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from pymongo import ReturnDocument

from orchestrator import (
    AsyncOrchestrator,
    ConfigError,
    LeaseLost,
    Orchestrator,
    Outcome,
    Resource,
)
from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.in_house import SLACK, InHouse
from orchestrator.core.limits import parse_rate
from orchestrator.core.settings import HORIZON
from orchestrator.operations import (
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    Operations,
    Scope,
    error_phase,
)
from orchestrator.testing import FakeClock, memory_database
from orchestrator.testing.async_memory import AsyncMemoryDatabase
from orchestrator.testing.memory import DOCUMENT_WRITES

T = TypeVar("T")

COLLECTION = "jobs"
FAILED = "Failed"
NEXT = {"A": "B", "B": "Done"}  # "advance to another phase"; from anywhere else: "A"
LOCK_TIMEOUTS = (10, 30, 60)
DAY = 86_400.0
MAX_WAITS = (600.0, 30 * DAY)  # a relock wait one replica writes, every replica honours
ENGINES = ("threaded", "async", "async-def")  # async-def: plain def handlers on threads
TICK = 1.0  # also the relock floor
LEGACY_TIMEOUTS = (None, None, None, 30.0, 45.0)
"""A run migrating from the in-house pattern: every replica's ``legacy_lock_timeout`` (one
of the lock timeouts, or none of them), old pods beside them; mostly none."""
OLD_POD_WAITS = (0.0, 5.0, 40.0, 120.0)  # an old pod's relock: claimable that much later
CLOCK_REFRESH = 60.0
MAX_ATTEMPTS = 3
MAX_DOCUMENTS = 10
MAX_REPLICAS = 4
MAX_PENDING = 4  # operator confirmations open at once
# Long enough for every lease, wait and clock estimate to run out: the liveness horizon.
SETTLE = max(MAX_WAITS) + max(LOCK_TIMEOUTS) + CLOCK_REFRESH + 1
TOLERANCE = 0.0011  # BSON dates keep milliseconds
HANG_GUARD = 60.0  # real seconds: only a deadlock reaches it; nothing here is timed
LEASE_ONLY = frozenset({"lockedAt", "lockedUntil", "lockToken", "lockedBy"})
SLOTS = "orchestrator.slots"
LIMITS: dict[str, dict[str, dict[str, Any]]] = {
    "none": {},
    "global": {"on_A": {"global_limit": 1}},
    "global 2": {"on_A": {"global_limit": 2}, "on_B": {"global_limit": 1}},
    "rate": {"on_B": {"rate_limit": "1/minute"}},
    "both": {"on_A": {"global_limit": 1, "rate_limit": "2/minute"}, "on_B": {"global_limit": 2}},
}
"""The cluster-wide limits of a run, by handler label (every replica of the run alike)."""
START = datetime(2026, 1, 1, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

PROFILES = {
    "ci": settings(
        max_examples=150,
        stateful_step_count=50,
        derandomize=True,  # the same examples on every CI run; the soak explores
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    ),
    # CI's second run: a fresh seed each time, printed by .ci/run; a failure replays with
    # HYPOTHESIS_PROFILE=random uv run pytest tests/test_invariants.py --hypothesis-seed=SEED
    "random": settings(
        max_examples=150,
        stateful_step_count=50,
        deadline=None,
        database=None,  # the seed alone replays it, on any machine
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    ),
    "soak": settings(
        max_examples=3000,
        stateful_step_count=100,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    ),
}

FIGURES: Counter[str] = Counter()


# -- what can go wrong ----------------------------------------------------------------------


class Violation(AssertionError):
    """An invariant the README promises was broken."""


class LiveLeaseTaken(Violation):
    """A claim took a lease that was still live, or a document still waiting out a wait."""


class PausedWorkClaimed(Violation):
    """A replica claimed work of a handler an operator paused, after reading the pause."""


class StaleWriteLanded(Violation):
    """A write by a lease that was no longer the document's holder changed the document."""


class StaleWriteNotRefused(Violation):
    """A handler's write under a lost lease returned instead of raising LeaseLost."""


class PhaseOverwritten(Violation):
    """A step's phase change overwrote a phase set from outside while it held the lease."""


class LeaseLeftHeld(Violation):
    """A step that neither crashed nor stalls still holds its lease after its tick."""


class AttemptsInconsistent(Violation):
    """``attempts`` is not the failed-attempt streak, ``lastError`` disagrees with it, or an
    error after the step's own outcome changed more than that outcome allows."""


class FailedPhaseMissed(Violation):
    """A failure that should park the document in the failed phase did not, or vice versa."""


class PolicyNotFollowed(Violation):
    """A relock or retry wait is not the policy's value bounded by the floor and max_wait."""


class HotLoop(Violation):
    """One document was claimed more often in one tick than its replica's budget allows."""


class ReclaimedByFailer(Violation):
    """The handler that moved a document to the failed phase claimed it again."""


class StepReran(Violation):
    """A step ran again although its previous run's result had landed."""


class DocumentLost(Violation):
    """A document disappeared (other than by its holder's ``remove()`` in the phase it
    claimed it in), or one submit key made two documents."""


class DocumentStuck(Violation):
    """A document some handler matches was not claimed once every wait had run out."""


class UnconfirmedLeaseHeld(Violation):
    """A lease whose extension was not confirmed before it expired is still held."""


class ConfirmedLeaseDropped(Violation):
    """An extension confirmed well before the lease's expiry left the lease lost."""


class LimitExceeded(Violation):
    """A step of a handler with a global_limit held its lease without a slot of the limit,
    more slots than the limit were made, or more steps of a rate-limited handler started
    within one period than its rate allows."""


class SlotLeftHeld(Violation):
    """A slot of a global_limit is still taken after the step it was taken for ended (or
    its claim found nothing), the step neither crashed nor stalls."""


class SubmitMisstored(Violation):
    """A submit's later start or priority was not stored as asked, or a start past the
    replica's ``max_wait`` was accepted (or one within it refused)."""


class PriorityInverted(Violation):
    """A claim took a document while another its handler could claim then was free with a
    higher priority."""


class OperatorMisapplied(Violation):
    """An operator's unlock or retry changed a document that was no longer as the operator
    saw it, or a retry without ``--force`` took a live lease."""


class TickRaised(Violation):
    """An exception escaped ``run_once`` (or a heartbeat)."""


class BooksLeftRunning(Violation):
    """A replica's worker was cancelled outside its handler, and a step it ran stayed on
    its books: its capacity is never given back, stop() lists the step as running."""


class TickHung(Violation):
    """A tick did not return (a deadlock: hot loops are bounded by HotLoop first)."""


class UnattributedWrite(Violation):
    """A write changed a document without a lease token, outside any known actor."""


class Crash(BaseException):
    """The replica dies mid-step: nothing after this line runs, no lease is released."""


# -- the pieces the machine drives ----------------------------------------------------------


class Job(Resource):
    """Submits through the model carry its unique key: colliding submits make one document."""

    collection = "jobs"
    unique = ("name",)
    name: str
    kind: str = "p"
    n: int = 0


@dataclass(frozen=True)
class Do:
    """What a handler does in one step."""

    name: str
    wait: float | None = None

    def __repr__(self) -> str:
        return self.name if self.wait is None else f"{self.name}({self.wait!r})"


FIRST_OUTCOMES = ("unlock", "relock", "advance", "remove")
SIMPLE = (
    "unlock",  # unlock(n=n+1): progress, next step at once
    "none",  # return None: the loop unlocks, no progress
    "relock",  # relock(n=n+1) with the policy's wait
    "advance",  # advance to another phase
    "advance-same",  # advance to the phase it is in
    "remove",  # delete the document: the end of its life
    "fail",
    "raise",
    "garbage",  # return something that is not an outcome
    "old-lease",  # return an earlier step's lease.advance(...): a foreign LeaseLost
    "two-outcomes",  # unlock, then return advance(...)
    "extend",  # extend, then unlock
    *(f"{outcome}-then-raise" for outcome in FIRST_OUTCOMES),  # the first outcome stands
    "cancel-futures",  # raise concurrent.futures.CancelledError (an SDK's future)
    "cancel-asyncio",  # raise asyncio.CancelledError
    "cancel-self",  # an async step's task is cancelled (a thread's step: raises it)
    "crash",
)
DEFAULT = Do("relock")
DEFAULT_WAITS = {"relock": 2.0, "retry": 3.0}
LONG_WAITS = (2 * DAY, 40 * DAY)  # past one day (the 600 s replicas' horizon); past 30 days

waits = st.one_of(st.floats(0, 1000), st.sampled_from(LONG_WAITS))
behaviours = st.sampled_from([*SIMPLE, "relock-wait"]).flatmap(
    lambda name: waits.map(partial(Do, name)) if name == "relock-wait" else st.just(Do(name))
)
late_behaviours = behaviours.filter(lambda b: b.name != "crash")
policy_values = st.one_of(
    st.floats(0, 1000), st.sampled_from([math.nan, None, -1.0, math.inf, "soon", *LONG_WAITS])
)
clock_moves = st.one_of(
    st.integers(0, 2_000), st.integers(2_000, 70_000), st.integers(70_000, 700_000)
)  # milliseconds, so every time is exact in BSON
documents = st.one_of(st.none(), st.integers(0, 99))  # None: the stalled step's, if any
replica_configs = st.tuples(
    st.sampled_from(LOCK_TIMEOUTS),
    st.sampled_from([0, 20, -20, 300, -300]),  # wall-clock skew
    st.sampled_from([1, 3]),  # max_unlocks_per_tick
    st.sampled_from(ENGINES),
    st.sampled_from(MAX_WAITS),
)


def good_wait(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def bounded(wait: float, max_wait: float) -> float:
    return min(max(wait, TICK), max_wait)


def free_at(doc: Mapping[str, Any], now: datetime) -> datetime:
    """When a released document becomes claimable, as written at ``now``: at once when its
    ``lockedUntil`` is no date, or one further ahead than the horizon (a malformed 10 years:
    no replica writes such a wait, and the README counts it free)."""
    until = doc.get("lockedUntil")
    if not isinstance(until, datetime) or as_utc(until) > now + timedelta(seconds=HORIZON):
        return EPOCH
    return as_utc(until)


def carried_release(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The document a carrying write (``lease_writes.carry_update``) would have left had it only
    released: the next lease's fields as the previous lease left them, free at once."""
    released = {k: v for k, v in new.items() if k not in LEASE_ONLY}
    released.update({k: old[k] for k in ("lockedAt", "lockedBy") if k in old})
    released["lockedUntil"] = EPOCH.replace(tzinfo=None)
    return released


STARTS: list[float | str | None] = [None, 0.0, 2.5, 40.0, 700.0, "at+40"]
"""A submit's ``not_before``: none, seconds from now (700 s is past the 600 s replicas'
``max_wait``: refused there), or ``at+40``: the server's time 40 s on, as a datetime."""
PRIORITIES = [0, 0, 1, 5, 9]


def rank(doc: Mapping[str, Any]) -> int | None:
    """A document's priority as the claim orders it: a missing field is 0; None for a
    stored value of another kind (it sorts by BSON's order of types, not judged here)."""
    value = doc.get("claimPriority")
    if value is None:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def surely_free(doc: Mapping[str, Any], at: datetime, legacy: float | None = None) -> bool:
    """Whether a claim judged at ``at`` finds ``doc``'s lease free, as the README says it
    judges one: its ``lockedUntil`` is no date in ``(at, at + HORIZON]``; while migrating
    (``legacy``), nor is its ``lockedAt`` an in-house lease that holds at ``at``."""
    horizon = timedelta(seconds=HORIZON)
    until = doc.get("lockedUntil")
    if isinstance(until, datetime) and at < as_utc(until) <= at + horizon:
        return False
    locked = doc.get("lockedAt")
    if legacy is None or not isinstance(locked, datetime):
        return True
    floor = at - timedelta(seconds=legacy) - SLACK
    return not floor < as_utc(locked) <= floor + horizon


def counter(doc: Mapping[str, Any]) -> int:
    n = doc.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def claimers(doc: Mapping[str, Any], failed_by: str | None) -> set[str]:
    """The handlers (registered below) that may claim ``doc``: those whose filter matches
    it, but the one that moved it to the failed phase (``failed_by``)."""
    phase = doc.get("phase")
    labels = {
        label
        for label, match in (("on_A", "A"), ("on_B", "B"), ("on_failed", FAILED))
        if phase == match
    }
    if doc.get("kind") == "w":
        labels.add("watch")
    return labels - {failed_by}


def at(moment: datetime) -> str:
    return f"t+{(moment - START).total_seconds():g}s"


def run_inline(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a step written as a coroutine on a handler's thread: every lease call it makes
    there returns at once, so it never suspends."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a step on a handler's thread suspended")


async def through(call: Callable[[], Any]) -> Any:
    """``call()``, awaited when it returns an awaitable (an ``AsyncLease``'s methods)."""
    result = call()
    if inspect.isawaitable(result):
        result = await result
    return result


def failure_of(future: Future[Any]) -> BaseException | None:
    """What a finished future raised (its cancellation too), or None."""
    if future.cancelled():
        return concurrent.futures.CancelledError("cancelled")
    return future.exception()


_context = threading.local()  # .actor: who the machine is acting as, on this thread


@contextmanager
def acting_as(actor: str | None) -> Iterator[None]:
    """Writes made on this thread meanwhile are ``actor``'s (submit, operator, outside)."""
    _context.actor = actor
    try:
        yield
    finally:
        _context.actor = None


class ScriptedPolicy:
    """Waits the machine scripted, bad ones included, so every expected wait is known."""

    def __init__(self, machine: LeaseMachine, kind: str) -> None:
        self.machine = machine
        self.kind = kind
        self.replica: Replica | None = None  # whose steps ask (one at a time: concurrency 1)

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> Any:
        values = self.machine.policy_values[self.kind]
        value = values.popleft() if values else DEFAULT_WAITS[self.kind]
        attempt = self.replica.current if self.replica is not None else None
        if attempt is not None:
            attempt.policy = (self.kind, value)
        return value


@dataclass(eq=False)
class Replica:
    name: str
    orch: Orchestrator | AsyncOrchestrator
    engine: str
    local: Any  # a skewed view of the FakeClock: its own wall time, the shared monotonic
    lock_timeout: float
    max_wait: float
    budget: int
    loop: asyncio.AbstractEventLoop | None = None  # the asyncio replica's, on ``thread``
    thread: threading.Thread | None = None
    alive: bool = True
    current: Attempt | None = None  # the step it runs now, or ran last
    claims: Counter[tuple[Any, datetime]] = field(default_factory=Counter)

    @property
    def awaits(self) -> bool:
        """Its handlers are ``async def``, awaited on its event loop."""
        return self.engine == "async"

    def start(self, call: Callable[[], Any], actor: str | None = None) -> Future[Any]:
        """Begin one of its methods as its engine runs it: on a thread of its own, or on
        its event loop; the result (or exception) comes in the future."""
        if self.loop is not None:
            return asyncio.run_coroutine_threadsafe(self._on_loop(call, actor), self.loop)
        future: Future[Any] = Future()

        def run() -> None:
            with acting_as(actor):
                try:
                    result = call()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)

        threading.Thread(target=run, name=f"machine-{self.name}", daemon=True).start()
        return future

    def run(self, call: Callable[[], Any], actor: str | None = None) -> Any:
        """One of its methods, waited for (a threaded one: on this thread)."""
        if self.loop is None:
            with acting_as(actor):
                return call()
        future = self.start(call, actor)
        done, _ = concurrent.futures.wait([future], HANG_GUARD)
        if not done:
            raise TickHung(f"{self.name}'s {getattr(call, '__name__', call)} did not return")
        return future.result()

    @staticmethod
    async def _on_loop(call: Callable[[], Any], actor: str | None) -> Any:
        with acting_as(actor):
            return await through(call)

    def stop_claiming(self) -> None:
        """``request_stop``, on the event loop's thread for an asyncio replica."""
        if self.loop is None or threading.current_thread() is self.thread:
            self.orch.request_stop()
        else:
            self.loop.call_soon_threadsafe(self.orch.request_stop)

    def close(self) -> None:
        """Stop the replica (and its event loop)."""
        try:
            self.run(partial(self.orch.stop, timeout=0))  # every tick it began has ended
        finally:
            if self.loop is not None and self.thread is not None:
                asyncio.run_coroutine_threadsafe(_wind_down(), self.loop).result(HANG_GUARD)
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(HANG_GUARD)
                self.loop.close()


async def _wind_down() -> None:
    """Cancel what is left on the loop (a worker of a dead replica) and its threads."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_default_executor()


@dataclass(eq=False)
class Attempt:
    """One lease: a claim and the step run under it."""

    token: str
    replica: Replica
    doc_id: Any
    claimed_at: datetime
    expires_at: datetime
    phase: Any
    n: int
    renewed_at: datetime = EPOCH  # the claim, or the last extension that landed
    lease: Any = None  # the lease object its handler got
    handler: str = ""
    crashed: bool = False
    stalled: bool = False
    left_to_expire: bool = False  # its holder found it lost while the document kept it
    kind: str = "neutral"  # what a write landing now means: success, failure, remove, extend
    action: str = "before the handler"
    after: str = "neutral"  # what the loop's write after the handler means
    first: str | None = None  # the step's own first outcome that landed
    moved: bool = False  # that outcome moved the document out of the claimed phase
    failures: int = 0  # failed attempts recorded for this step
    extensions: int = 0
    permanent: bool = False
    policy: tuple[str, Any] | None = None
    explicit_wait: float | None = None
    progress_landed: bool = False
    stale_write: bool = False
    streak: int | None = None  # the document's failed-attempt streak when claimed
    carried_from: Attempt | None = None  # the step whose release carried this lease on

    def describe(self) -> str:
        """What a violation's message says of this step."""
        lease = self.lease
        state = "no lease object" if lease is None else f"held={lease.held} lost={lease.lost}"
        return (
            f"{self.handler or 'never started'} on {self.replica.name}, {self.action},"
            f" ended with {self.after}, extensions={self.extensions}, {state},"
            f" stale write={self.stale_write}"
        )


@dataclass
class DocModel:
    free_at: datetime | None  # claimable from then when no lease holds it (None: unknown)
    streak: int | None  # failed attempts in the current streak (None: unknown)
    failed_by: str | None = None
    noted: bool = False  # lastError is an error noted after an advance: streak 0 with it


@dataclass(eq=False)
class Stall:
    replica: Replica
    then: Do
    where: str  # "before" the handler's first lease call, or "between" it and the rest
    claimed: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    future: Future[Any] | None = None
    attempt: Attempt | None = None
    paused: bool = False


@dataclass(eq=False)
class WriteFault:
    """What happens to the next write of lease ``token`` (the heartbeat's extension): its
    reply comes ``delay`` seconds late, or (``stalled``) it waits for ``go`` before it
    reaches the server, after saying so on ``arrived``."""

    token: str
    arrived: threading.Event
    delay: float = 0.0
    stalled: bool = False
    go: threading.Event = field(default_factory=threading.Event)
    used: bool = False


@dataclass(frozen=True)
class OperatorView:
    """What an operator saw before confirming an action, and how they apply it."""

    action: str  # "unlock", "retry" or "cancel"
    doc_id: Any
    phase: Any
    token: Any
    target: str | None  # a retry's phase
    forced: bool  # a retry that may take a live lease (the page, or --force)
    until: Any = None  # the lease's end as the command line read it (the page sends none)


# -- the recorder: every write to the collection, seen before and after -----------------------


class RecordingDatabase:
    """Passes everything through; writes to ``COLLECTION`` are reported to the machine."""

    def __init__(self, db: Any, machine: LeaseMachine) -> None:
        self._db = db
        self._machine = machine

    @property
    def name(self) -> str:
        return str(self._db.name)

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> RecordingCollection:
        return RecordingCollection(self._db.get_collection(name, *args, **kwargs), self._machine)

    def __getitem__(self, name: str) -> RecordingCollection:
        return self.get_collection(name)

    def with_options(self, *args: Any, **kwargs: Any) -> RecordingDatabase:
        return RecordingDatabase(self._db.with_options(*args, **kwargs), self._machine)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class RecordingCollection:
    def __init__(self, collection: Any, machine: LeaseMachine) -> None:
        self._collection = collection
        self._machine = machine

    @property
    def name(self) -> str:
        return str(self._collection.name)

    def with_options(self, *args: Any, **kwargs: Any) -> RecordingCollection:
        return RecordingCollection(self._collection.with_options(*args, **kwargs), self._machine)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if name in DOCUMENT_WRITES and self._collection.name == COLLECTION:
            return partial(self._machine.record, self._collection, name, attribute)
        if name == "find_one_and_update" and self._collection.name == SLOTS:
            return partial(self._machine.slot_take, attribute)
        return attribute


def token_in(query: Any) -> str | None:
    """The lease token a fenced filter names, if any: ``lastToken`` (an error noted on the
    document as the step's own release left it, even while the lease that release carried
    on holds it: ``lockToken`` then names that one), else ``lockToken``."""
    if isinstance(query, Mapping):
        for key in ("lastToken", "lockToken"):
            token = query.get(key)
            if isinstance(token, str):
                return token
        for value in query.values():
            found = token_in(value)
            if found is not None:
                return found
    elif isinstance(query, list):
        for value in query:
            found = token_in(value)
            if found is not None:
                return found
    return None


# -- the machine ----------------------------------------------------------------------------


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(START)
        self.raw = memory_database(clock=self.clock)
        self.db = RecordingDatabase(self.raw, self)
        # The asyncio replicas' database: the async view of the same recorded one.
        self.adb = AsyncMemoryDatabase(self.db)  # type: ignore[arg-type]
        self.operator = Operations(self.db)  # type: ignore[arg-type]
        self.lock = threading.RLock()
        self.mirror: dict[Any, dict[str, Any]] = {}
        self.docs: dict[Any, DocModel] = {}
        self.last_writer: dict[Any, object] = {}  # who made each document as it is now
        self.outside_since: set[Any] = set()  # changed from outside since its last_writer
        self.names: list[str] = []  # the documents there should be, by name
        self.serial = 0
        self.twins = False  # on_A, on_B and on_failed share one name
        self.replicas: list[Replica] = []
        self.attempts: dict[str, Attempt] = {}
        self.seen: dict[tuple[Any, str, int], Attempt] = {}
        self.claims_by_doc: Counter[Any] = Counter()
        self.violations: list[Violation] = []
        self.script: deque[Do] = deque()
        self.policy_values: dict[str, deque[Any]] = {"relock": deque(), "retry": deque()}
        self.old_leases: list[tuple[Replica, Any]] = []  # steps' leases, once they ended
        self.stall: Stall | None = None
        self.fault: WriteFault | None = None
        self.pending: list[OperatorView] = []
        self.operator_view: OperatorView | None = None  # the operator's action being applied
        # The submit under way: its later start (seconds, or the datetime asked) and priority.
        self.submitting: tuple[float, datetime | None, int] = (0.0, None, 0)
        self.count = 0
        self.limits: dict[str, dict[str, Any]] = {}  # the run's limits, by handler label
        self.keys: dict[str, str] = {}  # handler label -> handler key (the slots' handler)
        self.starts: dict[str, list[datetime]] = {}  # rate-limited label -> its steps' starts
        # A migration from the in-house pattern (``legacy_lock_timeout``, every replica's):
        self.legacy: float | None = None
        self.old_holds: dict[Any, datetime] = {}  # documents old pods work on: since when
        self.in_house: dict[Any, datetime] = {}  # until when an in-house lease holds each
        self.old_taken: set[str] = set()  # library leases old pods took over (expired)
        # A worker to cancel outside its handler: its replica, and after which write
        # ("outcome": its step's own outcome; "take": a slot's take, before the claim).
        self.cancel_at: tuple[Replica, str] | None = None
        self.cancelled = False  # the armed cancellation was delivered

    # -- bookkeeping ----------------------------------------------------------------------

    def violate(self, kind: type[Violation], message: str) -> None:
        self.violations.append(kind(f"{message} (at {at(self.clock.now())})"))

    def action(self, name: str) -> None:
        FIGURES["actions"] += 1
        FIGURES[f"action: {name}"] += 1

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def idle(self) -> list[Replica]:
        """Alive replicas not stalled mid-tick: the ones a rule may drive."""
        stalled = self.stall.replica if self.stall is not None else None
        return [r for r in self.alive() if r is not stalled]

    def pick(self, replicas: list[Replica], index: int) -> Replica:
        return replicas[index % len(replicas)]

    def document(self, index: int | None) -> dict[str, Any]:
        """The ``index``-th document; None: the one the stalled step works on, if any."""
        stall = self.stall
        if index is None and stall is not None and stall.attempt is not None:
            held = self.mirror.get(stall.attempt.doc_id)
            if held is not None:
                return held
        docs = list(self.mirror.values())
        return docs[(index or 0) % len(docs)]

    def new_name(self) -> str:
        self.serial += 1
        name = f"d{self.serial}"
        self.names.append(name)
        return name

    def add_replica(
        self, lock_timeout: float, skew: float, budget: int, engine: str, max_wait: float
    ) -> Replica:
        self.count += 1
        name = f"r{self.count}"
        local = self.clock.skewed(skew)
        relock, retry = ScriptedPolicy(self, "relock"), ScriptedPolicy(self, "retry")
        options: dict[str, Any] = {
            "replica_id": name,
            "clock": local,
            "lock_timeout": lock_timeout,
            "tick": TICK,
            "max_concurrency": 1,  # steps in claim order: the same example runs the same way
            "max_attempts": MAX_ATTEMPTS,
            "max_unlocks_per_tick": budget,
            "heartbeat": True,  # run by the machine's heartbeat action only (run_once's is off)
            "step_timeout": None,
            "clock_refresh": CLOCK_REFRESH,
            "max_wait": max_wait,
            "relock_policy": relock,
            "retry_policy": retry,
            "legacy_lock_timeout": self.legacy,
        }
        orch: Orchestrator | AsyncOrchestrator
        loop = thread = None
        if engine == "threaded":
            orch = Orchestrator(self.db, **options)  # type: ignore[arg-type]
        else:
            orch = AsyncOrchestrator(self.adb, **options)  # type: ignore[arg-type]
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name=f"loop-{name}", daemon=True)
            thread.start()
        replica = Replica(
            name, orch, engine, local, float(lock_timeout), max_wait, budget, loop, thread
        )
        relock.replica = retry.replica = replica
        for label, match in (
            ("on_A", {"phase": "A"}),
            ("on_B", {"phase": "B"}),
            ("on_failed", {"phase": FAILED}),
            ("watch", {"kind": "w"}),
        ):
            orch.when(COLLECTION, match, **self.limits.get(label, {}))(self.handler(replica, label))
            self.keys[label] = orch.handlers[-1].key
        self.replicas.append(replica)
        FIGURES["replicas"] += 1
        FIGURES[f"replicas: {engine}"] += 1
        return replica

    def handler(self, replica: Replica, label: str) -> Callable[[Any], Any]:
        """The step of ``label`` for ``replica``'s engine. Named after its label, unless the
        run's handlers share a name: then on_A, on_B and on_failed keep the name this helper
        gives each function it makes, as handlers made by one factory do."""
        step: Callable[[Any], Any]
        if replica.awaits:

            async def step(lease: Any) -> Any:
                return await self.step(replica, label, lease)

        else:

            def step(lease: Any) -> Any:
                return run_inline(self.step(replica, label, lease))

        if not (self.twins and label != "watch"):
            step.__qualname__ = label  # the handler's name, as failedBy and the logs give it
        return step

    # -- the recorder's side --------------------------------------------------------------

    def record(
        self, collection: Any, operation: str, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run one write, then judge it from the documents before and after it."""
        query = None if operation.startswith("insert") else (args or [kwargs.get("filter")])[0]
        fault = self.fault_for(query)
        if fault is not None and fault.stalled:
            fault.arrived.set()  # on its way, not at the server yet
            if not fault.go.wait(HANG_GUARD):
                self.violate(TickHung, "a stalled write was never let through")
        with self.lock:
            before = self.mirror
            result: Any = None
            try:
                result = method(*args, **kwargs)
            finally:
                # Read with the default codec options whoever wrote: the library's store
                # reads aware datetimes, and the mirror must compare like with like.
                after = {doc["_id"]: doc for doc in self.raw[COLLECTION].find({})}
                self.mirror = after
                self.observe(query, result, before, after)
        if fault is not None and fault.delay:
            self.clock.advance(fault.delay)  # applied; its reply takes that long to come back
        attempt = self.attempts.get(token_in(query) or "")
        if attempt is not None and attempt.action in (*FIRST_OUTCOMES, "fail"):
            self.cancel_worker("outcome", attempt.replica)
        return result

    def slot_take(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A slot's take (a limited handler's, before its claim): applied, then the armed
        cancellation, if any, lands at the worker's next await (the claim's)."""
        result = method(*args, **kwargs)
        update = args[1] if len(args) > 1 else kwargs.get("update", {})
        by = update.get("$set", {}).get("by") if isinstance(update, Mapping) else None
        replica = next((r for r in self.replicas if r.name == by), None)
        if result is not None and replica is not None:
            self.cancel_worker("take", replica)
        return result

    def cancel_worker(self, where: str, replica: Replica) -> None:
        """Cancel ``replica``'s worker task, if the machine armed it for ``where``: called on
        its event loop's thread, inside the task that made the write, so the cancellation
        lands at its next await, outside the handler (after a step's outcome: in the
        engine's own writes after the handler returns; after a slot's take: the claim)."""
        if self.cancel_at != (replica, where):
            return
        task = asyncio.current_task() if replica.loop is not None else None
        if task is None or task.get_name() != f"orchestrator-{replica.name}":
            return  # not the worker's own write (a thread's step: its outcome hops over)
        self.cancel_at = None
        self.cancelled = True
        FIGURES[f"workers cancelled after {'an outcome' if where == 'outcome' else 'a take'}"] += 1
        task.cancel()

    def fault_for(self, query: Any) -> WriteFault | None:
        fault = self.fault
        if fault is None or fault.used or token_in(query) != fault.token:
            return None
        fault.used = True
        return fault

    def observe(  # noqa: PLR0912  one branch per kind of write the judge records
        self,
        query: Any,
        result: Any,
        before: dict[Any, dict[str, Any]],
        after: dict[Any, dict[str, Any]],
    ) -> None:
        now = self.clock.now()
        changed = [i for i in before.keys() | after.keys() if before.get(i) != after.get(i)]
        actor = getattr(_context, "actor", None)
        token = token_in(query)
        claimed = set()
        for doc_id in changed:
            old, new = before.get(doc_id), after.get(doc_id)
            if old is None and new is not None:
                self.inserted(doc_id, new, actor)
                self.last_writer[doc_id] = actor
                claimed.add(doc_id)
            elif new is None:
                if token not in self.attempts:  # a lease's remove is judged as its write
                    self.violate(DocumentLost, f"document {old} was deleted by {actor}")
            else:
                new_token = new.get("lockToken")
                carrier = self.attempts.get(token) if token is not None else None
                if (
                    isinstance(new_token, str)
                    and new_token != old.get("lockToken")
                    and carrier is not None
                    and old.get("lockToken") == token
                ):
                    # A step's release that carried its lease on into the next step, in
                    # one write: judged as that release, then as a claim of what it freed.
                    released = carried_release(old, new)
                    FIGURES["leases carried on"] += 1
                    self.lease_write(
                        carrier, result, before, {**after, doc_id: released}, [doc_id], now
                    )
                    self.claimed(doc_id, released, new, now)
                    self.attempts[new_token].carried_from = carrier
                    self.last_writer[doc_id] = carrier  # the next step has written nothing
                    claimed.add(doc_id)
                    if len(changed) == 1:
                        return
                elif isinstance(new_token, str) and new_token != old.get("lockToken"):
                    self.chose_highest(doc_id, before, new, now)
                    self.claimed(doc_id, old, new, now)
                    self.last_writer[doc_id] = self.attempts.get(new_token)
                    self.outside_since.discard(doc_id)
                    claimed.add(doc_id)
        rest = [i for i in changed if i not in claimed]
        if token is not None:
            if token in self.attempts:
                self.lease_write(self.attempts[token], result, before, after, rest, now)
            return
        if actor is not None:
            for doc_id in rest:
                self.actor_write(actor, before[doc_id], after[doc_id])
                if actor in ("outside", "old-pod", "old-pod-claim"):
                    # A phase change the fence of a step's error record (after its own
                    # release) does not see once it is undone: that record may land.
                    self.outside_since.add(doc_id)
                else:
                    self.last_writer[doc_id] = actor
                    self.outside_since.discard(doc_id)
        elif rest:
            self.violate(UnattributedWrite, f"an unfenced write changed {rest}")

    def inserted(self, doc_id: Any, doc: dict[str, Any], actor: str | None) -> None:
        if actor == "submit":
            self.docs[doc_id] = DocModel(free_at=self.submitted(doc), streak=0)
        elif actor == "malformed":
            self.docs[doc_id] = DocModel(free_at=None, streak=None)
        else:
            self.violate(UnattributedWrite, f"{actor or 'an unknown writer'} inserted {doc}")
            self.docs[doc_id] = DocModel(free_at=None, streak=None)

    def submitted(self, doc: dict[str, Any]) -> datetime:
        """A submit stores the start asked (from the same server time as ``createdAt``)
        and its priority (none for 0); returns when the document becomes claimable."""
        wait, at, priority = self.submitting
        created = as_utc(doc["createdAt"])
        if wait <= 0:
            expected = EPOCH
        elif at is not None:
            expected = as_utc(bson_time(at))
        else:
            expected = created + timedelta(seconds=wait)
        stored = free_at(doc, created)
        if abs((stored - expected).total_seconds()) > TOLERANCE:
            self.violate(
                SubmitMisstored,
                f"{doc.get('name')} asked to start {wait:g}s on, stored lockedUntil {stored}",
            )
        if doc.get("claimPriority", 0) != priority or doc.get("claimPriority") == 0:
            self.violate(
                SubmitMisstored,
                f"{doc.get('name')} asked priority {priority}, stored "
                f"{doc.get('claimPriority', 'none')}",
            )
        return stored

    def chose_highest(
        self, doc_id: Any, before: Mapping[Any, dict[str, Any]], new: dict[str, Any], now: datetime
    ) -> None:
        """A claim (not a carry: that takes no choice) takes a document of the highest
        priority among those its handler could claim: judged at the claim's own time
        (``lockedAt``: against the in-memory server the replicas' estimates carry no
        uncertainty), for every handler that may have made it, whose filter matches the
        document; broken only if each of them had a higher-priority document free."""
        old = before[doc_id]
        mine = rank(old)
        if mine is None:
            return
        at = as_utc(bson_time(now))
        higher: dict[str, list[Any]] = {}
        chose = False  # another free document of another priority: the order decided
        for label in claimers(old, self.docs[doc_id].failed_by):
            free = [
                (other.get("name"), theirs)
                for other_id, other in before.items()
                if other_id != doc_id
                and (theirs := rank(other)) is not None
                and label in claimers(other, self.docs[other_id].failed_by)
                and surely_free(other, at, self.legacy)
            ]
            higher[label] = [name for name, theirs in free if theirs > mine]
            chose = chose or any(theirs != mine for _, theirs in free)
        FIGURES["claims choosing among priorities"] += chose
        if higher and all(higher.values()):
            self.violate(
                PriorityInverted,
                f"{new.get('lockedBy')} claimed {old.get('name')} (priority {mine}) while "
                f"{higher} were free with a higher priority",
            )

    def claimed(self, doc_id: Any, old: dict[str, Any], new: dict[str, Any], now: datetime) -> None:
        """A claim takes only a free or expired lease, and within its replica's budget."""
        replica = next((r for r in self.replicas if r.name == new.get("lockedBy")), None)
        if replica is None:
            self.violate(UnattributedWrite, f"a claim by an unknown replica: {new}")
            return
        token = new["lockToken"]
        lock_timeout = timedelta(seconds=replica.lock_timeout)
        attempt = Attempt(
            token, replica, doc_id, now, now + lock_timeout, new.get("phase"), counter(new), now
        )
        self.attempts[token] = attempt
        attempt.streak = self.docs[doc_id].streak
        self.claims_by_doc[doc_id] += 1
        FIGURES["claims"] += 1
        name = new.get("name")
        previous = self.attempts.get(old.get("lockToken", ""))
        model = self.docs[doc_id]
        if previous is not None:
            if now < previous.expires_at:
                self.violate(
                    LiveLeaseTaken,
                    f"{replica.name} (lock_timeout {replica.lock_timeout:g}) claimed {name} "
                    f"held by {previous.replica.name} (lock_timeout "
                    f"{previous.replica.lock_timeout:g}, claimed {at(previous.claimed_at)}) "
                    f"until {at(previous.expires_at)}",
                )
            FIGURES["expired leases taken over"] += 1
        elif old.get("lockToken") is None and model.free_at is not None and now < model.free_at:
            self.violate(
                LiveLeaseTaken,
                f"{replica.name} (max_wait {replica.max_wait:g}) claimed {name}, released to "
                f"wait until {at(model.free_at)}",
            )
        in_house = self.in_house.get(doc_id)
        if in_house is not None and now < in_house:
            self.violate(
                LiveLeaseTaken,
                f"{replica.name} (legacy_lock_timeout {self.legacy}) claimed {name}, which an"
                f" old pod holds until {at(in_house)}",
            )
        replica.claims[(doc_id, now)] += 1
        if replica.claims[(doc_id, now)] > replica.budget + 1:
            self.violate(
                HotLoop,
                f"{replica.name} claimed {name} {replica.claims[(doc_id, now)]} times in one "
                f"tick (max_unlocks_per_tick={replica.budget})",
            )
            replica.stop_claiming()  # the loop must end for the example to be reported
            replica.alive = False

    def lease_write(
        self,
        attempt: Attempt,
        result: Any,
        before: dict[Any, dict[str, Any]],
        after: dict[Any, dict[str, Any]],
        changed: list[Any],
        now: datetime,
    ) -> None:
        """No write by a stale holder lands; a landed one is judged against the model.

        Stale: the document is no longer held by this lease and someone else changed it
        since (a step's own bookkeeping after its own release is not stale)."""
        doc_id = attempt.doc_id
        old, new = before.get(doc_id), after.get(doc_id)
        stale = (
            old is None
            or attempt.token in self.old_taken  # an old pod took it over: it wrote only lockedAt
            or (
                old.get("lockToken") != attempt.token
                and self.last_writer.get(doc_id) is not attempt
            )
        )
        matched_count = getattr(result, "matched_count", None) or 0
        landed = doc_id in changed or matched_count > 0
        FIGURES["lease writes"] += 1
        if set(changed) - {doc_id}:
            self.violate(UnattributedWrite, f"a write of {attempt.token} changed other documents")
        if stale:
            attempt.stale_write = True
            FIGURES["stale writes attempted"] += 1
            if landed:
                FIGURES["stale writes landed"] += 1
                self.violate(
                    StaleWriteLanded,
                    f"{attempt.action} by {attempt.replica.name}'s lost lease on "
                    f"{(old or {}).get('name')} landed: {old} -> {new}",
                )
            return
        if landed and doc_id in self.outside_since and old.get("lockToken") != attempt.token:
            FIGURES["errors recorded across an outside phase change undone"] += 1
        if landed:
            self.outside_since.discard(doc_id)
        if landed and old is not None and new is None:
            self.removed(attempt, old)
        elif landed and old is not None and new is not None:
            self.last_writer[doc_id] = attempt
            self.landed(attempt, old, new, now)

    def removed(self, attempt: Attempt, old: dict[str, Any]) -> None:
        """Only the holder's ``remove()`` deletes, and only in the phase it claimed in."""
        name = old.get("name")
        self.last_writer[attempt.doc_id] = attempt
        if attempt.kind != "remove":
            self.violate(DocumentLost, f"{attempt.action} of {attempt.replica.name} deleted {name}")
        elif old.get("phase") != attempt.phase:
            self.violate(
                DocumentLost,
                f"{attempt.replica.name}'s step claimed {name} in phase {attempt.phase!r} and "
                f"removed it after an outside writer changed its phase to {old.get('phase')!r}",
            )
        else:
            if name in self.names:
                self.names.remove(name)
            attempt.first = attempt.first or "remove"
            attempt.moved = True
            FIGURES["documents removed"] += 1

    def landed(
        self, attempt: Attempt, old: dict[str, Any], new: dict[str, Any], now: datetime
    ) -> None:
        model = self.docs[attempt.doc_id]
        if new.get("lockToken") == attempt.token:
            until = new.get("lockedUntil")
            if until != old.get("lockedUntil") and isinstance(until, datetime):
                attempt.expires_at = as_utc(until)  # what every other replica judges by
                locked = new.get("lockedAt")
                attempt.renewed_at = as_utc(locked) if isinstance(locked, datetime) else now
                attempt.extensions += 1
                FIGURES["leases extended"] += 1
            return
        name = new.get("name")
        if new.get("phase") != old.get("phase") and old.get("phase") != attempt.phase:
            self.violate(
                PhaseOverwritten,
                f"{attempt.action} of {name} claimed in phase {attempt.phase!r} overwrote "
                f"phase {old.get('phase')!r} with {new.get('phase')!r}",
            )
        fields = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
        kind = "neutral" if fields <= LEASE_ONLY else attempt.kind  # a bare release
        if old.get("lockToken") == attempt.token and attempt.first is None:
            attempt.first = attempt.action
            attempt.moved = new.get("phase") != attempt.phase
        elif kind == "failure" and attempt.moved:
            self.noted(attempt, new, fields)
            return
        model.free_at = free_at(new, self.clock.now())
        parks = False
        if kind == "success":
            model.streak = 0
            model.noted = False
            attempt.progress_landed = counter(new) == attempt.n + 1
            if attempt.action == "advance":
                model.failed_by = None
        elif kind == "failure":
            # One step is one attempt, even when it gave an outcome before it failed.
            attempt.failures += 1
            if attempt.failures > 1:
                self.violate(
                    AttemptsInconsistent,
                    f"{attempt.replica.name}'s step on {name} recorded {attempt.failures} "
                    "failed attempts",
                )
            model.streak = None if attempt.streak is None else attempt.streak + 1
            model.noted = False
            streak = model.streak if model.streak is not None else new.get("attempts")
            parks = attempt.permanent or (isinstance(streak, int) and streak >= MAX_ATTEMPTS)
            if new.get("phase") != (FAILED if parks else old.get("phase")):
                self.violate(
                    FailedPhaseMissed,
                    f"failure {streak} of {name} ({attempt.action}, permanent: "
                    f"{attempt.permanent}) moved it from {old.get('phase')!r} to "
                    f"{new.get('phase')!r}",
                )
            if parks:
                model.failed_by = attempt.handler
        self.check_wait(attempt, kind, new, (model.free_at - now).total_seconds(), parks)
        if new.get("phase") != FAILED:
            model.failed_by = None

    def noted(self, attempt: Attempt, new: dict[str, Any], fields: set[str]) -> None:
        """An error after the step's own outcome moved the document on: that outcome
        stands, and the error is only noted as ``lastError``."""
        FIGURES["errors noted after an advance"] += 1
        if fields != {"lastError"}:
            self.violate(
                AttemptsInconsistent,
                f"an error after {attempt.replica.name}'s {attempt.first} of {new.get('name')} "
                f"changed {sorted(fields)}; only lastError may be noted",
            )
        model = self.docs[attempt.doc_id]
        model.noted = model.streak == 0

    def check_wait(
        self, attempt: Attempt, kind: str, new: dict[str, Any], wait: float, parks: bool
    ) -> None:
        """Relock and retry waits are the policy's value, bounded; the rest free at once
        (or after the floor, when the document used up its budget)."""
        name = new.get("name")
        policy, value = attempt.policy or ("", None)
        max_wait = attempt.replica.max_wait
        expected: float | None = None
        if kind == "failure" and not parks:
            if policy == "retry" and good_wait(value):
                expected = bounded(value, max_wait)
            elif not TICK - TOLERANCE <= wait <= max_wait + TOLERANCE:
                self.violate(PolicyNotFollowed, f"unsafe wait {wait} after a bad retry value")
                return
        elif kind == "success" and attempt.action == "relock":
            if attempt.explicit_wait is not None:
                expected = bounded(attempt.explicit_wait, max_wait)
            elif policy == "relock" and good_wait(value):
                expected = bounded(value, max_wait)
            else:
                self.violate(
                    PolicyNotFollowed,
                    f"relock of {name} used the bad policy value {value!r} as a {wait:g}s "
                    "wait instead of counting a failed attempt",
                )
                return
        elif wait > TOLERANCE and abs(wait - TICK) > TOLERANCE:
            self.violate(PolicyNotFollowed, f"{attempt.action} of {name} waits {wait:g}s")
            return
        if expected is not None and abs(wait - expected) > TOLERANCE:
            self.violate(
                PolicyNotFollowed,
                f"{attempt.action} of {name} waits {wait:g}s; the policy said {value!r} "
                f"(bounded: {expected:g}s)",
            )

    def actor_write(self, actor: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        model = self.docs[old["_id"]]
        if actor in ("old-pod", "old-pod-claim"):
            self.old_pod_wrote(actor == "old-pod-claim", old, new)
        holder = self.attempts.get(old.get("lockToken", ""))
        if holder is not None and new.get("lockToken") != holder.token:
            FIGURES[f"leases taken back by {actor}"] += 1
        if actor in ("operator-unlock", "operator-retry", "operator-cancel"):
            self.operator_wrote(actor, old, holder)
            model.free_at = free_at(new, self.clock.now())
            locked = new.get("lockedAt")
            if not (isinstance(locked, datetime) and as_utc(locked) > EPOCH):
                # Freed at once, lockedAt at the epoch as the in-house unlock writes it: the
                # operator took the document back from an old pod too, as from a replica.
                self.in_house.pop(old["_id"], None)
        if actor in ("operator-retry", "operator-cancel"):
            model.streak = 0
            model.noted = False
        if new.get("phase") != FAILED or actor in ("operator-retry", "operator-cancel"):
            model.failed_by = None

    def old_pod_wrote(self, claim: bool, old: dict[str, Any], new: dict[str, Any]) -> None:
        """An old pod's claim takes no lease or wait a replica wrote (the ``lockedAt`` every
        replica stamps tells it ``lockedUntil``); its claim and relock then hold the
        document for ``legacy_lock_timeout`` from their ``lockedAt`` (judged in
        ``claimed``), and an unlock or an advance frees it."""
        assert self.legacy is not None
        doc_id = old["_id"]
        now = self.clock.now()
        model = self.docs[doc_id]
        token = old.get("lockToken")
        holder = self.attempts.get(token) if isinstance(token, str) else None
        if claim:
            FIGURES["old pods' claims"] += 1
            if holder is not None and now < holder.expires_at:
                self.violate(
                    LiveLeaseTaken,
                    f"an old pod claimed {old.get('name')}, held by {holder.replica.name}"
                    f" until {at(holder.expires_at)}",
                )
            elif model.free_at is not None and now < model.free_at - timedelta(seconds=TOLERANCE):
                self.violate(
                    LiveLeaseTaken,
                    f"an old pod claimed {old.get('name')}, released to wait until"
                    f" {at(model.free_at)}",
                )
            if holder is not None:
                self.old_taken.add(holder.token)
                FIGURES["old pods' take-overs of an expired lease"] += 1
        locked = new.get("lockedAt")
        if isinstance(locked, datetime) and as_utc(locked) > EPOCH:
            until = InHouse(self.legacy).expiry(locked)
            self.in_house[doc_id] = until
            model.free_at = until
        else:
            self.in_house.pop(doc_id, None)
            model.free_at = free_at(new, now)

    def operator_wrote(self, actor: str, old: dict[str, Any], holder: Attempt | None) -> None:
        """An operator's action lands only on the document as the operator saw it, and a
        retry without --force never on a live lease."""
        view = self.operator_view
        name = old.get("name")
        if view is None or actor != f"operator-{view.action}":
            self.violate(UnattributedWrite, f"{actor} wrote {name} with no action confirmed")
            return
        if (old.get("phase"), old.get("lockToken")) != (view.phase, view.token):
            self.violate(
                OperatorMisapplied,
                f"{view.action} of {name} confirmed on phase {view.phase!r}, lease "
                f"{view.token!r} applied to phase {old.get('phase')!r}, lease "
                f"{old.get('lockToken')!r}",
            )
        live = holder is not None and self.clock.now() < holder.expires_at
        if view.action == "retry" and not view.forced and live:
            assert holder is not None
            self.violate(
                OperatorMisapplied,
                f"a retry without --force took {name} from {holder.replica.name}'s live lease "
                f"(until {at(holder.expires_at)})",
            )

    # -- the handlers' side ---------------------------------------------------------------

    async def step(self, replica: Replica, label: str, lease: Any) -> Any:
        attempt = self.attempts.get(lease.token)
        if attempt is None:
            self.violate(UnattributedWrite, f"{label} runs a lease nobody saw claimed")
            return None
        replica.current = attempt
        attempt.handler = label
        attempt.lease = lease
        doc = lease.doc
        model = self.docs[attempt.doc_id]
        if model.failed_by == label and doc.get("phase") == FAILED:
            self.violate(
                ReclaimedByFailer, f"{label} claimed {doc.get('name')} again after failing it"
            )
        key = (attempt.doc_id, repr(doc.get("phase")), counter(doc))
        previous = self.seen.get(key)
        if previous is not None and previous.progress_landed:
            self.violate(
                StepReran,
                f"step n={key[2]} of {doc.get('name')} in {key[1]} ran again on "
                f"{replica.name} after {previous.replica.name}'s run had landed",
            )
        self.seen[key] = attempt
        if lease.handler.key in replica.orch._books.paused():
            self.violate(
                PausedWorkClaimed,
                f"{replica.name} claimed {doc.get('name')} for {label}, which it had paused",
            )
        self.check_limits(label, lease, attempt.claimed_at)
        behaviour = await self.next_behaviour(replica, attempt)
        FIGURES["steps"] += 1
        FIGURES[f"step: {behaviour.name}"] += 1
        FIGURES[f"steps: {replica.engine}"] += 1
        error: BaseException | None = None
        result: Any = None
        try:
            result = await self.perform(replica, attempt, lease, behaviour)
        except Crash:
            self.old_leases.append((replica, lease))
            raise
        except BaseException as exc:  # cancellations too: the handler's error
            error = exc
        await self.pause(replica, attempt)  # a stall "between" pauses here at the latest
        # Judged by the step's own lease, as the loop will find it: lost, nothing more is
        # written; else an error (or a wrong result) is a failed attempt.
        if error is not None:
            attempt.after = "neutral" if lease.lost or attempt.left_to_expire else "failure"
        elif result is None or (isinstance(result, Outcome) and result.token == lease.token):
            attempt.after = "success" if lease.held else "neutral"
        else:  # garbage, or another lease's outcome
            attempt.after = "neutral" if lease.lost else "failure"
        attempt.kind = attempt.after
        attempt.action = "the loop's write after the handler"
        self.old_leases.append((replica, lease))
        if error is not None:
            raise error
        return result

    def check_limits(self, label: str, lease: Any, started: datetime) -> None:
        """A step of a limited handler starts with a slot of its global limit, taken for
        its lease until the lease's expiry, and no more than its rate allows have started
        in the period up to its start, ``started`` (the claim's time, the server's: not
        the ``lockedAt`` it wrote, which while migrating is the in-house pods' stamp)."""
        options = self.limits.get(label, {})
        if "global_limit" in options:
            FIGURES["steps under a global_limit"] += 1
            slot = self.raw[SLOTS].find_one({"kind": "global", "token": lease.token})
            expiry = bson_time(lease.expires_at)
            if slot is None or slot["until"] < expiry:
                self.violate(
                    LimitExceeded,
                    f"{label}'s step on {lease.doc.get('name')} started without its slot of"
                    f" global_limit={options['global_limit']}: {slot}",
                )
        rate = options.get("rate_limit")
        if rate is not None:
            FIGURES["steps under a rate_limit"] += 1
            count, period = parse_rate(rate).count, parse_rate(rate).period
            starts = self.starts.setdefault(label, [])
            starts.append(started)
            window = [t for t in starts if started - timedelta(seconds=period) < t <= started]
            if len(window) > count:
                self.violate(
                    LimitExceeded,
                    f"{len(window)} steps of {label} started within {period:g}s up to"
                    f" {at(started)} (rate_limit={rate})",
                )

    async def next_behaviour(self, replica: Replica, attempt: Attempt) -> Do:
        stall = self.stall
        if stall is not None and stall.replica is replica and stall.attempt is None:
            stall.attempt = attempt
            if stall.where == "before":
                await self.pause(replica, attempt)
            return stall.then
        if not self.script:
            return DEFAULT
        self.script.rotate(-1)  # the tick's steps take the script in turn, round and round
        return self.script[-1]

    async def pause(self, replica: Replica, attempt: Attempt) -> None:
        """The stalled step freezes here until released (once)."""
        stall = self.stall
        if stall is None or stall.attempt is not attempt or stall.paused:
            return
        stall.paused = True
        attempt.stalled = True
        stall.claimed.set()
        if replica.awaits:  # its event loop goes on meanwhile: the heartbeat runs there
            released = await asyncio.to_thread(stall.go.wait, HANG_GUARD)
        else:
            released = stall.go.wait(HANG_GUARD)
        if not released:
            self.violate(TickHung, "a stalled step was never released")

    async def perform(  # noqa: PLR0911, PLR0912  one branch per move a handler may make
        self, replica: Replica, attempt: Attempt, lease: Any, do: Do
    ) -> Any:
        n = counter(lease.doc) + 1
        phase = lease.phase
        act = partial(self.act, replica, attempt)
        target = NEXT.get(phase or "", "A")
        outcomes: dict[str, tuple[str, Callable[[], Any]]] = {
            "unlock": ("success", lambda: lease.unlock(n=n)),
            "relock": ("success", lambda: lease.relock(n=n)),
            "advance": ("success", lambda: lease.advance(target, n=n)),
            "remove": ("remove", lease.remove),
        }
        name = do.name
        if name in outcomes:
            return await act(name, *outcomes[name])
        if name.endswith("-then-raise"):
            first = name.removesuffix("-then-raise")
            await act(first, *outcomes[first])
            raise ValueError(f"a bug after {first}()")
        if name == "relock-wait":
            attempt.explicit_wait = do.wait
            return await act("relock", "success", lambda: lease.relock(wait=do.wait, n=n))
        if name == "advance-same":
            return await act("advance", "success", lambda: lease.advance(phase or "A", n=n))
        if name == "fail":
            attempt.permanent = True
            return await act("fail", "failure", lambda: lease.fail("given up on purpose"))
        if name == "raise":
            raise ValueError("a bug in the handler")
        if name == "garbage":
            return "garbage"
        if name == "old-lease":
            old = next(
                (o for r, o in reversed(self.old_leases) if self.foreign(r, o, replica, lease)),
                None,
            )
            return None if old is None else await through(lambda: old.advance("B"))
        if name == "two-outcomes":
            await act("unlock", "success", lambda: lease.unlock(n=n))
            return await act("advance", "success", lambda: lease.advance("B"))
        if name == "extend":
            await act("extend", "extend", lease.extend)
            return await act("unlock", "success", lambda: lease.unlock(n=n))
        if name == "cancel-futures":
            raise concurrent.futures.CancelledError("the SDK call's future was cancelled")
        if name == "cancel-asyncio":
            raise asyncio.CancelledError("an awaited call was cancelled")
        if name == "cancel-self":
            task = asyncio.current_task() if replica.awaits else None
            if task is not None:
                # The worker's own task cancelled (as by the application): the step leaves
                # the books, its lease is left to expire, and the replica goes on.
                attempt.left_to_expire = True
                task.cancel()
                await asyncio.sleep(0)  # the cancellation lands here
            raise asyncio.CancelledError("no task to cancel on a thread: raised instead")
        if name == "crash":
            attempt.crashed = True
            replica.stop_claiming()  # a dead process claims nothing more
            raise Crash
        return None  # "none"

    @staticmethod
    def foreign(owner: Replica, old: Any, replica: Replica, lease: Any) -> bool:
        """Whether a step of ``replica`` may call ``old``, an ended step's lease: of the
        same type, and (an asyncio replica's) of its own event loop, which is free now."""
        same_loop = owner.loop is None or owner is replica
        return type(old) is type(lease) and same_loop and not old.held

    async def act(
        self, replica: Replica, attempt: Attempt, action: str, kind: str, call: Callable[[], Any]
    ) -> Any:
        """A lease method called by the handler: its write is judged as ``kind``; a write
        that reached the database under a lost lease must raise LeaseLost. A stall
        "between" pauses after the first one."""
        attempt.kind, attempt.action, attempt.stale_write = kind, action, False
        refused = False
        try:
            return await through(call)
        except LeaseLost:
            refused = True
            raise
        finally:
            if attempt.stale_write and not refused:
                self.violate(
                    StaleWriteNotRefused, f"{action} under {attempt.replica.name}'s lost lease"
                )
            attempt.kind, attempt.action = "neutral", "in the handler"
            await self.pause(replica, attempt)

    # -- driving replicas -----------------------------------------------------------------

    def tick(self, replica: Replica) -> None:
        replica.claims.clear()
        try:
            replica.run(partial(replica.orch.run_once, heartbeat=False))
        except TickHung:
            raise
        except BaseException as exc:
            self.violate(TickRaised, f"run_once of {replica.name} raised {exc!r}")
        self.bury(replica)

    def bury(self, replica: Replica) -> None:
        """A replica that crashed is gone: another takes its place, as an orchestrator would."""
        crashed = any(a.crashed for a in self.attempts.values() if a.replica is replica)
        if crashed or not replica.alive:
            replica.alive = False
            FIGURES["replicas crashed"] += crashed
            self.add_replica(
                replica.lock_timeout, 0, replica.budget, replica.engine, replica.max_wait
            )

    def begin_stall(self, which: int, then: Do, where: str) -> Stall | None:
        """A replica's next step freezes mid-step; None when it found nothing to claim."""
        replica = self.pick(self.alive(), which)
        stall = Stall(replica, then, where)
        self.stall = stall
        replica.claims.clear()
        stall.future = replica.start(partial(replica.orch.run_once, heartbeat=False))
        stall.future.add_done_callback(lambda _: stall.claimed.set())  # nothing to claim
        if not stall.claimed.wait(HANG_GUARD):
            raise TickHung(f"{replica.name}'s tick neither stalled nor returned")
        if stall.attempt is None or not stall.paused:
            self.release_stall()  # no work, or the step never reached its pause
            return None
        FIGURES["stalls"] += 1
        FIGURES[f"stalls {where}"] += 1
        return stall

    def release_stall(self) -> None:
        stall = self.stall
        assert stall is not None and stall.future is not None
        stall.go.set()
        done, _ = concurrent.futures.wait([stall.future], HANG_GUARD)
        if not done:
            raise TickHung(f"{stall.replica.name}'s tick did not return after its stall")
        self.stall = None
        if stall.attempt is not None:
            stall.attempt.stalled = False
        error = failure_of(stall.future)
        if error is not None:
            self.violate(TickRaised, f"run_once of {stall.replica.name} raised {error!r}")
        self.bury(stall.replica)

    def operate(self, view: OperatorView) -> bool:
        """Apply a confirmed operator action as the command line and the page do: through
        ``orchestrator.operations``, from what the operator saw, guarded by it; True when
        it applied."""
        seen = {
            "_id": view.doc_id,
            "phase": view.phase,
            "lockToken": view.token,
            "lockedUntil": view.until,
        }
        self.operator_view = view
        try:
            with acting_as(f"operator-{view.action}"):
                if view.action == "retry":
                    assert view.target is not None
                    self.operator.retry(
                        COLLECTION, seen, view.target, force=view.forced, any_phase=True
                    )
                elif view.action == "cancel":
                    self.operator.cancel(COLLECTION, seen)
                else:
                    self.operator.unlock(COLLECTION, seen)
            outcome = "applied"
        except LeaseHeld:
            outcome = "refused, live lease"
        except (DocumentChanged, DocumentNotFound):
            outcome = "refused, changed"
        finally:
            self.operator_view = None
        FIGURES[f"operator {view.action}: {outcome}"] += 1
        return outcome == "applied"

    # -- rules ----------------------------------------------------------------------------

    @initialize(
        limits=st.sampled_from(["both", "global", "global 2", "none", "none", "rate"]),
        configs=st.lists(replica_configs, min_size=2, max_size=3),
        twins=st.booleans(),
        legacy=st.sampled_from(LEGACY_TIMEOUTS),
    )
    def start(
        self,
        limits: str,
        configs: list[tuple[int, int, int, str, float]],
        twins: bool,
        legacy: float | None,
    ) -> None:
        FIGURES["runs"] += 1
        if legacy is not None:
            FIGURES[f"runs migrating from old pods (legacy_lock_timeout {legacy:g})"] += 1
        self.legacy = legacy
        FIGURES["runs with handlers sharing a name"] += twins
        FIGURES[f"runs with limits: {limits}"] += 1
        self.twins = twins
        self.limits = LIMITS[limits]
        for config in configs:
            self.add_replica(*config)

    @precondition(lambda self: len(self.alive()) < MAX_REPLICAS)
    @rule(config=replica_configs)
    def new_replica(self, config: tuple[int, int, int, str, float]) -> None:
        self.action("new replica")
        self.add_replica(*config)

    @precondition(lambda self: len(self.names) < MAX_DOCUMENTS)
    @rule(
        via=st.integers(0, 3),
        phase=st.sampled_from(["A", "B"]),
        kind=st.sampled_from(["p", "w"]),
        model=st.booleans(),
        start=st.sampled_from(STARTS),
        priority=st.sampled_from(PRIORITIES),
    )
    def submit(
        self, via: int, phase: str, kind: str, model: bool, start: Any, priority: int
    ) -> None:
        self.action("submit")
        name = self.new_name()
        fields = {"name": name, "phase": phase, "kind": kind, "n": 0}
        replica = self.pick(self.alive(), via)
        at = self.clock.now() + timedelta(seconds=40) if start == "at+40" else None
        wait = 40.0 if at is not None else float(start or 0.0)
        FIGURES[f"submits starting {start or 'at once'}"] += 1
        FIGURES[f"submits of priority {priority}"] += 1
        self.submitting = (wait, at, priority)
        target = Job if model else COLLECTION
        options = {"not_before": at or start, "priority": priority}
        try:
            replica.run(partial(replica.orch.submit, target, fields, **options), "submit")
        except ConfigError as exc:
            self.names.remove(name)
            FIGURES["submits refused: start past max_wait"] += 1
            if wait <= replica.max_wait:
                self.violate(SubmitMisstored, f"{replica.name} refused a start {wait:g}s on: {exc}")
            return
        finally:
            self.submitting = (0.0, None, 0)
        if wait > replica.max_wait:
            self.violate(
                SubmitMisstored,
                f"{replica.name} (max_wait {replica.max_wait:g}) accepted a start {wait:g}s on",
            )

    @precondition(lambda self: self.names)
    @rule(which=st.integers(0, 99), first=st.integers(0, 3), second=st.integers(0, 3))
    def colliding_submits(self, which: int, first: int, second: int) -> None:
        """Two replicas submit one unique key: the model's declared key makes it one document."""
        self.action("colliding submits")
        name = self.names[which % len(self.names)]
        for via in (first, second):
            replica = self.pick(self.alive(), via)
            replica.run(partial(replica.orch.submit, Job, {"name": name, "phase": "A"}), "submit")

    @precondition(lambda self: len(self.names) < MAX_DOCUMENTS)
    @rule(
        flaw=st.sampled_from(
            [
                "no lockedAt",
                "lockedAt null",
                "lockedAt string",
                "lockedAt far future",
                "lockedAt near future",
                "lockedUntil null",
                "lockedUntil string",
                "lockedUntil far future",
                "lockedUntil near future",
                "ghost lease",
                "no phase",
                "phase not a string",
                "attempts string",
                "attempts negative",
                "attempts null",
                "lastError garbage",
            ]
        ),
        kind=st.sampled_from(["p", "w"]),
    )
    def malformed(self, flaw: str, kind: str) -> None:
        self.action("malformed document")
        now = bson_time(self.clock.now())
        doc: dict[str, Any] = {"name": self.new_name(), "phase": "A", "kind": kind, "lockedAt": now}
        far, near = now + timedelta(days=3650), now + timedelta(seconds=100)
        changes: dict[str, dict[str, Any]] = {
            "no lockedAt": {"lockedAt": None},
            "lockedAt null": {"lockedAt": "null"},
            "lockedAt string": {"lockedAt": "yesterday"},
            "lockedAt far future": {"lockedAt": far},
            "lockedAt near future": {"lockedAt": near},
            "lockedUntil null": {"lockedUntil": "null"},
            "lockedUntil string": {"lockedUntil": "soon"},
            "lockedUntil far future": {"lockedUntil": far},
            "lockedUntil near future": {"lockedUntil": near},
            "ghost lease": {
                "lockToken": "ghost",
                "lockedBy": "gone",
                "lockedUntil": now + timedelta(seconds=30),
            },
            "no phase": {"phase": None},
            "phase not a string": {"phase": 42},
            "attempts string": {"attempts": "x"},
            "attempts negative": {"attempts": -3},
            "attempts null": {"attempts": "null"},
            "lastError garbage": {"attempts": 2, "lastError": "boom"},
        }
        for key, value in changes[flaw].items():
            if value is None:
                doc.pop(key)
            else:
                doc[key] = None if value == "null" else value
        with acting_as("malformed"):
            self.db[COLLECTION].insert_one(doc)

    @precondition(lambda self: self.idle())
    @rule(
        which=st.integers(0, 3),
        script=st.lists(behaviours, min_size=1, max_size=6),
        relock=st.lists(policy_values, max_size=3),
        retry=st.lists(policy_values, max_size=3),
    )
    def run_tick(self, which: int, script: list[Do], relock: list[Any], retry: list[Any]) -> None:
        """One replica's tick; its steps do what ``script`` says, in turn (relock if empty)."""
        self.action("tick")
        self.script = deque(script)
        self.policy_values = {"relock": deque(relock), "retry": deque(retry)}
        self.tick(self.pick(self.idle(), which))

    @precondition(lambda self: any(r.awaits for r in self.idle()))
    @rule(
        which=st.integers(0, 3),
        where=st.sampled_from(["outcome", "take"]),
        script=st.lists(behaviours.filter(lambda b: b.name != "crash"), min_size=1, max_size=3),
    )
    def cancel_a_worker(self, which: int, where: str, script: list[Do]) -> None:
        """An asyncio replica's tick whose worker is cancelled outside its handler (the
        application cancels it, its loop ends): right after a step's own outcome landed,
        while the engine frees the step's slot or hands on its lease; or between a limited
        handler's slot take and its claim. The replica goes on: the step leaves its books,
        and no slot stays taken that no step holds."""
        replica = self.pick([r for r in self.idle() if r.awaits], which)
        self.action(f"cancel a worker after {'an outcome' if where == 'outcome' else 'a take'}")
        self.script = deque(script)
        self.cancel_at, self.cancelled = (replica, where), False
        try:
            self.tick(replica)
        finally:
            self.cancel_at = None
        if not self.cancelled:
            return
        running = [step.lease.doc.get("name") for step in replica.orch._books.running()]
        if running:
            self.violate(
                BooksLeftRunning,
                f"{replica.name}'s worker was cancelled after {where}; its books still run"
                f" the steps of {running}",
            )
        # A lease a cancelled worker held when the cancellation came (its step never
        # started, or stopped part-way) is left to expire, as documented.
        for attempt in self.attempts.values():
            doc = self.mirror.get(attempt.doc_id, {})
            if attempt.replica is replica and doc.get("lockToken") == attempt.token:
                attempt.left_to_expire = True

    @rule(milliseconds=clock_moves)
    def advance_clock(self, milliseconds: int) -> None:
        self.action("advance clock")
        self.clock.advance(milliseconds / 1000)

    @precondition(lambda self: self.idle())
    @rule(which=st.integers(0, 3), seconds=st.sampled_from([-120, -40, -5, 5, 40, 120]))
    def wall_clock_step(self, which: int, seconds: int) -> None:
        """One replica's wall clock steps (NTP) between two measures of the server clock."""
        self.action("wall-clock step")
        self.pick(self.idle(), which).local.step_wall(seconds)

    @precondition(lambda self: self.stall is None)
    @rule(
        which=st.integers(0, 3), then=late_behaviours, where=st.sampled_from(["before", "between"])
    )
    def stall_a_step(self, which: int, then: Do, where: str) -> None:
        """A replica's next step freezes (a GC pause, a frozen VM) until released: before
        its first lease call, or between it and the rest of the step."""
        self.action(f"stall {where}")
        self.begin_stall(which, then, where)

    @precondition(lambda self: self.stall is not None)
    @rule()
    def release(self) -> None:
        """The stalled step wakes up and writes: if its lease was taken, that must fail."""
        self.action("release stall")
        self.release_stall()

    @precondition(lambda self: self.stall is None)
    @rule(
        which=st.integers(0, 3),
        then=st.sampled_from(["remove", "remove-then-raise"]),
        phase=st.sampled_from(["Cancelled", "A", "B"]),
    )
    def remove_racing_a_cancel(self, which: int, then: str, phase: str) -> None:
        """A step about to remove its document stalls while the application's API changes
        the phase (cancels it): the remove must be refused, the document kept and released."""
        self.action("remove racing an outside phase change")
        stall = self.begin_stall(which, Do(then), "before")
        if stall is None:
            return
        assert stall.attempt is not None
        doc_id = stall.attempt.doc_id
        changed = doc_id in self.mirror and self.mirror[doc_id].get("phase") != phase
        if doc_id in self.mirror:
            with acting_as("outside"):
                self.db[COLLECTION].update_one({"_id": doc_id}, {"$set": {"phase": phase}})
        self.release_stall()
        if changed and doc_id in self.mirror:
            FIGURES["removes refused after an outside phase change"] += 1

    @rule(
        which=st.integers(0, 3),
        then=late_behaviours,
        age=st.sampled_from([0.3, 0.6, 0.9, 1.2]),
        reply=st.sampled_from(["prompt", "slow", "late", "stalled"]),
    )
    def heartbeat(self, which: int, then: Do, age: float, reply: str) -> None:
        """The stalled step's replica runs its heartbeat (the process is not frozen, only
        the step; with no step stalled, one is stalled first) at ``age`` of the lease's
        lock timeout since its last renewal: the extension is confirmed at once, or its
        reply comes slowly (still in time) or late (past the lease's expiry), or the write
        itself stalls while the other replicas tick past the expiry. A lease whose
        extension was not confirmed before it expired must be lost: its holder's later
        writes never land. The step stays stalled."""
        if self.stall is None and self.begin_stall(which, then, "before") is None:
            return
        self.action(f"heartbeat ({reply} reply)")
        stall = self.stall
        assert stall is not None and stall.attempt is not None
        attempt, replica = stall.attempt, stall.replica
        lease = attempt.lease
        due = attempt.renewed_at + timedelta(seconds=age * replica.lock_timeout)
        ahead = round((due - self.clock.now()).total_seconds(), 3)
        if ahead > 0:
            self.clock.advance(ahead)
        expiry = attempt.expires_at
        left = round((expiry - self.clock.now()).total_seconds(), 3)
        held, extensions = lease.held, attempt.extensions
        arrived = threading.Event()
        if reply == "stalled":
            self.fault = WriteFault(attempt.token, arrived, stalled=True)
        elif reply in ("slow", "late"):
            delay = round(left / 2, 3) if reply == "slow" else max(left, 0) + 1
            self.fault = WriteFault(attempt.token, arrived, delay=delay)
        try:
            beat = replica.start(replica.orch.heartbeat)
            beat.add_done_callback(lambda _: arrived.set())
            if not arrived.wait(HANG_GUARD):
                raise TickHung(f"{replica.name}'s heartbeat did not return")
            if self.fault is not None and self.fault.stalled and self.fault.used:
                # The extension is on its way; the lease runs out, and the others tick.
                self.clock.advance(max(left, 0) + 1)
                for other in self.idle():
                    self.tick(other)
                self.fault.go.set()
            done, _ = concurrent.futures.wait([beat], HANG_GUARD)
            if not done:
                raise TickHung(f"{replica.name}'s heartbeat did not return")
        finally:
            if self.fault is not None:
                self.fault.go.set()
            self.fault = None
        error = failure_of(beat)
        if error is not None:
            self.violate(TickRaised, f"heartbeat of {replica.name} raised {error!r}")
        self.judge_heartbeat(attempt, held, expiry, attempt.extensions > extensions, reply)

    def judge_heartbeat(
        self, attempt: Attempt, held: bool, expiry: datetime, extended: bool, reply: str
    ) -> None:
        """An extension confirmed at or after the lease's expiry leaves it lost; one
        confirmed well before keeps it held."""
        lease = attempt.lease
        if not held:
            return  # released or lost before: nothing to extend
        confirmed = self.clock.now()
        name = self.mirror.get(attempt.doc_id, {}).get("name")
        margin = timedelta(seconds=0.002)  # the replica's clock estimate is exact to the ms
        if lease.held and confirmed >= expiry + margin:
            self.violate(
                UnconfirmedLeaseHeld,
                f"{attempt.replica.name}'s lease on {name} expired at {at(expiry)}; its "
                f"heartbeat ({reply} reply) ended at {at(confirmed)}, and it is still held",
            )
        elif not lease.held and extended and confirmed + margin <= expiry:
            self.violate(
                ConfirmedLeaseDropped,
                f"{attempt.replica.name}'s extension of {name} landed and was confirmed at "
                f"{at(confirmed)}, before the expiry at {at(expiry)}, yet the lease is lost",
            )
        if not lease.held:
            attempt.left_to_expire = True
            FIGURES["leases lost at a heartbeat"] += 1

    @precondition(lambda self: self.mirror)
    @rule(
        which=documents,
        action=st.sampled_from(["unlock", "retry", "cancel"]),
        phase=st.sampled_from([None, "A", "B"]),
        force=st.booleans(),
        racing=st.one_of(st.none(), st.integers(0, 3)),
    )
    def operator_command(
        self, which: int | None, action: str, phase: str | None, force: bool, racing: int | None
    ) -> None:
        """``orchestrator unlock|retry [--phase P] [--force]``: reads the document, and
        applies the action to it as read (a retry of a live lease without --force is
        refused); ``racing``: a replica ticks between the read and the write."""
        self.action(
            f"operator {action} (command line{', racing a tick' if racing is not None else ''})"
        )
        doc_id = self.document(which)["_id"]
        doc = self.operator.document(COLLECTION, doc_id)
        target = (phase or error_phase(doc)) if action == "retry" else None
        if action == "retry" and target is None:
            return  # refused: no recorded error phase and no --phase
        view = OperatorView(
            action,
            doc_id,
            doc.get("phase"),
            doc.get("lockToken"),
            target,
            force,
            doc.get("lockedUntil"),
        )
        if racing is not None and self.idle():
            self.tick(self.pick(self.idle(), racing))
        self.operate(view)

    @precondition(lambda self: self.mirror and len(self.pending) < MAX_PENDING)
    @rule(
        which=documents,
        action=st.sampled_from(["unlock", "retry", "cancel"]),
        phase=st.sampled_from([None, "A", "B"]),
    )
    def operator_page_confirm(self, which: int | None, action: str, phase: str | None) -> None:
        """The operator opens the page's confirmation of an action: it carries the phase
        and the lease the operator sees, to be applied whenever they submit it."""
        self.action(f"operator {action} (page: confirm)")
        doc = self.document(which)
        target = (phase or error_phase(doc)) if action == "retry" else None
        if action == "retry" and target is None:
            return  # the page asks for a phase
        self.pending.append(
            OperatorView(action, doc["_id"], doc.get("phase"), doc.get("lockToken"), target, True)
        )

    @precondition(lambda self: self.mirror and self.stall is None)
    @rule(phase=st.sampled_from(["A", "B"]), resume=st.booleans())
    def operator_pause(self, phase: str, resume: bool) -> None:
        """``orchestrator pause|resume -c jobs --phase P`` (forced: the replicas may all be
        down, or not yet recorded); every live replica's next heartbeat reads it (here at
        once): none claims work of a paused phase after."""
        self.action(f"operator {'resume' if resume else 'pause'} phase {phase}")
        scope = Scope(COLLECTION, phase)
        changed = self.operator.resume(scope) if resume else self.operator.pause(scope, force=True)
        FIGURES[
            f"operator {'resume' if resume else 'pause'}: {'done' if changed else 'no-op'}"
        ] += 1
        for replica in self.alive():
            replica.run(replica.orch._pauses.read)

    @precondition(lambda self: self.pending)
    @rule(which=st.integers(0, MAX_PENDING - 1))
    def operator_page_submit(self, which: int) -> None:
        """The operator submits a confirmation opened earlier: applied only if the document
        is still as they saw it (a live lease they saw is theirs to take)."""
        view = self.pending.pop(which % len(self.pending))
        self.action(f"operator {view.action} (page: submit)")
        self.operate(view)

    @precondition(lambda self: self.legacy is not None and self.mirror)
    @rule(phase=st.sampled_from(["A", "B"]), later=st.sampled_from([0.0, 2.0, 61.0]))
    def old_pod_claims(self, phase: str, later: float) -> None:
        """An old pod's tick, ``later`` seconds on (past every replica's lease, at most), as
        the article's code claims: the first document of ``phase`` whose ``lockedAt`` is
        older than its lock timeout (its clock is the server's: the in-house pattern needs
        synchronised clocks)."""
        self.action("old pod claims")
        self.clock.advance(later)
        self.old_pod_claim({"phase": phase})

    def old_pod_claim(self, match: dict[str, Any]) -> None:
        """The article's claim, now: the first document of ``match`` whose ``lockedAt`` is
        older than the old pods' lock timeout gets ``lockedAt = now``."""
        assert self.legacy is not None
        now = bson_time(self.clock.now())
        query = {**match, "lockedAt": {"$lt": now - timedelta(seconds=self.legacy)}}
        with acting_as("old-pod-claim"):
            doc = self.db[COLLECTION].find_one_and_update(
                query, {"$set": {"lockedAt": now}}, return_document=ReturnDocument.AFTER
            )
        if doc is not None:
            self.old_holds[doc["_id"]] = as_utc(now)

    @precondition(lambda self: self.legacy is not None)
    @rule(which=st.integers(0, 3), then=late_behaviours)
    def old_pod_takes_a_stalled_lease(self, which: int, then: Do) -> None:
        """The stalled step's lease (with no step stalled, one is stalled first) runs out
        and an old pod's claim finds its document first (the article's query, on the
        document's phase): the old pod writes only ``lockedAt``, so the stalled step's
        late writes must be refused all the same."""
        assert self.legacy is not None
        if self.stall is None and self.begin_stall(which, then, "before") is None:
            return
        assert self.stall is not None
        attempt = self.stall.attempt
        if attempt is None:
            return
        phase = (self.raw[COLLECTION].find_one({"_id": attempt.doc_id}) or {}).get("phase")
        if phase not in ("A", "B"):
            return
        self.action("old pod takes a stalled lease")
        self.clock.advance(max((attempt.expires_at - self.clock.now()).total_seconds(), 0) + 1)
        self.old_pod_claim({"_id": attempt.doc_id, "phase": phase})

    @precondition(lambda self: self.old_holds)
    @rule(
        which=st.integers(0, MAX_DOCUMENTS - 1),
        how=st.sampled_from(["unlock", "relock", "advance", "crash"]),
        wait=st.sampled_from(OLD_POD_WAITS),
    )
    def old_pod_finishes(self, which: int, how: str, wait: float) -> None:
        """The old pod's step ends as the article's do: an unlock (``lockedAt`` at the
        epoch), a relock (``lockedAt = now - lockTimeout + wait``) or an advance, each an
        unfenced ``updateOne`` by id; or its pod dies (its lease runs out). An old pod
        whose lease ran out meanwhile writes nothing here: that the pattern's unfenced
        writes then land is the pattern's own hazard, which the migration does not fix."""
        assert self.legacy is not None
        doc_id = sorted(self.old_holds, key=repr)[which % len(self.old_holds)]
        claimed = self.old_holds.pop(doc_id)
        now = bson_time(self.clock.now())
        if how == "crash" or as_utc(now) >= claimed + timedelta(seconds=self.legacy):
            self.action("old pod dies mid-step")
            return
        self.action(f"old pod {how}s")
        update: dict[str, dict[str, Any]]
        if how == "unlock":
            update = {"$set": {"lockedAt": EPOCH}}
        elif how == "relock":
            locked = now - timedelta(seconds=self.legacy) + timedelta(seconds=wait)
            update = {"$set": {"lockedAt": locked}}
        else:
            phase = (self.raw[COLLECTION].find_one({"_id": doc_id}) or {}).get("phase")
            update = {"$set": {"phase": "B" if phase == "A" else "A", "lockedAt": EPOCH}}
        with acting_as("old-pod"):
            self.db[COLLECTION].update_one({"_id": doc_id}, update)

    @precondition(lambda self: self.mirror)
    @rule(which=documents, phase=st.sampled_from(["Cancelled", "A", "B"]))
    def outside_change(self, which: int | None, phase: str) -> None:
        """The application's API changes a document's phase, whoever holds its lease."""
        self.action("outside phase change")
        doc = self.document(which)
        with acting_as("outside"):
            self.db[COLLECTION].update_one({"_id": doc["_id"]}, {"$set": {"phase": phase}})

    @rule()
    def settle(self) -> None:
        """Liveness: once every lease, wait and clock estimate has run out and the pauses
        are lifted, one tick of each replica claims every document some handler may claim
        (one in the failed phase too, for a handler other than the one that failed it,
        whatever their names)."""
        self.action("settle")
        self.old_holds.clear()  # the old pods are gone: their leases run out below
        if self.stall is not None:
            self.release_stall()
        self.script.clear()
        self.policy_values = {"relock": deque(), "retry": deque()}
        for pause in self.operator.pauses():  # paused work waits, by design: lift them
            self.operator.resume(pause.scope)
        for replica in self.alive():
            replica.run(replica.orch._pauses.read)
        self.clock.advance(SETTLE)
        before = Counter(self.claims_by_doc)
        for replica in self.alive():
            self.tick(replica)
        # A rate limit lets so many steps start per period: what it holds back is claimed
        # in the periods after, one tick of each replica a period.
        last = Counter(self.claims_by_doc)
        for _ in range(MAX_DOCUMENTS if self.rate_limited() else 0):
            if not self.unclaimed(before):
                break
            last = Counter(self.claims_by_doc)
            self.clock.advance(60)
            for replica in self.alive():
                self.tick(replica)
        for doc_id, doc in self.mirror.items():
            waiting = claimers(doc, self.docs[doc_id].failed_by)
            if not waiting or self.claims_by_doc[doc_id] != before[doc_id]:
                continue
            if self.rate_limited() and self.kept_behind(doc_id, doc, waiting, last):
                # A rate limit's starts all went, every period, to work the claim orders
                # first that keeps coming due (a relock's), as documented: a higher
                # priority, or any due work before a lease that would never run out.
                FIGURES["documents a rate limit kept behind work ordered first"] += 1
                continue
            self.violate(DocumentStuck, f"{doc} was not claimed (by {sorted(waiting)})")

    def kept_behind(
        self, doc_id: Any, doc: Mapping[str, Any], waiting: set[str], since: Counter[Any]
    ) -> bool:
        """Whether, in the last period, a document that one of ``waiting`` may claim and
        that the claim orders before ``doc`` was claimed (it took the rate's starts):
        one of a higher priority, or, of the same, any one while ``doc``'s
        ``lockedUntil`` is a date still ahead (a lease that would never run out is free,
        but sorts after every due document)."""
        mine = rank(doc)
        until = doc.get("lockedUntil")
        ahead = isinstance(until, datetime) and as_utc(until) > self.clock.now()
        return mine is not None and any(
            other_id != doc_id
            and (theirs := rank(other)) is not None
            and (theirs > mine or (theirs == mine and ahead))
            and waiting & claimers(other, self.docs[other_id].failed_by)
            and self.claims_by_doc[other_id] > since[other_id]
            for other_id, other in self.mirror.items()
        )

    def rate_limited(self) -> bool:
        return any("rate_limit" in options for options in self.limits.values())

    def unclaimed(self, before: Counter[Any]) -> bool:
        """Whether a document some handler may claim was not claimed since ``before``."""
        return any(
            claimers(doc, self.docs[doc_id].failed_by)
            and self.claims_by_doc[doc_id] == before[doc_id]
            for doc_id, doc in self.mirror.items()
        )

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        """Every invariant, the violations recorded as they happened first: what a worker
        met (a crash, a hang, a refused write) explains what it left behind (a slot or a
        lease held), so it is what is reported. Hypothesis would run separate invariants
        in the order of their names."""
        self.nothing_violated()
        self.global_limits_hold()
        self.no_document_lost_or_doubled()
        self.no_lease_left_held()
        self.attempts_are_the_failed_streak()

    def global_limits_hold(self) -> None:
        """At most N slots of a global_limit=N; a step of its handler holding a live lease
        holds a slot of it until at least the lease's expiry (so at most N such steps run
        at once); and a slot is taken only by a step that runs (or crashed, or stalls, or
        was left to expire with its lease)."""
        now = self.clock.now()
        for label, options in self.limits.items():
            count = options.get("global_limit")
            if count is None:
                continue
            slots = list(self.raw[SLOTS].find({"handler": self.keys[label], "kind": "global"}))
            if len(slots) > count or any(s["n"] >= count for s in slots):
                raise LimitExceeded(f"{len(slots)} slots of {label}'s global_limit={count}")
            by_token = {s["token"]: s for s in slots if s["token"] is not None}
            for doc in self.mirror.values():
                token = doc.get("lockToken")
                attempt = self.attempts.get(token) if isinstance(token, str) else None
                until = doc.get("lockedUntil")
                if (
                    attempt is None
                    or attempt.handler != label
                    or attempt.crashed
                    or attempt.lease is None
                    or not attempt.lease.held
                    or not isinstance(until, datetime)
                    or as_utc(until) <= now
                ):
                    continue
                slot = by_token.get(token)
                if slot is None or slot["until"] < until:
                    raise LimitExceeded(
                        f"{attempt.replica.name}'s step of {label} on {doc.get('name')} holds"
                        f" its lease until {at(as_utc(until))} without its slot: {slot}"
                    )
            for slot in slots:
                if as_utc(slot["until"]) <= now or slot["token"] is None:
                    continue
                owner = self.attempts.get(slot["token"])
                if owner is None or not (owner.crashed or owner.stalled or owner.left_to_expire):
                    raise SlotLeftHeld(
                        f"slot {slot['n']} of {label}'s global_limit={count} is taken until"
                        f" {at(as_utc(slot['until']))} by"
                        f" {'no step' if owner is None else owner.replica.name + ' (ended)'}"
                        f" ({slot}; its step: {owner and owner.describe()};"
                        f" {self.slot_context(slot)})"
                    )

    def slot_context(self, slot: Mapping[str, Any]) -> str:
        """What a slot left held says of its taker: the document its token holds, if any,
        and the replica's state (a failure that does not replay is read from this)."""
        holding = self.raw[COLLECTION].find_one({"lockToken": slot.get("token")})
        replica = next((r for r in self.replicas if r.name == slot.get("by")), None)
        where = "unknown" if replica is None else f"{replica.engine}, alive={replica.alive}"
        stall = None if self.stall is None else self.stall.replica.name
        return f"document holding its token: {holding}; replica: {where}; stalled: {stall}"

    def nothing_violated(self) -> None:
        if self.violations:
            raise self.violations[0]

    def no_document_lost_or_doubled(self) -> None:
        names = Counter(doc.get("name") for doc in self.raw[COLLECTION].find({}))
        if sorted(names) != sorted(self.names) or any(c > 1 for c in names.values()):
            raise DocumentLost(f"documents by name {dict(names)}, expected {self.names}")

    def no_lease_left_held(self) -> None:
        for doc in self.mirror.values():
            attempt = self.attempts.get(doc.get("lockToken", ""))
            # A lease carried on by a step that has not come back (frozen, crashed) waits
            # for that step's worker, which runs it next. One an old pod took over keeps
            # its token (the old pod writes only lockedAt): the document is the old pod's.
            # One its own step found lost (its extension came too late) is left to expire.
            waiting = attempt.carried_from if attempt is not None else None
            if (
                attempt is not None
                and attempt.token not in self.old_taken
                and not (attempt.lease is not None and attempt.lease.lost)
                and not attempt.crashed
                and not attempt.stalled
                and not attempt.left_to_expire
                and not (waiting is not None and (waiting.stalled or waiting.crashed))
            ):
                raise LeaseLeftHeld(
                    f"{doc.get('name')} is still held by {attempt.replica.name}'s step "
                    f"({attempt.handler or 'never started'}, ended with {attempt.after})"
                )

    def attempts_are_the_failed_streak(self) -> None:
        for doc_id, doc in self.mirror.items():
            model = self.docs[doc_id]
            streak = model.streak
            if streak is None:
                continue
            has_error = doc.get("lastError") is not None
            if doc.get("attempts") != streak or has_error != (streak > 0 or model.noted):
                raise AttemptsInconsistent(
                    f"{doc.get('name')}: attempts={doc.get('attempts')!r}, lastError "
                    f"{'present' if has_error else 'absent'}; {streak} failed attempt(s) in "
                    f"the current streak{' (and an error noted)' if model.noted else ''}"
                )

    def teardown(self) -> None:
        if self.stall is not None:
            self.stall.go.set()
            if self.stall.future is not None:
                concurrent.futures.wait([self.stall.future], HANG_GUARD)
        errors: list[BaseException] = []
        for replica in self.replicas:
            try:
                replica.close()
            except Exception as exc:  # every other replica is still closed
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture(scope="module", autouse=True)
def fuzz_figures() -> Iterator[None]:
    """Quiet the library's logs (each run writes thousands), and print the figures."""
    log = logging.getLogger("orchestrator")
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    FIGURES.clear()
    started = time.perf_counter()
    try:
        yield
    finally:
        log.setLevel(level)
        elapsed = time.perf_counter() - started
        profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
        print(f"\nlease invariant fuzz, profile {profile!r}, {elapsed:.1f} s:")
        for key in ("stale writes attempted", "stale writes landed"):
            FIGURES.setdefault(key, 0)
        for key in sorted(FIGURES):
            print(f"  {key:<52} {FIGURES[key]:>8}")


TestLeaseInvariants = LeaseMachine.TestCase
TestLeaseInvariants.settings = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
