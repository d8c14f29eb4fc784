"""A randomized, stateful test of the lease invariants the README promises (issue 8).

Several replicas (``Orchestrator`` objects driven by ``run_once``) share one in-memory
database and one ``FakeClock``. Hypothesis interleaves ticks, clock advances, wall-clock
steps of single replicas, handler outcomes of every kind (wrong ones included), crashes,
stalls past the lease, operator unlock and retry, outside phase changes, malformed
documents, colliding submits and replicas with different lock timeouts, and shrinks any
failure to a short list of steps.

Every write to the collection goes through a recorder that sees the documents before and
after it and attributes it to the lease that attempted it (by the token in its filter), so
each invariant is judged from what was written, independently of how the library decides.
Each invariant raises its own ``Violation`` subclass: hypothesis then reports distinct
defects separately, each with its own shrunk example.

CI runs the "ci" profile; ``HYPOTHESIS_PROFILE=soak uv run pytest tests/test_invariants.py -s``
runs longer, and ``-s`` prints the figures (runs, actions, stale writes attempted/landed).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

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

from orchestrator import Lease, LeaseLost, Orchestrator, Outcome, Resource
from orchestrator.core import queries
from orchestrator.core.queries import as_utc
from orchestrator.mongo import Store
from orchestrator.testing import FakeClock, memory_database
from orchestrator.testing.memory import DOCUMENT_WRITES

COLLECTION = "jobs"
FAILED = "Failed"
NEXT = {"A": "B", "B": "Done"}  # "advance to another phase"; from anywhere else: "A"
LOCK_TIMEOUTS = (10, 30, 60)
TICK = 1.0  # also the relock floor
MAX_WAIT = 600.0
CLOCK_REFRESH = 60.0
MAX_ATTEMPTS = 3
MAX_DOCUMENTS = 10
MAX_REPLICAS = 4
# Long enough for every lease, wait and clock estimate to run out: the liveness horizon.
SETTLE = MAX_WAIT + max(LOCK_TIMEOUTS) + CLOCK_REFRESH + 1
TOLERANCE = 0.0011  # BSON dates keep milliseconds
HANG_GUARD = 60.0  # real seconds: only a deadlock reaches it; nothing here is timed
LEASE_ONLY = frozenset({"lockedAt", "lockedUntil", "lockToken", "lockedBy"})
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


class StaleWriteLanded(Violation):
    """A write by a lease that was no longer the document's holder changed the document."""


class StaleWriteNotRefused(Violation):
    """A handler's write under a lost lease returned instead of raising LeaseLost."""


class PhaseOverwritten(Violation):
    """A step's phase change overwrote a phase set from outside while it held the lease."""


class LeaseLeftHeld(Violation):
    """A step that neither crashed nor stalls still holds its lease after its tick."""


class AttemptsInconsistent(Violation):
    """``attempts`` is not the failed-attempt streak, or ``lastError`` disagrees with it."""


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
    """A document disappeared, or one submit key made two documents."""


class DocumentStuck(Violation):
    """A document some handler matches was not claimed once every wait had run out."""


class TickRaised(Violation):
    """An exception escaped ``run_once``."""


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


SIMPLE = (
    "unlock",  # unlock(n=n+1): progress, next step at once
    "none",  # return None: the loop unlocks, no progress
    "relock",  # relock(n=n+1) with the policy's wait
    "advance",  # advance to another phase
    "advance-same",  # advance to the phase it is in
    "fail",
    "raise",
    "garbage",  # return something that is not an outcome
    "old-lease",  # return an earlier step's lease.advance(...): a foreign LeaseLost
    "two-outcomes",  # unlock, then return advance(...)
    "extend",  # extend, then unlock
    "crash",
)
DEFAULT = Do("relock")
DEFAULT_WAITS = {"relock": 2.0, "retry": 3.0}

behaviours = st.sampled_from([*SIMPLE, "relock-wait"]).flatmap(
    lambda name: (
        st.floats(0, 1000).map(partial(Do, name)) if name == "relock-wait" else st.just(Do(name))
    )
)
late_behaviours = behaviours.filter(lambda b: b.name != "crash")
policy_values = st.one_of(
    st.floats(0, 1000), st.sampled_from([math.nan, None, -1.0, math.inf, "soon"])
)
clock_moves = st.one_of(
    st.integers(0, 2_000), st.integers(2_000, 70_000), st.integers(70_000, 700_000)
)  # milliseconds, so every time is exact in BSON


def good_wait(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def bounded(wait: float) -> float:
    return min(max(wait, TICK), MAX_WAIT)


def free_at(doc: Mapping[str, Any]) -> datetime:
    """When a released document becomes claimable, as written."""
    until = doc.get("lockedUntil")
    return as_utc(until) if isinstance(until, datetime) else EPOCH


def counter(doc: Mapping[str, Any]) -> int:
    n = doc.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def matched(doc: Mapping[str, Any]) -> bool:
    """Whether some handler's filter matches ``doc`` (the handlers registered below)."""
    return doc.get("phase") in ("A", "B", FAILED) or doc.get("kind") == "w"


def at(moment: datetime) -> str:
    return f"t+{(moment - START).total_seconds():g}s"


_context = threading.local()  # .attempt: the step of this pool thread; .actor: the machine


class ScriptedPolicy:
    """Waits the machine scripted, bad ones included, so every expected wait is known."""

    def __init__(self, machine: LeaseMachine, kind: str) -> None:
        self.machine = machine
        self.kind = kind

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> Any:
        values = self.machine.policy_values[self.kind]
        value = values.popleft() if values else DEFAULT_WAITS[self.kind]
        attempt = getattr(_context, "attempt", None)
        if attempt is not None:
            attempt.policy = (self.kind, value)
        return value


@dataclass(eq=False)
class Replica:
    name: str
    orch: Orchestrator
    local: Any  # a skewed view of the FakeClock: its own wall time, the shared monotonic
    lock_timeout: float
    budget: int
    alive: bool = True
    claims: Counter[tuple[Any, datetime]] = field(default_factory=Counter)


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
    handler: str = ""
    crashed: bool = False
    stalled: bool = False
    kind: str = "neutral"  # what a write landing now means: success, failure, extend
    action: str = "before the handler"
    after: str = "neutral"  # what the loop's write after the handler means
    permanent: bool = False
    policy: tuple[str, Any] | None = None
    explicit_wait: float | None = None
    progress_landed: bool = False
    stale_write: bool = False
    streak: int | None = None  # the document's failed-attempt streak when claimed


@dataclass
class DocModel:
    free_at: datetime | None  # claimable from then when no lease holds it (None: unknown)
    streak: int | None  # failed attempts in the current streak (None: unknown)
    failed_by: str | None = None


@dataclass(eq=False)
class Stall:
    replica: Replica
    then: Do
    claimed: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    attempt: Attempt | None = None
    error: BaseException | None = None


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
        return attribute


def token_in(query: Any) -> str | None:
    """The lease token a fenced filter names, if any."""
    if isinstance(query, Mapping):
        token = query.get("lockToken")
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
        self.operator = Store(self.db)  # type: ignore[arg-type]
        self.lock = threading.RLock()
        self.mirror: dict[Any, dict[str, Any]] = {}
        self.docs: dict[Any, DocModel] = {}
        self.last_writer: dict[Any, object] = {}  # who made each document as it is now
        self.names: list[str] = []
        self.replicas: list[Replica] = []
        self.attempts: dict[str, Attempt] = {}
        self.seen: dict[tuple[Any, str, int], Attempt] = {}
        self.claims_by_doc: Counter[Any] = Counter()
        self.violations: list[Violation] = []
        self.script: deque[Do] = deque()
        self.policy_values: dict[str, deque[Any]] = {"relock": deque(), "retry": deque()}
        self.old_leases: list[Lease[Any]] = []
        self.stall: Stall | None = None
        self.count = 0

    # -- bookkeeping ----------------------------------------------------------------------

    def violate(self, kind: type[Violation], message: str) -> None:
        self.violations.append(kind(f"{message} (at {at(self.clock.now())})"))

    def action(self, name: str) -> None:
        FIGURES["actions"] += 1
        FIGURES[f"action: {name}"] += 1

    @contextmanager
    def acting_as(self, actor: str) -> Iterator[None]:
        _context.actor = actor
        try:
            yield
        finally:
            _context.actor = None

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def idle(self) -> list[Replica]:
        """Alive replicas not stalled mid-tick: the ones a rule may drive."""
        stalled = self.stall.replica if self.stall is not None else None
        return [r for r in self.alive() if r is not stalled]

    def pick(self, replicas: list[Replica], index: int) -> Replica:
        return replicas[index % len(replicas)]

    def document(self, index: int) -> dict[str, Any]:
        docs = list(self.mirror.values())
        return docs[index % len(docs)]

    def add_replica(self, lock_timeout: float, skew: float, budget: int) -> Replica:
        self.count += 1
        name = f"r{self.count}"
        local = self.clock.skewed(skew)
        orch = Orchestrator(
            self.db,  # type: ignore[arg-type]
            replica_id=name,
            clock=local,
            lock_timeout=lock_timeout,
            tick=TICK,
            max_concurrency=1,  # steps in claim order: the same example runs the same way
            max_attempts=MAX_ATTEMPTS,
            max_unlocks_per_tick=budget,
            heartbeat=False,  # a stalled replica is frozen: it cannot renew its lease
            step_timeout=None,
            clock_refresh=CLOCK_REFRESH,
            max_wait=MAX_WAIT,
            relock_policy=ScriptedPolicy(self, "relock"),
            retry_policy=ScriptedPolicy(self, "retry"),
        )
        replica = Replica(name, orch, local, float(lock_timeout), budget)
        for label, match in (
            ("on_A", {"phase": "A"}),
            ("on_B", {"phase": "B"}),
            ("on_failed", {"phase": FAILED}),
            ("watch", {"kind": "w"}),
        ):
            orch.when(COLLECTION, match)(self.handler(replica, label))
        self.replicas.append(replica)
        FIGURES["replicas"] += 1
        return replica

    def handler(self, replica: Replica, label: str) -> Callable[[Lease[Any]], Any]:
        def step(lease: Lease[Any]) -> Any:
            return self.step(replica, label, lease)

        step.__qualname__ = label  # the handler's name, as failedBy and the logs give it
        return step

    # -- the recorder's side --------------------------------------------------------------

    def record(
        self, collection: Any, operation: str, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run one write, then judge it from the documents before and after it."""
        with self.lock:
            before = self.mirror
            query = None if operation.startswith("insert") else (args or [kwargs.get("filter")])[0]
            result: Any = None
            try:
                result = method(*args, **kwargs)
                return result
            finally:
                # Read with the default codec options whoever wrote: the library's store
                # reads aware datetimes, and the mirror must compare like with like.
                after = {doc["_id"]: doc for doc in self.raw[COLLECTION].find({})}
                self.mirror = after
                self.observe(query, result, before, after)

    def observe(
        self,
        query: Any,
        result: Any,
        before: dict[Any, dict[str, Any]],
        after: dict[Any, dict[str, Any]],
    ) -> None:
        now = self.clock.now()
        changed = [i for i in before.keys() | after.keys() if before.get(i) != after.get(i)]
        actor = getattr(_context, "actor", None)
        claimed = set()
        for doc_id in changed:
            old, new = before.get(doc_id), after.get(doc_id)
            if old is None and new is not None:
                self.inserted(doc_id, new, actor)
                self.last_writer[doc_id] = actor
                claimed.add(doc_id)
            elif new is None:
                self.violate(DocumentLost, f"document {old} was deleted")
            else:
                token = new.get("lockToken")
                if isinstance(token, str) and token != old.get("lockToken"):
                    self.claimed(doc_id, old, new, now)
                    self.last_writer[doc_id] = self.attempts.get(token)
                    claimed.add(doc_id)
        rest = [i for i in changed if i not in claimed]
        token = token_in(query)
        if token is not None:
            if token in self.attempts:
                self.lease_write(self.attempts[token], result, before, after, rest, now)
            return
        if actor is not None:
            for doc_id in rest:
                self.actor_write(actor, before[doc_id], after[doc_id])
                self.last_writer[doc_id] = actor
            return
        attempt = getattr(_context, "attempt", None)  # an unfenced write from a step's thread
        if attempt is not None and (rest or result is not None):
            self.lease_write(attempt, result, before, after, rest, now)
        elif rest:
            self.violate(UnattributedWrite, f"an unfenced write changed {rest}")

    def inserted(self, doc_id: Any, doc: dict[str, Any], actor: str | None) -> None:
        if actor == "submit":
            self.docs[doc_id] = DocModel(free_at=EPOCH, streak=0)
        elif actor == "malformed":
            self.docs[doc_id] = DocModel(free_at=None, streak=None)
        else:
            self.violate(UnattributedWrite, f"{actor or 'an unknown writer'} inserted {doc}")
            self.docs[doc_id] = DocModel(free_at=None, streak=None)

    def claimed(self, doc_id: Any, old: dict[str, Any], new: dict[str, Any], now: datetime) -> None:
        """A claim takes only a free or expired lease, and within its replica's budget."""
        replica = next((r for r in self.replicas if r.name == new.get("lockedBy")), None)
        if replica is None:
            self.violate(UnattributedWrite, f"a claim by an unknown replica: {new}")
            return
        token = new["lockToken"]
        lock_timeout = timedelta(seconds=replica.lock_timeout)
        attempt = Attempt(
            token, replica, doc_id, now, now + lock_timeout, new.get("phase"), counter(new)
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
                f"{replica.name} claimed {name}, released to wait until {at(model.free_at)}",
            )
        replica.claims[(doc_id, now)] += 1
        if replica.claims[(doc_id, now)] > replica.budget + 1:
            self.violate(
                HotLoop,
                f"{replica.name} claimed {name} {replica.claims[(doc_id, now)]} times in one "
                f"tick (max_unlocks_per_tick={replica.budget})",
            )
            replica.orch.request_stop()  # the loop must end for the example to be reported
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
        stale = old is None or (
            old.get("lockToken") != attempt.token and self.last_writer.get(doc_id) is not attempt
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
        if landed and old is not None and new is not None:
            self.last_writer[doc_id] = attempt
            self.landed(attempt, old, new, now)

    def landed(
        self, attempt: Attempt, old: dict[str, Any], new: dict[str, Any], now: datetime
    ) -> None:
        model = self.docs[attempt.doc_id]
        if new.get("lockToken") == attempt.token:
            if attempt.kind == "extend":
                attempt.expires_at = now + timedelta(seconds=attempt.replica.lock_timeout)
            return
        name = new.get("name")
        if new.get("phase") != old.get("phase") and old.get("phase") != attempt.phase:
            self.violate(
                PhaseOverwritten,
                f"{attempt.action} of {name} claimed in phase {attempt.phase!r} overwrote "
                f"phase {old.get('phase')!r} with {new.get('phase')!r}",
            )
        model.free_at = free_at(new)
        fields = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
        kind = "neutral" if fields <= LEASE_ONLY else attempt.kind  # a bare release
        parks = False
        if kind == "success":
            model.streak = 0
            attempt.progress_landed = counter(new) == attempt.n + 1
            if attempt.action == "advance":
                model.failed_by = None
        elif kind == "failure":
            # One step is one attempt, even when it gave an outcome before it failed.
            model.streak = None if attempt.streak is None else attempt.streak + 1
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

    def check_wait(
        self, attempt: Attempt, kind: str, new: dict[str, Any], wait: float, parks: bool
    ) -> None:
        """Relock and retry waits are the policy's value, bounded; the rest free at once
        (or after the floor, when the document used up its budget)."""
        name = new.get("name")
        policy, value = attempt.policy or ("", None)
        expected: float | None = None
        if kind == "failure" and not parks:
            if policy == "retry" and good_wait(value):
                expected = bounded(value)
            elif not TICK - TOLERANCE <= wait <= MAX_WAIT + TOLERANCE:
                self.violate(PolicyNotFollowed, f"unsafe wait {wait} after a bad retry value")
                return
        elif kind == "success" and attempt.action == "relock":
            if attempt.explicit_wait is not None:
                expected = bounded(attempt.explicit_wait)
            elif policy == "relock" and good_wait(value):
                expected = bounded(value)
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
        holder = self.attempts.get(old.get("lockToken", ""))
        if holder is not None and new.get("lockToken") != holder.token:
            FIGURES[f"leases taken back by {actor}"] += 1
        if actor in ("operator-unlock", "operator-retry"):
            model.free_at = free_at(new)
        if actor == "operator-retry":
            model.streak = 0
        if new.get("phase") != FAILED or actor == "operator-retry":
            model.failed_by = None

    # -- the handlers' side ---------------------------------------------------------------

    def step(self, replica: Replica, label: str, lease: Lease[Any]) -> Any:
        attempt = self.attempts.get(lease.token)
        if attempt is None:
            self.violate(UnattributedWrite, f"{label} runs a lease nobody saw claimed")
            return None
        _context.attempt = attempt
        attempt.handler = label
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
        behaviour = self.next_behaviour(replica, attempt)
        FIGURES["steps"] += 1
        FIGURES[f"step: {behaviour.name}"] += 1
        try:
            result = self.perform(replica, attempt, lease, behaviour)
        except Crash:
            raise
        except Exception:
            # Judged by the step's own lease: lost, nothing more is written; else an error.
            attempt.after = "neutral" if lease.lost else "failure"
            raise
        else:
            own = result is None or (isinstance(result, Outcome) and result.token == lease.token)
            if own:
                attempt.after = "success" if lease.held else "neutral"
            else:  # garbage, or another lease's outcome
                attempt.after = "neutral" if lease.lost else "failure"
            return result
        finally:
            attempt.kind = attempt.after
            attempt.action = "the loop's write after the handler"
            self.old_leases.append(lease)

    def next_behaviour(self, replica: Replica, attempt: Attempt) -> Do:
        stall = self.stall
        if stall is not None and stall.replica is replica and stall.attempt is None:
            stall.attempt = attempt
            attempt.stalled = True
            stall.claimed.set()
            if not stall.go.wait(HANG_GUARD):
                self.violate(TickHung, "a stalled step was never released")
            return stall.then
        if not self.script:
            return DEFAULT
        self.script.rotate(-1)  # the tick's steps take the script in turn, round and round
        return self.script[-1]

    def perform(self, replica: Replica, attempt: Attempt, lease: Lease[Any], do: Do) -> Any:
        n = counter(lease.doc) + 1
        phase = lease.phase
        act = partial(self.act, attempt)
        if do.name == "unlock":
            return act("unlock", "success", lambda: lease.unlock(n=n))
        if do.name == "relock":
            return act("relock", "success", lambda: lease.relock(n=n))
        if do.name == "relock-wait":
            attempt.explicit_wait = do.wait
            return act("relock", "success", lambda: lease.relock(wait=do.wait, n=n))
        if do.name == "advance":
            target = NEXT.get(phase or "", "A")
            return act("advance", "success", lambda: lease.advance(target, n=n))
        if do.name == "advance-same":
            return act("advance", "success", lambda: lease.advance(phase or "A", n=n))
        if do.name == "fail":
            attempt.permanent = True
            return act("fail", "failure", lambda: lease.fail("given up on purpose"))
        if do.name == "raise":
            raise ValueError("a bug in the handler")
        if do.name == "garbage":
            return "garbage"
        if do.name == "old-lease":
            old = next((o for o in reversed(self.old_leases) if not o.held), None)
            return None if old is None else old.advance("B")
        if do.name == "two-outcomes":
            act("unlock", "success", lambda: lease.unlock(n=n))
            return act("advance", "success", lambda: lease.advance("B"))
        if do.name == "extend":
            act("extend", "extend", lease.extend)
            return act("unlock", "success", lambda: lease.unlock(n=n))
        if do.name == "crash":
            attempt.crashed = True
            replica.orch.request_stop()  # a dead process claims nothing more
            raise Crash
        return None  # "none"

    def act(self, attempt: Attempt, action: str, kind: str, call: Callable[[], Any]) -> Any:
        """A lease method called by the handler: its write is judged as ``kind``; a write
        that reached the database under a lost lease must raise LeaseLost."""
        attempt.kind, attempt.action, attempt.stale_write = kind, action, False
        refused = False
        try:
            return call()
        except LeaseLost:
            refused = True
            raise
        finally:
            if attempt.stale_write and not refused:
                self.violate(
                    StaleWriteNotRefused, f"{action} under {attempt.replica.name}'s lost lease"
                )
            attempt.kind, attempt.action = "neutral", "in the handler"

    # -- driving replicas -----------------------------------------------------------------

    def tick(self, replica: Replica) -> None:
        replica.claims.clear()
        try:
            replica.orch.run_once()
        except Exception as exc:
            self.violate(TickRaised, f"run_once of {replica.name} raised {exc!r}")
        self.bury(replica)

    def bury(self, replica: Replica) -> None:
        """A replica that crashed is gone: another takes its place, as an orchestrator would."""
        crashed = any(a.crashed for a in self.attempts.values() if a.replica is replica)
        if crashed or not replica.alive:
            replica.alive = False
            FIGURES["replicas crashed"] += crashed
            self.add_replica(replica.lock_timeout, 0, replica.budget)

    def release_stall(self) -> None:
        stall = self.stall
        assert stall is not None and stall.thread is not None
        stall.go.set()
        stall.thread.join(HANG_GUARD)
        if stall.thread.is_alive():
            raise TickHung(f"{stall.replica.name}'s tick did not return after its stall")
        self.stall = None
        if stall.attempt is not None:
            stall.attempt.stalled = False
        if stall.error is not None:
            self.violate(TickRaised, f"run_once of {stall.replica.name} raised {stall.error!r}")
        self.bury(stall.replica)

    # -- rules ----------------------------------------------------------------------------

    @initialize(
        configs=st.lists(
            st.tuples(
                st.sampled_from(LOCK_TIMEOUTS),
                st.sampled_from([0, 20, -20, 300, -300]),
                st.sampled_from([1, 3]),
            ),
            min_size=2,
            max_size=3,
        )
    )
    def start(self, configs: list[tuple[int, int, int]]) -> None:
        FIGURES["runs"] += 1
        for lock_timeout, skew, budget in configs:
            self.add_replica(lock_timeout, skew, budget)

    @precondition(lambda self: len(self.alive()) < MAX_REPLICAS)
    @rule(
        lock_timeout=st.sampled_from(LOCK_TIMEOUTS),
        skew=st.sampled_from([0, 20, -20, 300, -300]),
        budget=st.sampled_from([1, 3]),
    )
    def new_replica(self, lock_timeout: int, skew: int, budget: int) -> None:
        self.action("new replica")
        self.add_replica(lock_timeout, skew, budget)

    @precondition(lambda self: len(self.names) < MAX_DOCUMENTS)
    @rule(
        via=st.integers(0, 3),
        phase=st.sampled_from(["A", "B"]),
        kind=st.sampled_from(["p", "w"]),
        model=st.booleans(),
    )
    def submit(self, via: int, phase: str, kind: str, model: bool) -> None:
        self.action("submit")
        name = f"d{len(self.names)}"
        self.names.append(name)
        fields = {"name": name, "phase": phase, "kind": kind, "n": 0}
        with self.acting_as("submit"):
            self.pick(self.alive(), via).orch.submit(Job if model else COLLECTION, fields)

    @precondition(lambda self: self.names)
    @rule(which=st.integers(0, 99), first=st.integers(0, 3), second=st.integers(0, 3))
    def colliding_submits(self, which: int, first: int, second: int) -> None:
        """Two replicas submit one unique key: the model's declared key makes it one document."""
        self.action("colliding submits")
        name = self.names[which % len(self.names)]
        for via in (first, second):
            with self.acting_as("submit"):
                self.pick(self.alive(), via).orch.submit(Job, {"name": name, "phase": "A"})

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
        name = f"d{len(self.names)}"
        self.names.append(name)
        now = queries.bson_time(self.clock.now())
        doc: dict[str, Any] = {"name": name, "phase": "A", "kind": kind, "lockedAt": now}
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
        with self.acting_as("malformed"):
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
    @rule(which=st.integers(0, 3), then=late_behaviours)
    def stall_a_step(self, which: int, then: Do) -> None:
        """A replica's next step freezes mid-step (a GC pause, a frozen VM) until released."""
        self.action("stall")
        replica = self.pick(self.alive(), which)
        stall = Stall(replica, then)
        self.stall = stall

        def run() -> None:
            try:
                replica.claims.clear()
                replica.orch.run_once()
            except BaseException as exc:
                stall.error = exc
            finally:
                stall.claimed.set()  # also when there was nothing to claim

        stall.thread = threading.Thread(target=run, name=f"stalled-{replica.name}")
        stall.thread.start()
        if not stall.claimed.wait(HANG_GUARD):
            raise TickHung(f"{replica.name}'s tick neither stalled nor returned")
        if stall.attempt is None:
            self.release_stall()  # no work: the tick simply ran
        else:
            FIGURES["stalls"] += 1

    @precondition(lambda self: self.stall is not None)
    @rule()
    def release(self) -> None:
        """The stalled step wakes up and writes: if its lease was taken, that must fail."""
        self.action("release stall")
        self.release_stall()

    @precondition(lambda self: self.mirror)
    @rule(which=st.integers(0, 99))
    def operator_unlock(self, which: int) -> None:
        """``orchestrator unlock``: claimable at once; a live holder's writes then fail."""
        self.action("operator unlock")
        doc = self.document(which)
        with self.acting_as("operator-unlock"):
            self.operator.operator_update(COLLECTION, {"_id": doc["_id"]}, queries.release_update())

    @precondition(lambda self: self.mirror)
    @rule(which=st.integers(0, 99), phase=st.sampled_from([None, "A", "B"]))
    def operator_retry(self, which: int, phase: str | None) -> None:
        """``orchestrator retry [--phase P]``: as the command line writes it."""
        self.action("operator retry")
        doc = self.document(which)
        error = doc.get("lastError")
        target = phase or (error.get("phase") if isinstance(error, dict) else None)
        if not isinstance(target, str) or not target:
            return  # the command refuses: no recorded phase and none given
        guarded = {"_id": doc["_id"], "phase": doc.get("phase")}
        update = queries.operator_retry_update(target, self.clock.now())
        with self.acting_as("operator-retry"):
            self.operator.operator_update(COLLECTION, guarded, update)

    @precondition(lambda self: self.mirror)
    @rule(which=st.integers(0, 99), phase=st.sampled_from(["Cancelled", "A", "B"]))
    def outside_change(self, which: int, phase: str) -> None:
        """The application's API changes a document's phase, whoever holds its lease."""
        self.action("outside phase change")
        doc = self.document(which)
        with self.acting_as("outside"):
            self.db[COLLECTION].update_one({"_id": doc["_id"]}, {"$set": {"phase": phase}})

    @rule()
    def settle(self) -> None:
        """Liveness: once every lease, wait and clock estimate has run out, one tick of each
        replica claims every document some handler matches, unless it is parked in Failed."""
        self.action("settle")
        if self.stall is not None:
            self.release_stall()
        self.script.clear()
        self.policy_values = {"relock": deque(), "retry": deque()}
        self.clock.advance(SETTLE)
        before = Counter(self.claims_by_doc)
        for replica in self.alive():
            self.tick(replica)
        for doc_id, doc in self.mirror.items():
            waiting = matched(doc) and doc.get("phase") != FAILED
            if waiting and self.claims_by_doc[doc_id] == before[doc_id]:
                self.violate(DocumentStuck, f"{doc} was not claimed")

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def nothing_violated(self) -> None:
        if self.violations:
            raise self.violations[0]

    @invariant()
    def no_document_lost_or_doubled(self) -> None:
        names = Counter(doc.get("name") for doc in self.raw[COLLECTION].find({}))
        if sorted(names) != sorted(self.names) or any(c > 1 for c in names.values()):
            raise DocumentLost(f"documents by name {dict(names)}, submitted {self.names}")

    @invariant()
    def no_lease_left_held(self) -> None:
        for doc in self.mirror.values():
            attempt = self.attempts.get(doc.get("lockToken", ""))
            if attempt is not None and not attempt.crashed and not attempt.stalled:
                raise LeaseLeftHeld(
                    f"{doc.get('name')} is still held by {attempt.replica.name}'s step "
                    f"({attempt.handler or 'never started'}, ended with {attempt.after})"
                )

    @invariant()
    def attempts_are_the_failed_streak(self) -> None:
        for doc_id, doc in self.mirror.items():
            streak = self.docs[doc_id].streak
            if streak is None:
                continue
            has_error = doc.get("lastError") is not None
            if doc.get("attempts") != streak or has_error != (streak > 0):
                raise AttemptsInconsistent(
                    f"{doc.get('name')}: attempts={doc.get('attempts')!r}, lastError "
                    f"{'present' if has_error else 'absent'}; {streak} failed attempt(s) in "
                    "the current streak"
                )

    def teardown(self) -> None:
        if self.stall is not None:
            self.stall.go.set()
            if self.stall.thread is not None:
                self.stall.thread.join(HANG_GUARD)
        for replica in self.replicas:
            replica.orch.stop(timeout=5)


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
            print(f"  {key:<40} {FIGURES[key]:>8}")


TestLeaseInvariants = LeaseMachine.TestCase
TestLeaseInvariants.settings = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
