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
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from orchestrator.core.outcomes import StepOutcome

if TYPE_CHECKING:
    from orchestrator.core.pauses import Pause
    from orchestrator.core.queries.claims import Matches
    from orchestrator.core.registry import Handler


@dataclass(frozen=True)
class Probe:
    """Read once which collections any of ``handlers`` could claim on now: an idle tick
    costs one read in all, not one claim per handler nor a read per collection.
    ``generation``, as for a claim: a probe that raced with a new tick or newly freed work
    idles no one; what it found is used all the same (work found stays work)."""

    handlers: tuple[Handler, ...]
    generation: int
    known: frozenset[int] = frozenset()
    """Positions in ``handlers`` of those known to have work (the latest answer found
    some, or their last claim took a document): not asked, since their claims go on while
    the probe is out and find out sooner; the due times still cover them. A busy replica's
    probe so reads what it does not know, not every handler's work again."""

    @property
    def collections(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.collection for h in self.handlers))

    def members(self, collection: str) -> tuple[Handler, ...]:
        """The handlers probed on ``collection``, in ``handlers``' order."""
        return tuple(h for h in self.handlers if h.collection == collection)

    def asked(self, collection: str) -> tuple[Handler, ...]:
        """``members`` whose work the probe asks about (none ``known``)."""
        return tuple(
            h
            for n, h in enumerate(self.handlers)
            if h.collection == collection and n not in self.known
        )

    def groups(self) -> list[tuple[str, Matches]]:
        """Per collection, the (match, exclusion) pairs of its handlers (what the store's
        probe reads); ``handlers`` is in that order."""
        return [(c, [(h.match, h.exclusion) for h in self.members(c)]) for c in self.collections]

    @staticmethod
    def of(handlers: Sequence[Handler], generation: int, known: Collection[Handler] = ()) -> Probe:
        """The probe of ``handlers``, ordered by collection as ``groups`` numbers them;
        ``known``: those of them known to have work."""
        collections = dict.fromkeys(h.collection for h in handlers)
        ordered = tuple(h for c in collections for h in handlers if h.collection == c)
        return Probe(ordered, generation, frozenset(n for n, h in enumerate(ordered) if h in known))


@dataclass(frozen=True)
class Due:
    """When a document of ``collection`` comes due if nobody writes (the server's time: a
    relock's wait, a retry's backoff or a lease running out), and its ``phase`` when the
    probe could read it as a string (None: any of the collection's handlers may be its)."""

    collection: str
    at: datetime
    phase: str | None = None

    def wakes(self, handler: Handler) -> bool:
        """Whether ``handler`` may be the one to claim it: same collection, and its phase
        (a handler bound to no phase, or a document whose phase is unknown, may be)."""
        return handler.collection == self.collection and (
            self.phase is None or handler.phase is None or handler.phase == self.phase
        )


@dataclass(frozen=True)
class Found:
    """A probe's answer: the handlers (positions in the probe's ``handlers``) with a
    document to claim now, and for each collection the earliest time a document of the
    others comes due (``dues``; none: none within the horizon)."""

    ready: frozenset[int]
    dues: tuple[Due, ...] = ()
    pauses: list[Pause] | None = None
    """The operators' pauses, when the probe read them too (None: it did not)."""
    live: int | None = None
    """How many replicas are live, when the probe counted them (None: it did not)."""

    @property
    def next_due(self) -> datetime | None:
        """The earliest of ``dues``, or None."""
        return min((d.at for d in self.dues), default=None)

    def earliest(self) -> list[Due]:
        """Per collection, its earliest due time (a collection may come with a lease's
        expiry and, while migrating, an in-house lease's), in time order."""
        first: dict[str, Due] = {}
        for due in self.dues:
            known = first.get(due.collection)
            if known is None or due.at < known.at:
                first[due.collection] = due
        return sorted(first.values(), key=lambda d: d.at)


DUE_WAKERS = 2
"""How many replicas of a fleet wake, on average, when a document comes due between two
ticks (``wakes_at_due``): one would do, two cover one that is busy; all of them would
race for the one document (the fleet model: 3x the commands per step at 200 replicas)."""


def wakes_at_due(live: int | None, draw: float) -> bool:
    """Whether this replica wakes at a due time its probe announced, ``draw`` a uniform
    random number in [0, 1): ``DUE_WAKERS`` of the ``live`` replicas on average, every
    one when the count is unknown or small."""
    return live is None or live <= DUE_WAKERS or draw < DUE_WAKERS / live


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
    times one document may be claimed (or carried on, ``carry``) in one tick before its
    releases wait a tick (``max_unlocks_per_tick``), so no handler, or set of handlers,
    can spin on it.

    A tick starts with one probe of every collection; only handlers whose collection has
    work then claim. Handlers known to have work (the latest answer found some, or their
    last claim took a document) go on claiming while a probe is out, and the probe does
    not ask about them (only their due times): a busy replica's tick reads little more
    than the pauses and the next due time. A local submit or a released document
    (``wake``, ``finished``) sends claims at once, without a probe: work is known to be
    there.
    """

    def __init__(self, handlers: Sequence[Handler], *, max_concurrency: int, budget: int) -> None:
        self._handlers = list(handlers)
        self._max = max_concurrency
        self._budget = budget
        self._busy = 0
        self._idle: set[int] = set()
        self._probe_due = False  # a probe is to be sent before any claim
        self._probing = False  # a probe is under way: claims wait for its answer
        self._claims: Counter[tuple[str, str]] = Counter()
        self._inflight: Counter[int] = Counter()  # claims under way, by handler
        self._hot: set[int] = set()  # handlers whose last claim found a document
        # Handlers the latest probe answer found work for (until a claim finds none): they
        # claim while the next probe is out, so a probe slower than the tick (a saturated
        # server) cannot hold every claim back behind probes that each answer too late.
        self._found: set[int] = set()
        # An answer that found work (or did not ask, work being known) is owed a claim
        # before the next probe: a replica of one worker, its probes slower than the tick,
        # would otherwise only ever probe.
        self._claim_owed = False
        self._generation = 0
        self._start = 0  # first handler of this tick: a new one each tick, for fairness
        self._cursor = 0
        self._stopping = False
        self._paused: frozenset[str] = frozenset()  # keys of handlers an operator paused
        self._limited: set[int] = set()  # idle for want of a slot of their limits only

    # -- what happened ------------------------------------------------------------------

    def register(self, handlers: Sequence[Handler]) -> None:
        """The handler list changed: registration only appends, so indexes stay valid."""
        self._handlers = list(handlers)
        self._idle.clear()
        self._limited.clear()

    def tick(self) -> None:
        """A new tick: due relocks and expired leases may be claimable now; budgets reset."""
        self._claims.clear()
        self._idle.clear()  # a failed probe leaves every handler to find out by claiming
        self._limited.clear()
        count = len(self._handlers)
        self._start = (self._start + 1) % count if count else 0
        self._cursor = self._start
        self.due()

    def due(self) -> None:
        """Work may have come due (each tick): probe again before claiming."""
        self._probe_due = True
        self._generation += 1

    def came_due(self, handlers: Sequence[Handler]) -> None:
        """A document ``handlers`` may claim is due now (a due time a probe announced came,
        or a local submit): they claim now (one claim at a time each, until one finds
        nothing), with no probe of everything; the others wait for what their own due
        times or the next tick say."""
        known = [self._handlers.index(h) for h in handlers if h in self._handlers]
        if known:
            self._idle.difference_update(known)
            self._generation += 1  # a claim that read before the due time idles no one

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
            self._limited.clear()
            self._generation += 1
        return True

    @property
    def paused(self) -> frozenset[str]:
        return self._paused

    def probed(self, probe: Probe, found: Found | None) -> None:
        """``found`` None: the probe failed; the claims will meet the same trouble and say
        so. Otherwise the handlers of collections without work are idle until something
        happens, and those of collections with work claim."""
        self._probing = False
        if found is None:
            return
        # An answer that raced with a tick or freed work idles no one (work may have come
        # since its read), but the work it found is still there for a claim to take.
        fresh = probe.generation == self._generation
        if probe.known:
            self._claim_owed = True
        for position, handler in enumerate(probe.handlers):
            if position in probe.known or handler not in self._handlers:
                continue  # not asked: its claims tell
            index = self._handlers.index(handler)
            if position in found.ready:
                self._idle.discard(index)
                self._found.add(index)
                self._claim_owed = True
                continue
            self._found.discard(index)
            if fresh:
                self._idle.add(index)
                self._limited.discard(index)  # no work: no slot would make it claim

    def claimed(self, claim: Claim, doc_key: str | None) -> bool:
        """A claim came back with a document (``doc_key``) or without one (None, also when
        it failed: that handler sits the rest of the tick out). Returns whether the
        document used its budget for this tick: its release must then wait a tick."""
        index = self._handlers.index(claim.handler)
        self._inflight[index] -= 1
        if doc_key is None:
            self._busy -= 1
            self._hot.discard(index)
            self._found.discard(index)
            if claim.generation == self._generation:
                self._idle.add(index)
            return False
        self._hot.add(index)
        key = (claim.handler.collection, doc_key)
        self._claims[key] += 1
        return self._claims[key] > self._budget

    def limited(self, handler: Handler) -> None:
        """``handler``'s claim was not sent for want of a free slot of its cluster-wide
        limits: it is idle (``claimed``, with no document) until the next tick, or until a
        step of this replica frees a slot of it (``unlimited``)."""
        if handler in self._handlers:
            self._limited.add(self._handlers.index(handler))

    def unlimited(self, handler: Handler) -> bool:
        """A step of this replica freed a slot of ``handler``'s limits: if only the limit
        kept it idle, it claims again now. Returns whether it does."""
        if handler not in self._handlers:
            return False
        index = self._handlers.index(handler)
        if index not in self._limited:
            return False
        self._limited.discard(index)
        if index not in self._idle:
            return False
        self._idle.discard(index)
        return True

    def carry(self, handler: Handler, doc_key: str) -> bool:
        """May the step that is freeing ``doc_key`` carry its lease on into ``handler``'s
        next step, in the same write, instead of releasing it to be claimed again? Not
        when stopping, when the handler is paused or not this replica's, when it has a
        cluster-wide limit (each of its steps takes a slot with its claim), or when the
        document used its budget for the tick (it is released then, and waits if claimed
        again). A yes counts as a claim of the document; its slot stays taken."""
        if not self._takes_on(handler):
            return False
        key = (handler.collection, doc_key)
        if self._claims[key] >= self._budget:
            return False
        self._claims[key] += 1
        return True

    def lend(self, handler: Handler) -> bool:
        """May a local submit create its document already leased to ``handler``'s next
        step here, so that it runs with no claim? Only with a slot free now, for a handler
        this replica claims for (not stopping, not paused, no cluster-wide limit: each of
        its steps takes a slot with its claim), and none of its work known to wait: what
        waits goes first, as a claim would take it. A yes takes the slot, as a claim does;
        ``unlent`` gives it back if the document was not created so."""
        if not self._takes_on(handler) or self._busy >= self._max:
            return False
        if self._known(self._handlers.index(handler)):
            return False
        self._busy += 1
        return True

    def _takes_on(self, handler: Handler) -> bool:
        """Whether a step of ``handler`` may start here without a claim (a carry, a lent
        submit): it is this replica's, not paused, under no cluster-wide limit (each of
        its steps takes a slot with its claim), and the replica is not stopping."""
        return not (
            self._stopping
            or handler.limits
            or handler.key in self._paused
            or handler not in self._handlers
        )

    def unlent(self) -> None:
        """The slot ``lend`` took is free again: the document was not created leased here
        (one of its unique key existed)."""
        self._busy -= 1

    def finished(self, outcome: StepOutcome, *, carried: bool = False, wakes: bool = True) -> None:
        """A step ended (or a claimed lease was handed back without running); ``carried``:
        its lease went on into the next step, which keeps the slot and frees no work for
        anyone else; ``wakes`` False: what it freed is nothing these handlers select."""
        if carried:
            return
        self._busy -= 1
        if outcome.frees_work and wakes:
            self._idle.clear()
            self._limited.clear()
            self._generation += 1

    # -- what to do ---------------------------------------------------------------------

    def next(self) -> Action | None:
        """The next action for a free worker, or None: nothing to do until something
        happens (capacity full, every handler idle or waiting for the probe under way, or
        stopping). While a probe is out, only handlers known to have work claim."""
        if self._stopping or self._busy >= self._max or not self._handlers:
            return None
        if self._probe_due and not self._probing and not self._owed_claim():
            self._probe_due = False
            members = [h for h in self._handlers if h.key not in self._paused]
            if members:
                self._probing = True
                known = [h for i, h in enumerate(self._handlers) if self._known(i)]
                return Probe.of(members, self._generation, known)
        count = len(self._handlers)
        for step in range(count):
            index = (self._cursor + step) % count
            handler = self._handlers[index]
            if not self._may_claim(index):
                continue
            if (self._probing or self._probe_due) and not self._known(index):
                continue  # not known to have work: the probe (out there, or next) will tell
            self._cursor = (index + 1) % count  # round robin: the next worker tries the next
            self._claim_owed = False
            self._busy += 1
            self._inflight[index] += 1
            return Claim(handler, self._generation)
        return None

    def _known(self, index: int) -> bool:
        """The handler is known to have work: the latest answer found some, or its last
        claim took a document."""
        return index in self._found or index in self._hot

    def _owed_claim(self) -> bool:
        """The latest answer found work (or work was known) that a claim may take now:
        that claim goes before the next probe."""
        if not self._claim_owed:
            return False
        self._claim_owed = any(self._may_claim(i) for i in self._found | self._hot)
        return self._claim_owed

    def _may_claim(self, index: int) -> bool:
        """The handler may be claimed for now, probes aside: not idle, not paused, and
        not known to lack work with a claim of it already out (one at a time finds out)."""
        if index in self._idle or self._handlers[index].key in self._paused:
            return False
        return not self._inflight[index] or index in self._hot

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def handlers(self) -> list[Handler]:
        return self._handlers

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
        active = [i for i, h in enumerate(self._handlers) if h.key not in self._paused]
        if self._probe_due and active:
            return False
        return all(i in self._idle for i in active)


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
