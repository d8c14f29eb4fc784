"""A fleet of simulated replicas, each driven by the library's real ``Scheduler``.

Every replica registers its handlers through the engines' own ``Registration`` over a
``Registry`` (so its ``Handler`` objects are the real ones, keys and all), and asks a real
``orchestrator.core.scheduler.Scheduler`` what to do next, exactly as the engines' books
do: each tick, after each probe, claim and step. Only the I/O is simulated: each action
becomes commands to the modelled primary (``bench.model``) and a step sleeps its
duration. Everything the scheduler is told goes through ``Books``, the one adapter to its
API.

What varies, per ``Strategy``:

- claim ``sorted``: every claim is one ``findAndModify`` in the claim order, so every
  replica aims at the head of the queue; ``peek``: a read of the ids of the ``k`` oldest
  due documents, then ``findAndModify`` by ``_id`` (re-checking phase and lease) in an
  order rotated by a hash of the replica id; a claim that finds its document taken is a
  lost race and tries the next id; an exhausted list is read again.
- ``carry`` (continue): a step whose outcome frees its document for a handler of this
  same replica writes its outcome with a renewed lease, and the next step runs without a
  claim when the scheduler allows it (its per-document budget).
- idle ``old``: the scheduler's probes (one ``find`` per collection with several
  handlers) and claims (an empty ``findAndModify`` per single-handler collection) each
  tick, ticks aligned; ``new``: one ``aggregate`` per tick over every collection, which
  also returns the earliest future due time (the replica looks again then, if sooner),
  ticks jittered by ``JITTER``.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.model import EPOCH, Doc, Params, Process, Server, Sim, Wait
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler, Registry
from orchestrator.core.scheduler import Claim, Probe, Scheduler
from orchestrator.core.settings import Settings
from orchestrator.runners.registration import Registration

TICK = 1.0
JITTER = 0.1
"""The ``new`` idle mode's tick jitter: each interval is the tick times 1 +/- this."""
REFRESH = Settings.model_fields["lock_timeout"].default / 6
"""A started replica rewrites its replica record every lock_timeout / 6 (an update)."""
CLOCK_REFRESH = Settings.model_fields["clock_refresh"].default
"""And measures the server's clock with ``hello`` this often (a read)."""
PEEK_K = 32
PEEK_PER_ID = 1 / 50
"""A peek's service time grows with the ids it reads: each costs this share of a read's
(an index key and a document examined, an id returned: ~1.6 us beside ~80 us of a
command), so a peek of 50 ids costs two reads."""


@dataclass(frozen=True)
class Strategy:
    claim: Literal["sorted", "peek"] = "sorted"
    carry: bool = False
    idle: Literal["old", "new"] = "old"
    k: int = PEEK_K
    drop_on_loss: bool = True

    @property
    def name(self) -> str:
        claim = "sorted" if self.claim == "sorted" else f"peek k={self.k}"
        return f"{claim}{', continue' if self.carry else ''}, {self.idle} idle"


TODAY = Strategy()


@dataclass(frozen=True)
class Plan:
    """What one step does: runs ``seconds``, then ``outcome`` into ``phase`` (None: the
    workflow is over), free again after ``wait`` seconds (a relock)."""

    seconds: float
    outcome: StepOutcome
    phase: str | None
    wait: float = 0.0


StepFunc = Callable[[Doc], Plan]


@dataclass(frozen=True)
class Workload:
    name: str
    handlers: tuple[tuple[str, str, StepFunc], ...]  # (collection, phase, step)
    backlog: int = 0  # documents at t=0, in the first handler's phase
    arrivals: float = 0.0  # documents per second after t=0 (Poisson), from outside
    seconds: float | None = None  # how long it runs; None: until the backlog is done
    steps_per_doc: int = 1


def chain(collection: str, phases: Sequence[str], seconds: float) -> tuple[Any, ...]:
    """Handlers that advance through ``phases`` and end the workflow, ``seconds`` each."""
    nexts: list[str | None] = [*phases[1:], None]
    out = []
    for phase, nxt in zip(phases, nexts, strict=True):
        out.append((collection, phase, _advance(seconds, nxt)))
    return tuple(out)


def _advance(seconds: float, nxt: str | None) -> StepFunc:
    def step(_doc: Doc) -> Plan:
        return Plan(seconds, StepOutcome.ADVANCED, nxt)

    step.__qualname__ = f"advance_to_{nxt or 'end'}"
    return step


def waiting(collection: str, phase: str, seconds: float, relocks: int, wait: float) -> Any:
    """A handler that waits on something outside: relocks ``relocks`` times, ``wait``
    seconds each, then ends the workflow."""

    def step(doc: Doc) -> Plan:
        if doc.waits < relocks:
            return Plan(seconds, StepOutcome.RELOCKED, phase, wait)
        return Plan(seconds, StepOutcome.ADVANCED, None)

    return (collection, phase, step)


# -- the adapter -----------------------------------------------------------------------------


class Books:
    """Everything the simulation tells the real ``Scheduler`` and asks of it.

    Today's scheduler has no ``carry``: a continued step's claim budget is counted here
    (the same rule: at most ``budget`` claims of one document per tick), and its slot is
    kept by not reporting the step finished. With the ``new`` idle mode the one
    ``aggregate`` of the tick says which collections have work: the scheduler's probes
    and claims on the others are answered from it, without a command, until a step of
    this replica frees work (then they go to the server, as a wake-up makes them)."""

    def __init__(self, handlers: Sequence[Handler], max_concurrency: int, budget: int) -> None:
        self._sched = Scheduler(handlers, max_concurrency=max_concurrency, budget=budget)
        self._budget = budget
        self._uses: Counter[tuple[str, str]] = Counter()
        self._empty: set[str] = set()

    def tick(self, empty: set[str] | None = None) -> None:
        """A tick; ``empty``: the collections the tick's aggregate found nothing in."""
        self._sched.tick()
        self._uses.clear()
        self._empty = set(empty or ())

    def wake(self) -> None:
        self._sched.wake()
        self._empty.clear()

    def next(self) -> Probe | Claim | None:
        return self._sched.next()

    def known_empty(self, collection: str) -> bool:
        return collection in self._empty

    def probed(self, probe: Probe, found: bool) -> None:
        self._sched.probed(probe, found)

    def claimed(self, claim: Claim, doc_key: str | None) -> bool:
        if doc_key is not None:
            self._uses[(claim.handler.collection, doc_key)] += 1
        return self._sched.claimed(claim, doc_key)

    def carry(self, handler: Handler, doc_key: str) -> bool:
        key = (handler.collection, doc_key)
        if self._uses[key] >= self._budget:
            return False
        self._uses[key] += 1
        return True

    def finished(self, outcome: StepOutcome, *, carried: bool) -> None:
        if outcome.frees_work:
            self._empty.clear()
        if not carried:
            self._sched.finished(outcome)


# -- the replicas ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What the fleet sent and got, by what it was for."""

    steps: int = 0
    carried: int = 0
    docs_done: int = 0
    useful: Counter[str] = field(default_factory=Counter)
    wasted: Counter[str] = field(default_factory=Counter)
    housekeeping: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)


class Gate(Wait):
    """A result several processes wait for (one peek read shared by a replica's slots)."""

    def __init__(self) -> None:
        self._waiters: list[Callable[[Any], None]] = []

    def start(self, resume: Callable[[Any], None]) -> None:
        self._waiters.append(resume)

    def open(self, value: Any) -> None:
        waiters, self._waiters = self._waiters, []
        for resume in waiters:
            resume(value)


class Replica:
    def __init__(
        self,
        fleet: Fleet,
        rank: int,
        strategy: Strategy,
        max_concurrency: int,
        budget: int,
    ) -> None:
        rid = f"pod-{rank}"
        self.rank = rank
        self.fleet = fleet
        self.sim = fleet.sim
        self.server = fleet.server
        self.docs = fleet.server.docs
        self.rid = rid
        self.s = strategy
        self.max = max_concurrency
        registry = Registry(Settings.build(replica_id=rid, max_concurrency=max_concurrency))
        registration = Registration(registry, lambda _f: None, lambda _h: None)
        for collection, phase, func in fleet.workload.handlers:
            registration.phase(collection, phase)(func)
        self.handlers = list(registry.handlers)
        self.by_phase = {(h.collection, h.phase): h for h in self.handlers}
        self.collections = sorted({h.collection for h in self.handlers})
        self.books = Books(self.handlers, max_concurrency, budget)
        self.engaged = 0
        self.spread = zlib.crc32(rid.encode())
        self.candidates: dict[str, list[int]] = {}
        self.peeking: dict[str, Gate] = {}
        self.next_tick = 0.0
        self.stopped = False

    # -- ticks ---------------------------------------------------------------------------

    def start(self, at: float, housekeeping: bool) -> None:
        self.next_tick = at
        self.sim.at(at, self._tick, at)
        if housekeeping:  # the record is written as the replica starts, then refreshed
            self.sim.at(at, self._refresh)
            self.sim.at(at + CLOCK_REFRESH, self._hello)

    def _interval(self) -> float:
        if self.s.idle == "new":
            return TICK * (1 + self.fleet.rng.uniform(-JITTER, JITTER))
        return TICK

    def _tick(self, when: float) -> None:
        if self.stopped or when != self.next_tick:
            return  # a tick moved earlier (a due time) replaced this one
        self.next_tick = when + self._interval()
        self.sim.at(self.next_tick, self._tick, self.next_tick)
        if self.s.idle == "new":
            self.sim.spawn(self._aggregate())
        else:
            self.books.tick()
            self.pump()

    def _aggregate(self) -> Process:
        collections = self.collections
        phases = {
            c: [h.phase or "" for h in self.handlers if h.collection == c] for c in collections
        }

        def run(now: float) -> tuple[set[str], float | None]:
            found = {c for c in collections if any(self.docs.head(c, p, now) for p in phases[c])}
            dues = [self.docs.next_due(c, iter(phases[c]), now) for c in collections]
            known = [d for d in dues if d is not None]
            return found, min(known) if known else None

        found, due = yield self.server.command("aggregate", run, "aggregate")
        (self.fleet.tally.useful if found else self.fleet.tally.wasted)["probe"] += 1
        self.books.tick(set(collections) - found)
        self.pump()
        if not self.engaged and due is not None and due < self.next_tick:
            self.next_tick = max(due, self.sim.now)  # an idle replica sleeps until then
            self.sim.at(self.next_tick, self._tick, self.next_tick)

    def _refresh(self) -> None:
        if self.stopped:
            return
        self.fleet.tally.housekeeping["replica record"] += 1
        self.sim.spawn(self._send(self.server.command("update", lambda _n: None, "refresh")))
        self.sim.after(REFRESH, self._refresh)

    def _hello(self) -> None:
        if self.stopped:
            return
        self.fleet.tally.housekeeping["hello"] += 1
        self.sim.spawn(self._send(self.server.command("read", lambda _n: None, "hello")))
        self.sim.after(CLOCK_REFRESH, self._hello)

    def _send(self, command: Wait) -> Process:
        yield command

    # -- actions -------------------------------------------------------------------------

    def pump(self) -> None:
        """Free workers take the scheduler's next actions (the runners' worker loop)."""
        while self.engaged < self.max and not self.stopped:
            action = self.books.next()
            if action is None:
                return
            self.engaged += 1
            self.sim.spawn(self._act(action))

    def _act(self, action: Probe | Claim) -> Process:
        if isinstance(action, Probe):
            yield from self._probe(action)
        else:
            yield from self._claim_and_run(action)
        self.engaged -= 1
        self.pump()

    def _probe(self, probe: Probe) -> Process:
        if self.books.known_empty(probe.collection):
            self.books.probed(probe, False)
            return
        phases = [h.phase or "" for h in probe.handlers]

        def run(now: float) -> bool:
            return any(self.docs.head(probe.collection, p, now) for p in phases)

        found = yield self.server.command("read", run, "probe")
        (self.fleet.tally.useful if found else self.fleet.tally.wasted)["probe"] += 1
        self.books.probed(probe, bool(found))
        self.pump()

    def _claim_and_run(self, claim: Claim) -> Process:
        handler = claim.handler
        doc: Doc | None = None
        if not self.books.known_empty(handler.collection):
            if self.s.claim == "sorted":
                doc = yield from self._claim_sorted(handler)
            else:
                doc = yield from self._claim_peek(handler)
        throttled = self.books.claimed(claim, None if doc is None else str(doc.id))
        self.pump()
        if doc is None:
            return
        self.fleet.tally.latencies.append(self.sim.now - doc.due_since)
        yield from self._run(handler, doc, throttled)

    def _claim_sorted(self, handler: Handler) -> Any:
        phase = handler.phase or ""

        def run(now: float) -> Doc | None:
            return self.docs.claim_head(handler.collection, phase, now)

        doc = yield self.server.command("claim_sorted", run, "claim")
        (self.fleet.tally.useful if doc else self.fleet.tally.wasted)[
            "claim" if doc else "empty claim"
        ] += 1
        return doc

    def _claim_peek(self, handler: Handler) -> Any:
        """One claim: from this handler's list, read afresh when it is empty (at most one
        list per claim: one that runs out or loses its race too ends the claim empty)."""
        phase = handler.phase or ""
        collection = handler.collection
        tally = self.fleet.tally
        fresh = False  # this claim has read (or waited for) a list
        while True:
            candidates = self.candidates.get(handler.key)
            if not candidates:
                if fresh:
                    return None
                fresh = True
                gate = self.peeking.get(handler.key)
                if gate is not None:
                    if not (yield gate):
                        return None
                    continue
                gate = self.peeking[handler.key] = Gate()

                def peek(now: float) -> list[int]:
                    return self.docs.oldest(collection, phase, now, self.s.k)

                work = 1 + self.s.k * PEEK_PER_ID
                ids = yield self.server.command("read", peek, "peek", work)
                del self.peeking[handler.key]
                (tally.useful if ids else tally.wasted)["peek"] += 1
                if ids:
                    self.candidates[handler.key] = self._order(ids)
                gate.open(bool(ids))
                if not ids:
                    return None
                continue
            doc_id = candidates.pop(0)

            def claim(now: float, doc_id: int = doc_id) -> Doc | None:
                return self.docs.claim_id(doc_id, collection, phase, now)

            doc = yield self.server.command("claim_targeted", claim, "claim")
            if doc is not None:
                tally.useful["claim"] += 1
                return doc
            tally.wasted["lost race"] += 1
            if self.s.drop_on_loss:
                self.candidates.pop(handler.key, None)

    def _order(self, ids: list[int]) -> list[int]:
        """The order this replica tries a peek's ids in: from a place set by a hash of its
        id, so replicas holding the same list start apart."""
        turn = self.spread % len(ids)
        return ids[turn:] + ids[:turn]

    def _run(self, handler: Handler, doc: Doc, throttled: bool) -> Process:
        tally = self.fleet.tally
        while True:
            plan: Plan = handler.func(doc)
            yield self.sim.sleep(plan.seconds)
            nxt = None
            if plan.outcome.frees_work and plan.phase is not None:
                nxt = self.by_phase.get((doc.collection, plan.phase))
            carry = (
                self.s.carry
                and nxt is not None
                and not throttled
                and self.books.carry(nxt, str(doc.id))
            )
            until: float | None
            if carry:
                until = None
            elif plan.outcome is StepOutcome.RELOCKED:
                doc.waits += 1
                until = self.sim.now + plan.wait
            else:
                until = self.sim.now + TICK if throttled else EPOCH

            def write(
                now: float, phase: str | None = plan.phase, until: float | None = until
            ) -> None:
                self.docs.write(doc, now, phase, until)

            yield self.server.command("update", write, "continue" if carry else "release")
            tally.useful["release"] += 1
            tally.steps += 1
            if plan.phase is None:
                tally.docs_done += 1
            self.books.finished(plan.outcome, carried=carry)
            self.pump()
            if not carry or nxt is None:
                return
            tally.carried += 1
            tally.latencies.append(0.0)
            handler = nxt
            throttled = False


# -- the fleet -------------------------------------------------------------------------------


@dataclass
class Result:
    workload: str
    strategy: str
    replicas: int
    seconds: float
    tally: Tally
    commands: dict[str, int]
    retries: int
    utilisation: float
    p99_ms: float
    p50_ms: float

    @property
    def steps(self) -> int:
        return self.tally.steps

    def per_step(self, counter: Counter[str]) -> float:
        return sum(counter.values()) / max(self.steps, 1)

    @property
    def useful_per_step(self) -> float:
        return self.per_step(self.tally.useful)

    @property
    def wasted_per_step(self) -> float:
        """Empty claims, lost races, empty probes and peeks, and the server's retries."""
        return (sum(self.tally.wasted.values()) + self.retries) / max(self.steps, 1)

    @property
    def commands_per_step(self) -> float:
        """Every command sent (retries are inside the server: not commands)."""
        return sum(self.commands.values()) / max(self.steps, 1)

    def summary(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "strategy": self.strategy,
            "replicas": self.replicas,
            "seconds": round(self.seconds, 4),
            "steps": self.steps,
            "carried": self.tally.carried,
            "commands": dict(self.commands),
            "useful": dict(self.tally.useful),
            "wasted": {**self.tally.wasted, "retry": self.retries},
            "housekeeping": dict(self.tally.housekeeping),
            "commands_per_step": round(self.commands_per_step, 4),
            "useful_per_step": round(self.useful_per_step, 4),
            "wasted_per_step": round(self.wasted_per_step, 4),
            "utilisation": round(self.utilisation, 4),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "steps_per_s": round(self.steps / self.seconds, 2) if self.seconds else 0.0,
        }


class Fleet:
    def __init__(
        self,
        params: Params,
        workload: Workload,
        strategy: Strategy,
        replicas: int,
        *,
        seed: int = 1,
        max_concurrency: int = 4,
        budget: int = 100,
        housekeeping: bool = True,
    ) -> None:
        self.sim = Sim()
        self.server = Server(self.sim, params)
        self.workload = workload
        self.strategy = strategy
        self.rng = random.Random(seed)
        self.tally = Tally()
        first = workload.handlers[0]
        for _ in range(workload.backlog):
            self.server.docs.insert(first[0], first[1])
        self.replicas = [
            Replica(self, n, strategy, max_concurrency, budget) for n in range(replicas)
        ]
        for replica in self.replicas:
            at = self.rng.uniform(0, JITTER * TICK) if strategy.idle == "new" else 0.0
            replica.start(at, housekeeping)
        if workload.arrivals:
            self.sim.after(self.rng.expovariate(workload.arrivals), self._arrive)

    def _arrive(self) -> None:
        first = self.workload.handlers[0]
        self.server.docs.insert(first[0], first[1])
        self.sim.after(self.rng.expovariate(self.workload.arrivals), self._arrive)

    def run(self, limit: float = 3600.0) -> Result:
        workload = self.workload
        if workload.seconds is not None:
            self.sim.run(workload.seconds)
        else:
            target = workload.backlog

            def done() -> bool:
                return self.tally.docs_done >= target

            self.sim.run(limit, done)
            if not done():
                raise RuntimeError(f"{workload.name}: not drained after {limit} s")
        seconds = self.sim.now
        for replica in self.replicas:
            replica.stopped = True
        stats = self.server.stats
        latencies = sorted(self.tally.latencies)
        return Result(
            workload=workload.name,
            strategy=self.strategy.name,
            replicas=len(self.replicas),
            seconds=seconds,
            tally=self.tally,
            commands=dict(stats.commands),
            retries=stats.retries,
            utilisation=self._busy() / (self.server.p.cores * seconds) if seconds else 0.0,
            p99_ms=_quantile(latencies, 0.99) * 1e3,
            p50_ms=_quantile(latencies, 0.5) * 1e3,
        )

    def _busy(self) -> float:
        self.server.cores.sync()
        return self.server.cores.busy_s


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]


def simulate(
    params: Params, workload: Workload, strategy: Strategy, replicas: int, **options: Any
) -> Result:
    return Fleet(params, workload, strategy, replicas, **options).run()
