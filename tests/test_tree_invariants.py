"""A randomized, stateful test of what trees and events promise, across replicas of both
engines that tick in any order, lose writes and their replies (a replica that dies between
a child's last write and its parent's wake among them), and let time pass:

- no child is made twice (one per name, owned by its parent);
- no parent resumes before its condition holds (its children ended: all, or any);
- none waits after it holds, beyond one lock timeout and a tick;
- no signal is lost or reaches another document; a waiter resumes with one sent to it.

Hypothesis drives one in-memory database and one ``FakeClock``; the handlers record what
they saw when they ran, and the invariants read the documents.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pymongo.database import Database

from orchestrator import (
    AsyncOrchestrator,
    ExponentialBackoff,
    Operations,
    OperatorError,
    Orchestrator,
    OrchestratorError,
    StoreError,
)
from orchestrator.core.trees import OWNER_FIELD, SENT_FIELD, WAIT_FIELD, signals_of, taken_of
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.faults import Faults
from tests.cli_kit import publish

LOCK_TIMEOUT = 10
ENDED = ("Done", "Failed")


@dataclass
class Member:
    orch: Orchestrator | AsyncOrchestrator
    faults: Faults
    loop: asyncio.AbstractEventLoop | None = None

    def call(self, name: str, *args: Any) -> Any:
        method = getattr(self.orch, name)
        if self.loop is not None:
            return self.loop.run_until_complete(method(*args))
        return method(*args)

    def run_once(self) -> None:
        try:
            if self.loop is not None:
                assert isinstance(self.orch, AsyncOrchestrator)
                self.loop.run_until_complete(self.orch.run_once(heartbeat=False))
            else:
                assert isinstance(self.orch, Orchestrator)
                self.orch.run_once(heartbeat=False)
        except OrchestratorError:
            pass  # a write lost on purpose: the step is retried, or its lease expires


@dataclass
class Sent:
    sure: list[str] = field(default_factory=list)
    maybe: list[str] = field(default_factory=list)  # its reply was lost: it may have landed


class TreeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.db: Database[Any] = memory_database(clock=self.clock)
        self.members: list[Member] = []
        self.hold = False
        self.parents: dict[str, tuple[int, str]] = {}  # id: (children, need)
        self.waiters: list[str] = []
        self.sent: dict[str, Sent] = {}
        self.seq = 0
        self.violations: list[str] = []
        self.cancelled: set[str] = set()

    # -- the fleet ----------------------------------------------------------------------

    @initialize()
    def fleet(self) -> None:
        for index, engine in enumerate(("threaded", "async", "threaded")):
            faults = Faults(seed=index, clock=self.clock, delay=lambda s: None)
            options: dict[str, Any] = {
                "replica_id": f"pod-{index}",
                "lock_timeout": LOCK_TIMEOUT,
                "tick": 1.0,
                "clock_refresh": 1e6,
                "clock": self.clock,
                "max_concurrency": 1,  # one order of writes: hypothesis replays what it finds
            }
            loop = None
            if engine == "async":
                orch: Orchestrator | AsyncOrchestrator = AsyncOrchestrator(
                    faults.wrap(async_view(self.db)), **options
                )
                loop = asyncio.new_event_loop()
            else:
                orch = Orchestrator(faults.wrap(self.db), **options)
            self._workflow(orch)
            member = Member(orch, faults, loop)
            member.call("measure_clock")
            self.members.append(member)

    def teardown(self) -> None:
        for member in self.members:
            if member.loop is not None:
                member.loop.close()

    def _workflow(self, orch: Orchestrator | AsyncOrchestrator) -> None:
        machine = self
        quick = {"retry_policy": ExponentialBackoff(base=1, cap=4)}

        def make(lease: Any) -> Any:
            count, need = machine.parents[lease.doc["_id"]]
            for n in range(count):
                bad = lease.doc.get("bad") and n == 0
                slow = lease.doc.get("slow", False)
                lease.create_child("kids", f"k{n}", {"phase": "Work", "bad": bad, "slow": slow})
            return lease.wait_for_children(then="Made", need=need)

        def made(lease: Any) -> Any:
            parent = lease.doc["_id"]
            count, need = machine.parents[parent]
            ended = machine._ended(parent)
            early = (need == "all" and ended < count) or (need == "any" and count and not ended)
            if early and parent not in machine.cancelled:
                machine.violations.append(f"{parent} resumed with {ended} of {count} ended")
            return lease.advance("Done")

        def work(lease: Any) -> Any:
            if machine.hold or (lease.doc.get("slow") and lease.doc.get("relocks", 0) < 3):
                return lease.relock(5)
            if lease.doc.get("bad"):
                return lease.fail("bad child")
            return lease.advance("Done")

        def wait(lease: Any) -> Any:
            return lease.wait_for("go", then="Got")

        def got(lease: Any) -> Any:
            signal = lease.signal("go")
            mine = machine.sent.get(lease.doc["_id"], Sent())
            if signal is None or signal.payload not in [*mine.sure, *mine.maybe]:
                machine.violations.append(f"{lease.doc['_id']} resumed on {signal}")
            return lease.advance("Done")

        for collection, phase, func in (
            ("parents", "Make", make),
            ("parents", "Made", made),
            ("kids", "Work", work),
            ("waiters", "Wait", wait),
            ("waiters", "Got", got),
        ):
            func.__qualname__ = f"{collection}_{phase}"
            orch.phase(collection, phase, **quick)(func)

    def _ended(self, parent: str) -> int:
        kids = self.db["kids"].find({f"{OWNER_FIELD}.id": parent})
        return sum(1 for kid in kids if kid.get("phase") in ENDED)

    # -- what happens -------------------------------------------------------------------

    @rule(
        children=st.integers(0, 3),
        need=st.sampled_from(["all", "any"]),
        bad=st.booleans(),
        slow=st.booleans(),
    )
    def a_parent_is_submitted(self, children: int, need: str, bad: bool, slow: bool) -> None:
        """Its children fail (the first, ``bad``) or take three relocks (``slow``)."""
        parent = f"p{len(self.parents)}"
        self.parents[parent] = (children, need)
        self.db["parents"].insert_one({"_id": parent, "phase": "Make", "bad": bad, "slow": slow})

    @rule(waits=st.booleans())
    def a_waiter_is_submitted(self, waits: bool) -> None:
        waiter = f"w{len(self.waiters)}"
        self.waiters.append(waiter)
        self.db["waiters"].insert_one({"_id": waiter, "phase": "Wait" if waits else "Idle"})

    @rule(waiter=st.integers(0, 5))
    def an_idle_waiter_starts_waiting(self, waiter: int) -> None:
        if waiter < len(self.waiters):
            self.db["waiters"].update_one(
                {"_id": self.waiters[waiter], "phase": "Idle"}, {"$set": {"phase": "Wait"}}
            )

    @rule(which=st.integers(0, 2), waiter=st.integers(0, 6))
    def a_signal_is_sent(self, which: int, waiter: int) -> None:
        target = self.waiters[waiter] if waiter < len(self.waiters) else "nobody"
        self.seq += 1
        payload = f"{target}#{self.seq}"
        sent = self.sent.setdefault(target, Sent())
        try:
            self.members[which].call("signal", "waiters", target, "go", payload)
        except OperatorError:
            assert target == "nobody", f"a signal to {target} was refused"
            return
        except OrchestratorError:
            sent.maybe.append(payload)
            return
        assert target != "nobody", "a signal to no document was taken"
        sent.sure.append(payload)

    @rule(which=st.integers(0, 2))
    def tick(self, which: int) -> None:
        self.members[which].run_once()

    @rule(seconds=st.sampled_from([0.5, 1, 3, 11]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(
        which=st.integers(0, 2),
        applied=st.booleans(),
        operation=st.sampled_from(["update_one", "find_one_and_update", "insert_one", "find"]),
    )
    def the_next_operation_fails(self, which: int, applied: bool, operation: str) -> None:
        """The next such operation fails; ``applied``: after it landed (a lost reply). An
        ``update_one`` lost after a child's last step is the wake of its parent."""
        self.members[which].faults.fail_next(operation, applied=applied)

    @rule(parent=st.integers(0, 5), which=st.integers(0, 2))
    def an_operator_cancels_a_parent(self, parent: int, which: int) -> None:
        """Its children still going on are cancelled with it (the live replicas' records
        say which phases go on)."""
        if parent >= len(self.parents):
            return
        parent_id = f"p{parent}"
        publish(self.db, self.members[which].orch)  # its record, as start() writes it
        seen = self.db["parents"].find_one({"_id": parent_id})
        assert seen is not None
        working = self.db["kids"].count_documents({f"{OWNER_FIELD}.id": parent_id, "phase": "Work"})
        event("a cancel with children going on" if working else "a cancel with none going on")
        try:
            Operations(self.db).cancel("parents", seen, why="the machine says so")
        except (OperatorError, StoreError):
            return  # it ended, or moved meanwhile: refused as documented
        going_on = [
            kid["_id"]
            for kid in self.db["kids"].find({f"{OWNER_FIELD}.id": parent_id})
            if kid.get("phase") == "Work"
        ]
        assert not going_on, f"cancelling {parent_id} left {going_on} going on"
        self.cancelled.add(parent_id)

    @rule()
    def children_hold_or_go_on(self) -> None:
        self.hold = not self.hold

    @rule()
    def a_lock_timeout_and_ticks_pass(self) -> None:
        """After one lock timeout and a tick of each replica, nothing waits whose condition
        holds (the faults scripted meanwhile are spent by then)."""
        self.hold = False
        for _ in range(3):
            self.clock.advance(LOCK_TIMEOUT + 1)
            for member in self.members:
                member.run_once()
        for parent, (count, need) in self.parents.items():
            if parent in self.cancelled:
                continue
            doc = self.db["parents"].find_one({"_id": parent})
            assert doc is not None
            ended = self._ended(parent)
            met = ended >= count if need == "all" else (ended >= 1 or count == 0)
            assert not (doc.get(WAIT_FIELD) and met), f"{parent} still waits, {ended}/{count}"
        for waiter in self.waiters:
            doc = self.db["waiters"].find_one({"_id": waiter})
            assert doc is not None
            fresh = [s for s in signals_of(doc) if s.id not in taken_of(doc)]
            assert not (doc.get(WAIT_FIELD) and fresh), f"{waiter} still waits with a signal"

    # -- what must hold -----------------------------------------------------------------

    @invariant()
    def nothing_resumed_early_or_on_another_documents_signal(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def no_child_is_made_twice_and_each_is_its_parents(self) -> None:
        for parent, (count, _) in self.parents.items():
            kids = list(self.db["kids"].find({f"{OWNER_FIELD}.id": parent}))
            names = [kid[OWNER_FIELD]["name"] for kid in kids]
            assert len(names) == len(set(names)) <= count, (parent, names)
            assert all(kid["_id"] == f"parents/{parent}/{kid[OWNER_FIELD]['name']}" for kid in kids)

    @invariant()
    def no_signal_is_lost_or_delivered_elsewhere(self) -> None:
        for waiter in self.waiters:
            doc = self.db["waiters"].find_one({"_id": waiter})
            assert doc is not None
            sent = self.sent.get(waiter, Sent())
            count = doc.get(SENT_FIELD, 0)
            assert len(sent.sure) <= count <= len(sent.sure) + len(sent.maybe), (waiter, count)
            for signal in signals_of(doc):
                assert signal.payload in [*sent.sure, *sent.maybe], (waiter, signal)


TreeMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("TREE_EXAMPLES", "40")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTrees = TreeMachine.TestCase
