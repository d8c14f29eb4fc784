"""A modelled MongoDB primary for the fleet simulation (``bench.fleet``), and its clock.

Discrete events on one simulated clock: a command travels half a round trip, waits for a
ticket (reads and writes each have ``write_tickets`` of them, MongoDB's default of 128
each before 7.0), then for one of the primary's cores, runs its service time, and a write
waits for its majority commit before the reply travels back. What the documents do is in
``Documents``: a write attempt holds its document uncommitted for ``conflict_window_ms``
from its start; another write that reaches the same document inside that window meets a
WriteConflictException, which the server retries itself, unbounded, backing off as
mongo's ``logAndBackoff`` does (``src/mongo/util/log_and_backoff.cpp``, called from
``writeConflictRetry`` in ``src/mongo/db/concurrency/write_conflict_exception.h``): no
sleep for the first 4 attempts, then 1 ms up to the 10th, 5 ms up to the 100th, 10 ms
up to the 200th, 100 ms after. A retried sorted ``findAndModify`` runs its scan again.
Each retry is server work that completes nothing: the wasted work the model counts.

Modelling choices, stated once: a retrying write keeps its ticket while it backs off
(the operation is still in the server); an attempt's choice of document is made on the
snapshot it starts with; commands on one core are served first come, first served.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("read", "aggregate", "claim_sorted", "claim_targeted", "update")
"""Command kinds with their own service time: a ``find`` (probe, peek), an ``aggregate``
probe (``$unionWith`` over collections), a ``findAndModify`` sorted by the claim order, a
``findAndModify`` targeted by ``_id``, and an ``update`` by ``_id``."""
WRITES = frozenset({"claim_sorted", "claim_targeted", "update"})
REQUIRED = frozenset({"rtt_ms", "service_ms", "conflict_window_ms", "majority_commit_ms"})
OPTIONAL = frozenset({"write_tickets", "cores"})


@dataclass(frozen=True)
class Params:
    """The server's parameters (milliseconds). ``python -m bench contention``'s calibrate
    command writes them as JSON with these keys (``cores`` is not measured there: it is
    the primary's number of cores, optional, 8 unless given)."""

    rtt_ms: float
    service_ms: dict[str, float]
    conflict_window_ms: float
    majority_commit_ms: float
    write_tickets: int = 128
    cores: int = 8

    def __post_init__(self) -> None:
        missing = set(KINDS) - set(self.service_ms)
        extra = set(self.service_ms) - set(KINDS)
        if missing or extra:
            raise ValueError(
                f"service_ms needs exactly {', '.join(KINDS)}"
                + (f"; missing {', '.join(sorted(missing))}" if missing else "")
                + (f"; unknown {', '.join(sorted(extra))}" if extra else "")
            )
        numbers = [self.rtt_ms, self.conflict_window_ms, self.majority_commit_ms]
        if any(v < 0 for v in [*numbers, *self.service_ms.values()]):
            raise ValueError("times must not be negative")
        if self.write_tickets < 1 or self.cores < 1:
            raise ValueError("write_tickets and cores must be at least 1")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Params:
        keys = set(data)
        if not keys >= REQUIRED or not keys <= REQUIRED | OPTIONAL:
            raise ValueError(
                f"server parameters need {', '.join(sorted(REQUIRED))}"
                f" (optional: {', '.join(sorted(OPTIONAL))}); got {', '.join(sorted(keys))}"
            )
        return cls(
            rtt_ms=float(data["rtt_ms"]),
            service_ms={k: float(v) for k, v in dict(data["service_ms"]).items()},
            conflict_window_ms=float(data["conflict_window_ms"]),
            majority_commit_ms=float(data["majority_commit_ms"]),
            write_tickets=int(data.get("write_tickets", 128)),
            cores=int(data.get("cores", 8)),
        )

    @classmethod
    def load(cls, path: Path) -> Params:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


MONGODB = Params(
    rtt_ms=0.5,
    service_ms={
        "read": 0.08,
        "aggregate": 0.25,
        "claim_sorted": 0.2,
        "claim_targeted": 0.12,
        "update": 0.1,
    },
    conflict_window_ms=0.2,
    majority_commit_ms=2.0,
)
"""A replica-set primary in one region, until ``python -m bench contention`` measures
one: in-region round trip 0.5 ms, indexed commands of 0.1-0.25 ms of one core each, a
conflict window the length of a claim, majority commit 2 ms (one secondary's apply and
acknowledgement), 128 tickets, 8 cores."""


def backoff_s(attempt: int) -> float:
    """mongo's ``logAndBackoff`` after failed attempt ``attempt`` (0 the first)."""
    if attempt < 4:
        return 0.0
    if attempt < 10:
        return 0.001
    if attempt < 100:
        return 0.005
    if attempt < 200:
        return 0.010
    return 0.100


# -- the clock ---------------------------------------------------------------------------------


class Wait:
    """What a process yields to be resumed later: ``start`` gets the function to call with
    the value the process resumes with."""

    def start(self, resume: Callable[[Any], None]) -> None:
        raise NotImplementedError


Process = Generator[Wait, Any, None]


@dataclass
class Sleep(Wait):
    sim: Sim
    seconds: float

    def start(self, resume: Callable[[Any], None]) -> None:
        self.sim.after(self.seconds, resume, None)


class Sim:
    """Events in time order (ties in the order they were scheduled): deterministic."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (max(when, self.now), next(self._seq), fn, args))

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def sleep(self, seconds: float) -> Sleep:
        return Sleep(self, seconds)

    def spawn(self, process: Process) -> None:
        self._resume(process, None)

    def _resume(self, process: Process, value: Any) -> None:
        try:
            wait = process.send(value)
        except StopIteration:
            return
        wait.start(lambda result: self._resume(process, result))

    def run(self, until: float, done: Callable[[], bool] = lambda: False) -> None:
        """Run the events before ``until`` seconds, or until ``done()`` after an event."""
        while self._events and self._events[0][0] < until:
            self.now, _, fn, args = heapq.heappop(self._events)
            fn(*args)
            if done():
                return
        self.now = max(self.now, until)


# -- the documents -----------------------------------------------------------------------------

NULL = -2.0  # lockedUntil missing (a new document): sorts first
EPOCH = -1.0  # released at once: sorts before any real time


class Conflict(Exception):
    """A WriteConflictException: the server retries the attempt."""


@dataclass(eq=False)
class Doc:
    id: int
    collection: str
    phase: str
    locked_until: float = NULL  # NULL, EPOCH or a time
    updated_at: float = 0.0
    due_since: float = 0.0
    held: bool = False  # a committed claim holds it (it is off the free list)
    pending: bool = False  # an uncommitted write holds it: another write conflicts
    step: int = 0  # steps done (the workload's state)
    waits: int = 0  # relocks done in this phase

    def key(self) -> tuple[float, float, int]:
        return (self.locked_until, self.updated_at, self.id)


class Documents:
    """Every document, and per (collection, phase) the free ones in claim order
    (``lockedUntil``, ``updatedAt``), as the claim index serves them."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.opened: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        """The writes of the attempt under way, applied when it commits (``Server``)."""
        self.docs: dict[int, Doc] = {}
        self._free: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
        self._ids = itertools.count()

    def insert(self, collection: str, phase: str) -> Doc:
        doc = Doc(next(self._ids), collection, phase, NULL, self.sim.now, self.sim.now)
        self.docs[doc.id] = doc
        bisect.insort(self._queue(doc), doc.key())
        return doc

    def _queue(self, doc: Doc) -> list[tuple[float, float, int]]:
        return self._free.setdefault((doc.collection, doc.phase), [])

    def _due(self, key: tuple[float, float, int], now: float) -> bool:
        return key[0] <= now

    def head(self, collection: str, phase: str, now: float) -> Doc | None:
        queue = self._free.get((collection, phase))
        if not queue or not self._due(queue[0], now):
            return None
        return self.docs[queue[0][2]]

    def due_count(self, collection: str, phase: str, now: float) -> int:
        """How many free documents of ``phase`` are due now."""
        queue = self._free.get((collection, phase), [])
        return bisect.bisect_right(queue, (now, float("inf"), 0))

    def oldest(self, collection: str, phase: str, now: float, k: int) -> list[int]:
        """The ids of the ``k`` first free documents due now, in claim order."""
        queue = self._free.get((collection, phase), [])
        out = []
        for key in queue[:k]:
            if not self._due(key, now):
                break
            out.append(key[2])
        return out

    def next_due(self, collection: str, phases: Iterable[str], now: float) -> float | None:
        """The earliest future ``lockedUntil`` among these phases' free documents."""
        best: float | None = None
        for phase in phases:
            queue = self._free.get((collection, phase), [])
            at = bisect.bisect_right(queue, (now, float("inf"), 0))
            if at < len(queue) and (best is None or queue[at][0] < best):
                best = queue[at][0]
        return best

    def _commit(self, fn: Callable[..., None], *args: Any) -> None:
        self.opened.append((fn, args))

    def claim_head(self, collection: str, phase: str, now: float) -> Doc | None:
        """A sorted ``findAndModify``: the first free document due, unless another write
        holds it uncommitted (``Conflict``: the server retries the whole command)."""
        doc = self.head(collection, phase, now)
        if doc is not None:
            self._take(doc, now)
        return doc

    def claim_id(self, doc_id: int, collection: str, phase: str, now: float) -> Doc | None:
        """A ``findAndModify`` by ``_id`` that re-checks phase and lease: None when the
        document was taken (or moved on) first, a lost race."""
        doc = self.docs.get(doc_id)
        if doc is None or doc.collection != collection:
            return None
        if doc.pending:
            raise Conflict
        if doc.held or doc.phase != phase or doc.locked_until > now:
            return None
        self._take(doc, now)
        return doc

    def _take(self, doc: Doc, now: float) -> None:
        if doc.pending:
            raise Conflict
        doc.pending = True
        self._commit(self._taken, doc)

    def _taken(self, doc: Doc) -> None:
        doc.pending = False
        queue = self._queue(doc)
        del queue[bisect.bisect_left(queue, doc.key())]
        doc.held = True

    def write(self, doc: Doc, now: float, phase: str | None, until: float | None) -> None:
        """A holder's write: into ``phase`` (None: the document leaves the workflow), free
        from ``until`` (None: the lease goes on, as a continued step's write does)."""
        doc.pending = True
        self._commit(self._written, doc, phase, until)

    def _written(self, doc: Doc, phase: str | None, until: float | None) -> None:
        now = self.sim.now
        doc.pending = False
        if phase is None:
            del self.docs[doc.id]
            return
        if phase != doc.phase:
            doc.updated_at = now
            doc.waits = 0
        doc.phase = phase
        if until is None:
            return
        doc.held = False
        doc.locked_until = until
        doc.due_since = max(now, until)
        bisect.insort(self._queue(doc), doc.key())


# -- the server --------------------------------------------------------------------------------


@dataclass
class Command(Wait):
    """One command: ``run(now)`` is its effect on the documents at an attempt's start
    (raising ``Conflict`` for the server to retry); the process resumes with its result."""

    server: Server
    kind: str
    run: Callable[[float], Any]
    label: str = ""
    work: float = 1.0
    sorts: tuple[str, str] | None = None  # a sorted claim's (collection, phase)
    attempts: int = 0
    result: Any = None
    conflicted: bool = False
    started: float = 0.0
    commits: list[tuple[Callable[..., None], tuple[Any, ...]]] = field(default_factory=list)
    resume: Callable[[Any], None] | None = None

    def start(self, resume: Callable[[Any], None]) -> None:
        self.resume = resume
        self.server.send(self)


@dataclass
class ServerStats:
    commands: Counter[str] = field(default_factory=Counter)  # by label (or kind)
    retries: int = 0  # attempts lost to write conflicts, retried in the server
    retry_busy_s: float = 0.0  # of which on attempts that conflicted
    latency: dict[str, list[float]] = field(default_factory=dict)


class Cores:
    """The primary's cores, shared equally by the attempts under way (processor sharing:
    with more attempts than cores each one's service time stretches, as the OS shares
    cores between the server's threads). ``done`` is called as each attempt ends."""

    def __init__(self, sim: Sim, cores: int, done: Callable[[Command], None]) -> None:
        self.sim = sim
        self.cores = cores
        self.done = done
        self.busy_s = 0.0
        self._v = 0.0  # work one attempt has received since the start
        self._t = 0.0
        self._running: list[tuple[float, int, Command]] = []
        self._seq = itertools.count()
        self._generation = 0

    def _rate(self) -> float:
        n = len(self._running)
        return min(1.0, self.cores / n) if n else 0.0

    def sync(self) -> None:
        elapsed = self.sim.now - self._t
        self._v += elapsed * self._rate()
        self.busy_s += elapsed * min(len(self._running), self.cores)
        self._t = self.sim.now

    def add(self, cmd: Command, work: float) -> None:
        self.sync()
        heapq.heappush(self._running, (self._v + work, next(self._seq), cmd))
        self._schedule()

    def _schedule(self) -> None:
        self._generation += 1
        if self._running:
            delay = (self._running[0][0] - self._v) / self._rate()
            self.sim.after(max(delay, 0.0), self._fire, self._generation)

    def _fire(self, generation: int) -> None:
        if generation != self._generation:
            return  # the number sharing the cores changed since: rescheduled
        self.sync()
        ended = []
        while self._running and self._running[0][0] <= self._v + 1e-12:
            ended.append(heapq.heappop(self._running)[2])
        self._schedule()
        for cmd in ended:
            self.done(cmd)


class Server:
    """The primary: tickets, cores, conflicts and their retries, majority commit.

    An attempt chooses its document on the snapshot it starts with, and holds it
    uncommitted until it ends (at least ``conflict_window_ms`` after its start): a write
    attempt that chooses a document held so meets a write conflict, spends its service
    time, backs off (keeping its ticket) and starts again."""

    def __init__(self, sim: Sim, params: Params, sort_ms_per_match: float = 0.0) -> None:
        """``sort_ms_per_match``: a store without the claim index (the in-memory one, the
        wire server) sorts every document a claim's filter matches; MongoDB reads the
        index in order, and its claim costs the same however long the queue."""
        self.sim = sim
        self.p = params
        self.sort_ms = sort_ms_per_match
        self.docs = Documents(sim)
        self.stats = ServerStats()
        self.cores = Cores(sim, params.cores, self._ended)
        self._tickets = {"read": params.write_tickets, "write": params.write_tickets}
        self._ticket_queue: dict[str, deque[Command]] = {"read": deque(), "write": deque()}
        self._sent: dict[int, float] = {}
        self._window = params.conflict_window_ms / 1e3

    def command(
        self,
        kind: str,
        run: Callable[[float], Any],
        label: str = "",
        work: float = 1.0,
        sorts: tuple[str, str] | None = None,
    ) -> Command:
        """``work``: its service time as a multiple of its kind's (a read of many ids);
        ``sorts``: the queue a sorted claim sorts (``sort_ms_per_match``)."""
        return Command(self, kind, run, label or kind, work, sorts)

    def send(self, cmd: Command) -> None:
        self.stats.commands[cmd.label] += 1
        self._sent[id(cmd)] = self.sim.now
        self.sim.after(self.p.rtt_ms / 2e3, self._arrive, cmd)

    def _pool(self, cmd: Command) -> str:
        return "write" if cmd.kind in WRITES else "read"

    def _arrive(self, cmd: Command) -> None:
        pool = self._pool(cmd)
        if self._tickets[pool]:
            self._tickets[pool] -= 1
            self._attempt(cmd)
        else:
            self._ticket_queue[pool].append(cmd)

    def _attempt(self, cmd: Command) -> None:
        service = self.p.service_ms[cmd.kind] / 1e3 * cmd.work
        if self.sort_ms and cmd.sorts is not None:
            matched = self.docs.due_count(*cmd.sorts, self.sim.now)
            service += self.sort_ms / 1e3 * matched
        self.docs.opened = []
        cmd.started = self.sim.now
        try:
            cmd.result = cmd.run(self.sim.now)
            cmd.conflicted = False
        except Conflict:
            cmd.conflicted = True
            self.stats.retries += 1
            self.stats.retry_busy_s += service
        cmd.commits, self.docs.opened = self.docs.opened, []
        self.cores.add(cmd, service)

    def _ended(self, cmd: Command) -> None:
        if cmd.conflicted:
            wait = backoff_s(cmd.attempts)
            cmd.attempts += 1
            self.sim.after(wait, self._attempt, cmd)
            return
        if cmd.commits:
            self.sim.at(cmd.started + self._window, self._commit, cmd)
        else:
            self._commit(cmd)

    def _commit(self, cmd: Command) -> None:
        for fn, args in cmd.commits:
            fn(*args)
        pool = self._pool(cmd)
        if self._ticket_queue[pool]:
            self._attempt(self._ticket_queue[pool].popleft())
        else:
            self._tickets[pool] += 1
        commit = self.p.majority_commit_ms / 1e3 if cmd.kind in WRITES else 0.0
        self.sim.after(commit + self.p.rtt_ms / 2e3, self._reply, cmd)

    def _reply(self, cmd: Command) -> None:
        took = self.sim.now - self._sent.pop(id(cmd))
        self.stats.latency.setdefault(cmd.label, []).append(took)
        if cmd.resume is not None:
            cmd.resume(cmd.result)
