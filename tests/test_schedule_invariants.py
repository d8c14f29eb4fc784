"""A randomized, stateful test of what schedules promise: every fire time starts at most one
document, and every fire time a schedule passed is accounted for exactly once (started,
skipped, missed, coalesced, declined or failed; one may wait buffered), across replicas of
both engines that tick in any order, lose writes and their replies, jump their clocks,
are paused by an operator, hold their runs past the next fires, declare a schedule on
some replicas only, and roll a new spec out mid-run.

Hypothesis drives one in-memory database and one ``FakeClock``; each replica reads the
server's clock through a skewed view of it (a jump is an NTP step on that machine, seen
again at its next measurement). The invariants are judged from the documents alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pymongo.database import Database

from orchestrator import AsyncOrchestrator, Orchestrator, OrchestratorError
from orchestrator.core.fire_times import Cron, Every, FireTimes
from orchestrator.core.queries import schedules as queries
from orchestrator.core.schedules import SCHEDULED_FIELD, run_id
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.faults import Faults

SCHEDULES = "orchestrator.schedules"
COUNTED = ("started", "skipped", "missed", "coalesced", "declined", "failed")


@dataclass
class Declaration:
    name: str
    times: FireTimes
    opts: dict[str, Any]
    everywhere: bool = True


DECLARED = [
    Declaration("a", Every(1), {"every": 1, "overlap": "allow_all", "catch_up": 5}),
    Declaration("b", Every(2), {"every": 2, "overlap": "skip", "catch_up": 60}),
    Declaration(
        "c", Every(5), {"every": 5, "overlap": "buffer_one", "coalesce": True, "catch_up": 30}
    ),
    Declaration(
        "d", Cron("*/7 * * * * *"), {"cron": "*/7 * * * * *", "overlap": "cancel_previous"}, False
    ),
]
ROLLED = Declaration("b", Every(3), {"every": 3, "overlap": "skip", "catch_up": 60})


@dataclass
class Segment:
    """The fire times of one spec a schedule went through: from ``first`` until the next
    spec took over (``end``: the stored next fire then; None while in force)."""

    times: FireTimes
    first: datetime
    end: datetime | None = None


@dataclass
class Member:
    orch: Orchestrator | AsyncOrchestrator
    view: Any
    faults: Faults
    loop: asyncio.AbstractEventLoop | None = None
    declares: set[str] = field(default_factory=set)

    def run_once(self) -> None:
        try:
            if isinstance(self.orch, AsyncOrchestrator):
                assert self.loop is not None
                self.loop.run_until_complete(self.orch.run_once(heartbeat=False))
            else:
                self.orch.run_once(heartbeat=False)
        except OrchestratorError:
            pass  # a write lost on purpose; the step is retried or its lease expires

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()


def aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class ScheduleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.db: Database[Any] = memory_database(clock=self.clock)
        self.members: list[Member] = []
        self.hold = False
        self.segments: dict[str, list[Segment]] = {}
        self.rolled = False
        self.stall: tuple[int, int] | None = None  # (stalling member, member that ticks)

    # -- the fleet ----------------------------------------------------------------------

    def _add(self, engine: str, declared: list[Declaration]) -> None:
        index = len(self.members)
        view = self.clock.skewed(0)
        faults = Faults(seed=index, clock=self.clock, delay=lambda s: None)
        options: dict[str, Any] = {
            "replica_id": f"pod-{index}",
            "lock_timeout": 10,
            "tick": 1.0,
            "clock_refresh": 5,
            "clock": view,
            # One worker: a step's writes and the faults scripted for them come in one
            # order, so hypothesis replays (and shrinks) what it found.
            "max_concurrency": 1,
        }
        loop = None
        if engine == "async":
            orch: Orchestrator | AsyncOrchestrator = AsyncOrchestrator(
                faults.wrap(async_view(self.db)), **options
            )
            loop = asyncio.new_event_loop()
        else:
            orch = Orchestrator(faults.wrap(self.db), **options)
        member = Member(orch, view, faults, loop)
        self._workflow(orch)
        for declaration in declared:
            self._declare(orch, declaration, index)
            member.declares.add(declaration.name)
        self.members.append(member)
        if loop is not None:
            assert isinstance(orch, AsyncOrchestrator)
            loop.run_until_complete(orch.measure_clock())
        else:
            assert isinstance(orch, Orchestrator)
            orch.measure_clock()

    def _workflow(self, orch: Orchestrator | AsyncOrchestrator) -> None:
        machine = self

        def make(lease: Any) -> Any:
            if machine.hold:
                return lease.relock(30)
            return lease.advance("Done")

        orch.phase("jobs", "Make")(make)

    def _declare(
        self, orch: Orchestrator | AsyncOrchestrator, declaration: Declaration, index: int
    ) -> None:
        machine = self

        def fire(at: datetime) -> dict[str, Any]:
            if machine.stall is not None and machine.stall[0] == index:
                # This step stalls past its lease: another replica takes the schedule and
                # ticks meanwhile; then this one goes on, its lease lost.
                other = machine.stall[1]
                machine.stall = None
                machine.clock.advance(12)
                machine.members[other].run_once()
            return {"phase": "Make"}

        fire.__qualname__ = f"fire_{declaration.name}"
        orch.schedule(declaration.name, "jobs", **declaration.opts)(fire)

    @initialize()
    def fleet(self) -> None:
        self._add("threaded", DECLARED)
        self._add("async", DECLARED)
        self._add("threaded", [d for d in DECLARED if d.everywhere])
        for member in self.members:
            member.run_once()  # each publishes its declarations (the first makes them)
        for declaration in DECLARED:
            doc = self.db[SCHEDULES].find_one({"_id": declaration.name})
            assert doc is not None
            self.segments[declaration.name] = [Segment(declaration.times, aware(doc["next"]))]

    def teardown(self) -> None:
        for member in self.members:
            member.close()

    # -- what happens -------------------------------------------------------------------

    @rule(which=st.integers(0, 5))
    def tick(self, which: int) -> None:
        self.members[which % len(self.members)].run_once()

    @rule(seconds=st.sampled_from([0.3, 1, 1, 2, 5, 11, 45, 400]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(which=st.integers(0, 5), seconds=st.sampled_from([-30, -3, 2, 20]))
    def a_clock_jumps(self, which: int, seconds: float) -> None:
        self.members[which % len(self.members)].view.step_wall(seconds)

    @rule(
        which=st.integers(0, 5),
        applied=st.booleans(),
        operation=st.sampled_from(["update_one", "find_one_and_update", "find"]),
    )
    def the_next_write_is_lost(self, which: int, applied: bool, operation: str) -> None:
        """The next such operation fails; ``applied``: after it landed (a lost reply)."""
        self.members[which % len(self.members)].faults.fail_next(operation, applied=applied)

    @rule(which=st.integers(0, 5), other=st.integers(1, 5))
    def a_step_stalls_past_its_lease(self, which: int, other: int) -> None:
        """The next fire function called on ``which`` stalls past the lock timeout while
        another replica ticks."""
        count = len(self.members)
        self.stall = (which % count, (which + other % (count - 1) + 1) % count)

    @rule()
    def runs_hold_or_finish(self) -> None:
        self.hold = not self.hold

    @rule(name=st.sampled_from(["a", "b", "c", "d"]), paused=st.booleans())
    def an_operator_pauses_or_resumes(self, name: str, paused: bool) -> None:
        self.db[SCHEDULES].update_one({"_id": name}, queries.pause_update(paused))

    @precondition(lambda self: not self.rolled)
    @rule()
    def a_new_spec_rolls_out(self) -> None:
        """A replica of the next deploy declares b every 3 s: from its first tick on, that
        spec fires, from the next fire time it names."""
        doc = self.db[SCHEDULES].find_one({"_id": "b"})
        assert doc is not None
        runs = list(self.db["jobs"].find({f"{SCHEDULED_FIELD}.name": "b"}))
        self._add("async", [ROLLED])
        self.members[-1].run_once()
        after = self.db[SCHEDULES].find_one({"_id": "b"})
        assert after is not None and after["spec"]["every"] == 3
        # Where the new spec goes on from: where the old one had got to, its stored next
        # fire or past the latest run a step submitted before its write was lost.
        reached = aware(doc["next"])
        fires = [aware(run[SCHEDULED_FIELD]["fire"]) for run in runs]
        if any(fire >= reached for fire in fires):
            following = self.segments["b"][-1].times.after(max(fires))
            assert following is not None
            reached = following
        first = ROLLED.times.after(reached - timedelta(microseconds=1))
        assert first is not None
        self.segments["b"][-1].end = reached
        self.segments["b"].append(Segment(ROLLED.times, first))
        self.rolled = True

    # -- what must hold -----------------------------------------------------------------

    @invariant()
    def one_document_per_fire_time_and_each_on_its_schedule(self) -> None:
        seen: set[tuple[str, datetime]] = set()
        for doc in self.db["jobs"].find({}):
            mark = doc[SCHEDULED_FIELD]
            name, fire = mark["name"], aware(mark["fire"])
            assert (name, fire) not in seen, f"{name} fired twice at {fire}"
            seen.add((name, fire))
            assert doc["_id"] == run_id(name, fire)
            assert any(_fires_at(s.times, fire) and fire >= s.first for s in self.segments[name]), (
                f"{name} fired at {fire}, no fire time of its specs"
            )

    @invariant()
    def every_fire_time_passed_is_accounted_for_once(self) -> None:
        for name, segments in self.segments.items():
            doc = self.db[SCHEDULES].find_one({"_id": name})
            assert doc is not None
            passed = 0
            for segment in segments:
                end = segment.end if segment.end is not None else aware(doc["next"])
                passed += _count(segment.times, segment.first, end)
            counts = doc.get("counts") or {}
            accounted = sum(counts.get(k, 0) for k in COUNTED)
            waiting = 1 if doc.get("buffered") is not None else 0
            assert accounted + waiting == passed, (name, counts, waiting, passed)
            started = self.db["jobs"].count_documents(
                {f"{SCHEDULED_FIELD}.name": name, f"{SCHEDULED_FIELD}.fire": {"$lt": doc["next"]}}
            )
            buffered = doc.get("buffered")
            if buffered is not None and self.db["jobs"].find_one(
                {"_id": run_id(name, aware(buffered))}
            ):
                started -= 1  # started by a step whose write was lost: counted when it lands
            assert counts.get("started", 0) == started, (name, counts, started)


def _fires_at(times: FireTimes, fire: datetime) -> bool:
    return times.after(fire - timedelta(microseconds=1)) == fire


def _count(times: FireTimes, first: datetime, end: datetime) -> int:
    count, fire = 0, first
    while fire < end:
        count += 1
        following = times.after(fire)
        assert following is not None
        fire = following
    return count


ScheduleMachine.TestCase.settings = settings(
    max_examples=int(__import__("os").environ.get("SCHEDULE_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedules = ScheduleMachine.TestCase
