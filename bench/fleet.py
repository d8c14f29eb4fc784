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
  lost race, which drops the list (it is stale); an empty list is read again, at most
  once per claim.
- ``carry`` (continue): a step whose outcome frees its document for a handler of this
  same replica writes its outcome with a renewed lease, and the next step runs without a
  claim when the scheduler allows it (its per-document budget).
- idle ``new`` (the engines now): the tick's one probe, an ``aggregate`` over every
  collection, which also returns each collection's earliest future due time (that
  collection's handlers claim then, if before the next tick, with no probe); ticks up to
  ``tick_jitter`` late, a replica's first at a random point of its first tick; the replica
  record written every ``RECORD_INTERVAL``. ``old`` (before issue 19), the command pattern
  of the engines as they were, answered to today's scheduler: the tick's probe is one ``find`` per
  collection with several handlers, while a single-handler collection is probed by its
  claim (an empty ``findAndModify`` when idle); ticks aligned, the record written every
  lock_timeout / 6, no wake at a due time, every released step waking the idle handlers.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from bench.model import EPOCH, Doc, Params, Process, Server, Sim, Wait
from orchestrator.core import replicas as records
from orchestrator.core import scheduler, sharding, steps
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler, Registry
from orchestrator.core.scheduler import Claim, Found, Probe, Scheduler
from orchestrator.core.settings import Settings
from orchestrator.runners.registration import Registration

DEFAULTS = Settings.build()
TICK = DEFAULTS.tick
JITTER = DEFAULTS.tick_jitter
"""Each tick of the ``new`` mode comes up to this fraction of a tick late."""
REFRESH = {
    "old": DEFAULTS.lock_timeout / 6,
    "new": records.RECORD_INTERVAL,
}
"""How often a started replica writes its replica record (an update), before and now."""
CLOCK_REFRESH = Settings.model_fields["clock_refresh"].default
"""And measures the server's clock with ``hello`` this often (a read)."""
PEEK_K = DEFAULTS.claim_candidates
PEEK_PER_ID = 1 / 50
"""A peek's service time grows with the ids it reads: each costs this share of a read's
(an index key and a document examined, an id returned: ~1.6 us beside ~80 us of a
command), so a peek of 50 ids costs two reads."""


@dataclass(frozen=True)
class Strategy:
    claim: Literal["sorted", "peek"] = "sorted"
    carry: bool = True
    idle: Literal["old", "new"] = "new"
    k: int = PEEK_K
    jitter: bool = True  # ``new`` ticks jittered (``run_once`` by hand: aligned)
    wake_at_due: bool = True  # ``new``: claim at the due time a probe announced
    count_wakers: bool = True  # ``DUE_WAKERS`` of the live replicas wake, as the engines do

    @property
    def name(self) -> str:
        claim = "sorted" if self.claim == "sorted" else f"peek k={self.k}"
        return f"{claim}{', continue' if self.carry else ''}, {self.idle} idle"


BEFORE = Strategy(carry=False, idle="old", jitter=False)
"""The engines before issue 19: sorted claims, no continuation, the old idle pattern."""
NOW = Strategy()
"""The engines now (main): sorted claims, continuation, one probe per tick."""


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
    backlog: int = 0  # documents at ``at`` seconds, in the first handler's phase
    at: float = 0.0
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
    """Everything the simulation tells the real ``Scheduler`` and asks of it, as the
    engines' books do (``orchestrator.runners.books``)."""

    def __init__(self, handlers: Sequence[Handler], max_concurrency: int, budget: int) -> None:
        self._sched = Scheduler(handlers, max_concurrency=max_concurrency, budget=budget)

    @property
    def handlers(self) -> list[Handler]:
        return self._sched.handlers

    def tick(self) -> None:
        self._sched.tick()

    def came_due(self, handlers: Sequence[Handler]) -> None:
        self._sched.came_due(handlers)

    def next(self) -> Probe | Claim | None:
        return self._sched.next()

    def probed(self, probe: Probe, ready: set[int]) -> None:
        self._sched.probed(probe, Found(frozenset(ready)))

    def claimed(self, claim: Claim, doc_key: str | None) -> bool:
        return self._sched.claimed(claim, doc_key)

    def carry(self, collection: str, phase: str, doc_key: str) -> Handler | None:
        """``Books.reserve``: the handler this replica carries the document on into."""
        handler = steps.carry_target(self._sched.handlers, collection, phase)
        if handler is None or not self._sched.carry(handler, doc_key):
            return None
        return handler

    def finished(
        self, outcome: StepOutcome, collection: str, phase: str | None, *, carried: bool, old: bool
    ) -> None:
        """``Books.finished``: a release wakes the idle handlers only if one of them could
        take the document (before issue 19: always)."""
        # phase None: the workflow is over (its phase is one no handler takes)
        wakes = old or (phase is not None and steps.could_take(self.handlers, collection, phase))
        self._sched.finished(outcome, carried=carried, wakes=wakes)


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
        self.books = Books(self.handlers, max_concurrency, budget)
        self.engaged = 0
        self.spread = sharding.seed(rid)
        self.candidates: dict[str, sharding.Candidates] = {}
        self.base = 0.0
        # One wake at a due time per collection at once: the latest asked replaces it.
        self.due_tokens: dict[str, int] = {}
        self.deferred: int | None = None  # run_once: a tick waiting for the last one's end
        self.stopped = False

    # -- ticks ---------------------------------------------------------------------------

    def start(self, at: float, housekeeping: bool) -> None:
        self.base = at
        self.sim.at(at, self._tick, 0)
        if housekeeping:  # the record is written as the replica starts, then refreshed
            self.sim.at(at, self._refresh)
            self.sim.at(at + CLOCK_REFRESH, self._hello)

    def _tick(self, n: int) -> None:
        """Tick ``n``: on the schedule ``base + n x tick``, each up to the jitter late.
        Driven by ``run_once`` (the benchmark's figures), a tick waits for the last one's
        work to end."""
        if self.stopped:
            return
        if self.fleet.run_once and self.engaged:
            self.deferred = n
            return
        late = self.fleet.rng.uniform(0, JITTER * TICK) if self._jittered else 0.0
        self.sim.at(self.base + (n + 1) * TICK + late, self._tick, n + 1)
        self.books.tick()
        self.pump()

    @property
    def _jittered(self) -> bool:
        return self.s.idle == "new" and self.s.jitter

    def _due(self, collection: str, token: int) -> None:
        if token == self.due_tokens.get(collection) and not self.stopped:
            self.books.came_due([h for h in self.handlers if h.collection == collection])
            self.pump()

    def _refresh(self) -> None:
        if self.stopped:
            return
        self.fleet.tally.housekeeping["replica record"] += 1
        self.sim.spawn(self._send(self.server.command("update", lambda _n: None, "refresh")))
        self.sim.after(REFRESH[self.s.idle], self._refresh)

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
        if self.deferred is not None and not self.engaged:
            n, self.deferred = self.deferred, None
            self.base = self.sim.now - n * TICK  # the schedule restarts from here
            self._tick(n)

    def _probe(self, probe: Probe) -> Process:
        """The tick's probe: one ``aggregate`` (``new``), or as before issue 19."""
        if self.s.idle == "old":
            yield from self._probe_old(probe)
            return
        handlers = probe.handlers

        def run(now: float) -> tuple[set[int], dict[str, float]]:
            ready = {
                i
                for i, h in enumerate(handlers)
                if self.docs.head(h.collection, h.phase or "", now)
            }
            phases = {
                c: [h.phase or "" for h in handlers if h.collection == c] for c in probe.collections
            }
            dues = {c: self.docs.next_due(c, phases[c], now) for c in probe.collections}
            return ready, {c: d for c, d in dues.items() if d is not None}

        ready, dues = yield self.server.command("aggregate", run, "probe")
        (self.fleet.tally.useful if ready else self.fleet.tally.wasted)["probe"] += 1
        self.books.probed(probe, ready)
        live = len(self.fleet.replicas) if self.s.count_wakers else None
        if not self.s.wake_at_due or not scheduler.wakes_at_due(live, self.fleet.rng.random()):
            return
        # As the engine does: each collection's earliest due time wakes its handlers' claims.
        for collection, due in dues.items():
            if 0 < due - self.sim.now < TICK:
                token = self.due_tokens.get(collection, 0) + 1
                self.due_tokens[collection] = token
                self.sim.at(due, self._due, collection, token)

    def _probe_old(self, probe: Probe) -> Process:
        """A ``find`` per collection with several handlers; a single handler's collection
        is left to its claim (ready), as the scheduler before issue 19 did."""
        ready: set[int] = set()
        for collection, _matches in probe.groups():
            members = [i for i, h in enumerate(probe.handlers) if h.collection == collection]
            if len(members) == 1:
                ready.update(members)
                continue
            phases = [probe.handlers[i].phase or "" for i in members]

            def run(now: float, collection: str = collection, phases: list[str] = phases) -> bool:
                return any(self.docs.head(collection, p, now) for p in phases)

            found = yield self.server.command("read", run, "probe")
            (self.fleet.tally.useful if found else self.fleet.tally.wasted)["probe"] += 1
            if found:
                ready.update(members)
        self.books.probed(probe, ready)

    def _claim_and_run(self, claim: Claim) -> Process:
        handler = claim.handler
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

        queue = (handler.collection, phase)
        doc = yield self.server.command("claim_sorted", run, "claim", sorts=queue)
        (self.fleet.tally.useful if doc else self.fleet.tally.wasted)[
            "claim" if doc else "empty claim"
        ] += 1
        return doc

    def _claim_peek(self, handler: Handler) -> Any:
        """The engines' peek-then-claim (``AsyncStore.peek_claim``) on the library's own
        ``sharding.Candidates``: this handler's list, rotated by the replica's seed, read
        again (with as many more ids as this replica is claiming) when it is used up,
        older than a tick or has lost a race; at most ``PEEKS_PER_CLAIM`` lists a claim."""
        phase = handler.phase or ""
        collection = handler.collection
        tally = self.fleet.tally
        queue = self.candidates.setdefault(handler.key, sharding.Candidates())
        peeks = 0
        while True:
            candidate = queue.take(_when(self.sim.now), TICK)
            if candidate is None:
                if peeks == sharding.PEEKS_PER_CLAIM:
                    return None
                peeks += 1
                most = self.s.k + queue.claiming

                def peek(now: float, most: int = most) -> list[int]:
                    return self.docs.oldest(collection, phase, now, most)

                work = 1 + most * PEEK_PER_ID
                sent = queue.sent()
                try:
                    ids = yield self.server.command("read", peek, "peek", work)
                    (tally.useful if ids else tally.wasted)["peek"] += 1
                    listed = [{"_id": i} for i in ids]
                    candidate = queue.listed(sent, listed, self.spread, _when(self.sim.now))
                finally:
                    queue.over(sent)
                if candidate is None:
                    return None
            doc_id = int(candidate["_id"])

            def claim(now: float, doc_id: int = doc_id) -> Doc | None:
                return self.docs.claim_id(doc_id, collection, phase, now)

            doc = yield self.server.command("claim_targeted", claim, "claim")
            queue.done(candidate, lost=doc is None)
            if doc is not None:
                tally.useful["claim"] += 1
                return doc
            tally.wasted["lost race"] += 1

    def _run(self, handler: Handler, doc: Doc, throttled: bool) -> Process:
        tally = self.fleet.tally
        while True:
            plan: Plan = handler.func(doc)
            yield self.sim.sleep(plan.seconds)
            nxt = None
            if self.s.carry and plan.phase is not None and plan.outcome.frees_work:
                nxt = self.books.carry(doc.collection, plan.phase, str(doc.id))
            carry = nxt is not None
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

            # A release is an update; carrying the lease on, a findAndModify by _id.
            kind = "claim_targeted" if carry else "update"
            yield self.server.command(kind, write, "continue" if carry else "release")
            tally.useful["release"] += 1
            tally.steps += 1
            if plan.phase is None:
                tally.docs_done += 1
            self.books.finished(
                plan.outcome, doc.collection, plan.phase, carried=carry, old=self.s.idle == "old"
            )
            self.pump()
            if nxt is None:
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
    def __init__(  # noqa: PLR0913  the simulated fleet's knobs, keyword-only with defaults: simulate()'s callers name the one or two they vary
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
        run_once: bool = False,
        sort_ms_per_match: float = 0.0,
    ) -> None:
        self.sim = Sim()
        self.run_once = run_once
        self.server = Server(self.sim, params, sort_ms_per_match)
        self.workload = workload
        self.strategy = strategy
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.sim.at(workload.at, self._fill)
        self.replicas = [
            Replica(self, n, strategy, max_concurrency, budget) for n in range(replicas)
        ]
        for replica in self.replicas:
            jittered = strategy.idle == "new" and strategy.jitter
            replica.start(self.rng.uniform(0, TICK) if jittered else 0.0, housekeeping)
        if workload.arrivals:
            self.sim.after(self.rng.expovariate(workload.arrivals), self._arrive)

    def _fill(self) -> None:
        first = self.workload.handlers[0]
        for _ in range(self.workload.backlog):
            self.server.docs.insert(first[0], first[1])

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
        seconds = self.sim.now - workload.at
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


EPOCH_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def _when(seconds: float) -> datetime:
    """The simulated clock as the library's dates (its candidate lists' age)."""
    return EPOCH_TIME + timedelta(seconds=seconds)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]


def simulate(
    params: Params, workload: Workload, strategy: Strategy, replicas: int, **options: Any
) -> Result:
    return Fleet(params, workload, strategy, replicas, **options).run()
