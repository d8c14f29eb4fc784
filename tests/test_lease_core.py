"""What a lease decides, without I/O: ``LeaseCore`` (``orchestrator/core/lease.py``), which
``Lease`` and ``AsyncLease`` hold and send the writes of. Each outcome's write (and what
it refuses before writing), the checked policy waits, a failed attempt's record, and the
lease's life as a table (``orchestrator/core/lease_state.py``): which writes a lease may
still make in each state, under which fence, and where each answer leads.

The engines' tests show the same through a database; these are the mutation run's view
of the lease (``scripts/mutation``), so they call the core's methods the leases call."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from orchestrator import EPOCH, ConfigError, LeaseLost, Outcome
from orchestrator.core import history
from orchestrator.core.clock import ServerClock, bson_time
from orchestrator.core.in_house import InHouse
from orchestrator.core.lease import LeaseCore, PolicyError
from orchestrator.core.lease_state import (
    REFUSALS,
    TRANSITIONS,
    LeaseEvent,
    LeaseState,
    LeaseStateError,
    fire,
)
from orchestrator.core.lease_values import Grant
from orchestrator.core.outcomes import LeaseWrite
from orchestrator.core.queries import lease_writes
from orchestrator.core.registry import Registry, options
from orchestrator.core.settings import Settings
from orchestrator.testing import FakeClock

pytestmark = pytest.mark.pure

TOKEN = "t" * 32


class Fixed:
    """A backoff policy answering ``answer`` (raised, if an exception), and keeping what
    it was asked."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[dict[str, Any]] = []

    def wait(self, *, waited: float, count: int, lock_timeout: float) -> Any:
        self.asked.append({"waited": waited, "count": count, "lock_timeout": lock_timeout})
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def step(lease: Any) -> None:
    return None


def lease(
    doc: dict[str, Any] | None = None,
    *,
    throttled: bool = False,
    settings: Settings | None = None,
    taken_from: str | None = None,
    **opts: Any,
) -> LeaseCore[dict[str, Any]]:
    """A lease held on ``doc`` (in phase "Running") by a handler with options ``opts``,
    claimed now, on a server clock measured with no offset."""
    local = FakeClock()
    clock = ServerClock(local)
    clock.record(local.now(), local.monotonic(), local.monotonic(), local.now())
    settings = settings or Settings(tick=1, lock_timeout=30, max_wait=600, max_attempts=3)
    handler = Registry(settings).add(step, "jobs", {"phase": "Running"}, "Running", options(opts))
    now = clock.now()
    grant = Grant(
        doc={"_id": 7, "phase": "Running", **(doc or {})},
        token=TOKEN,
        claimed_at=now,
        expires_at=now + timedelta(seconds=settings.lock_timeout),
        taken_from=taken_from,
    )
    core: LeaseCore[dict[str, Any]] = LeaseCore(
        clock=clock, settings=settings, handler=handler, grant=grant
    )
    core.throttled = throttled
    return core


def now_of(core: LeaseCore[Any]) -> datetime:
    return core._clock.now()


# -- advance and the declared transitions ------------------------------------------------


def test_an_advance_to_a_declared_phase_writes_it_and_releases() -> None:
    core = lease(to=["Done", "Cancelled"])
    write, outcome = core.advance_write("Cancelled", {"reason": "asked"})
    assert outcome == Outcome("advanced", "Cancelled", None) and outcome.token == TOKEN
    assert (write.action, write.phase_change, write.next_phase) == ("advance", True, "Cancelled")
    assert write.until == EPOCH
    assert write.update["$set"]["phase"] == "Cancelled"
    assert write.update["$set"]["reason"] == "asked"
    assert write.update["$set"]["lastToken"] == TOKEN
    assert write.update["$set"]["lockedUntil"] == bson_time(EPOCH)


@pytest.mark.parametrize("phase", ["Elsewhere", "Running", "done"])
def test_an_advance_to_an_undeclared_phase_is_refused_before_any_write(phase: str) -> None:
    core = lease(to=("Done", "Cancelled"))
    with pytest.raises(ConfigError) as refused:
        core.advance_write(phase, {})
    assert f"may advance to ['Done', 'Cancelled'], not {phase!r}" in str(refused.value)
    assert core.held and core.outcome is None


def test_one_declared_phase_may_be_named_alone() -> None:
    core = lease(to="Done")
    assert core.handler.to == ("Done",)
    assert core.advance_write("Done", {})[0].next_phase == "Done"
    with pytest.raises(ConfigError, match="not 'Failed'"):
        core.advance_write("Failed", {})


def test_without_declared_transitions_any_phase_may_be_entered() -> None:
    core = lease()
    assert core.handler.to == ()
    assert core.advance_write("Anywhere", {})[0].next_phase == "Anywhere"


@pytest.mark.parametrize("phase", ["", "$set", None, 3])
def test_an_advance_needs_a_phase_name(phase: Any) -> None:
    with pytest.raises(ConfigError, match=r"advance\(\) needs a phase name"):
        lease().advance_write(phase, {})


# -- unlock, release and the per-tick budget ---------------------------------------------


def test_unlock_frees_the_document_at_once_with_its_fields() -> None:
    write, outcome = lease().unlock_write({"progress": 3})
    assert (
        outcome == Outcome("unlocked", "Running", None)
        and write.until == EPOCH
        and write.action == "unlock"
    )
    assert not write.phase_change
    assert write.update["$set"]["progress"] == 3
    assert write.update["$set"]["lastToken"] == TOKEN
    assert write.update["$unset"] == {"lockToken": ""}


def test_a_throttled_document_waits_the_relock_floor_whatever_the_outcome() -> None:
    core = lease(throttled=True, settings=Settings(tick=2, lock_timeout=30, min_relock=5))
    until = now_of(core) + timedelta(seconds=5)
    for write, outcome in (core.unlock_write({}), core.advance_write("Done", {})):
        assert (write.until, outcome.wait) == (until, 5.0)
        assert write.update["$set"]["lockedUntil"] == bson_time(until)
    write, outcome = core.release_write()
    assert (write.until, outcome.wait, write.action) == (until, 5.0, "release")
    assert outcome == Outcome("released", "Running", 5.0)


def test_an_outcome_may_not_set_the_lease_s_fields_or_operators() -> None:
    core = lease()
    with pytest.raises(ConfigError):
        core.unlock_write({"lockToken": "mine"})
    with pytest.raises(ConfigError):
        core.unlock_write({"$set": 1})


# -- relock and the checked policy waits --------------------------------------------------


def test_relock_asks_the_policy_with_the_time_in_phase_and_the_relock_count() -> None:
    policy = Fixed(42)
    core = lease({"relocks": 2}, relock_policy=policy)
    core.doc["updatedAt"] = now_of(core) - timedelta(seconds=100)
    write, outcome = core.relock_write(None, {"note": "x"})
    wait = outcome.wait
    assert policy.asked == [{"waited": 100.0, "count": 3, "lock_timeout": 30}]
    assert wait == 42.0 and write.action == "relock"
    assert write.until == now_of(core) + timedelta(seconds=42)
    assert write.update["$set"]["note"] == "x"
    assert write.update["$inc"] == {"relocks": 1}


def test_the_time_in_phase_falls_back_to_creation_and_is_never_negative() -> None:
    policy = Fixed(1)
    core = lease({"relocks": "junk"}, relock_policy=policy)
    core.doc["createdAt"] = now_of(core) - timedelta(seconds=9)
    core.relock_write(None, {})
    core.doc["createdAt"] = now_of(core) + timedelta(seconds=9)
    core.relock_write(None, {})
    del core.doc["createdAt"]
    core.relock_write(None, {})
    assert [a["waited"] for a in policy.asked] == [9.0, 0.0, 0.0]
    assert [a["count"] for a in policy.asked] == [1, 1, 1]  # a corrupt counter counts as 0


@pytest.mark.parametrize(("answer", "wait"), [(0, 1.0), (0.5, 1.0), (7.5, 7.5), (10**6, 600.0)])
def test_a_relock_wait_is_kept_between_the_floor_and_max_wait(answer: float, wait: float) -> None:
    assert lease(relock_policy=Fixed(answer)).relock_write(None, {})[1].wait == wait
    assert lease().relock_write(answer, {})[1].wait == wait


@pytest.mark.parametrize("wait", [-1, math.nan, math.inf, True, "5"])
def test_an_explicit_relock_wait_must_be_a_finite_number_of_seconds(wait: Any) -> None:
    with pytest.raises(ConfigError, match=r"relock\(wait=\.\.\.\) needs a finite number"):
        lease().relock_write(wait, {})


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (ValueError("boom"), "relock_policy raised ValueError: boom"),
        (None, "relock_policy returned None"),
        (-1, "relock_policy returned -1"),
        (math.nan, "relock_policy returned nan"),
        (math.inf, "relock_policy returned inf"),
        (False, "relock_policy returned False"),
    ],
)
def test_a_policy_that_raises_or_answers_no_wait_is_a_policy_error(answer: Any, says: str) -> None:
    with pytest.raises(PolicyError) as raised:
        lease(relock_policy=Fixed(answer)).relock_write(None, {})
    assert str(raised.value).startswith(says)


# -- a failed attempt's record ------------------------------------------------------------


def test_a_failed_attempt_below_max_attempts_retries_after_the_retry_policy() -> None:
    policy = Fixed(7)
    core = lease({"attempts": 1}, retry_policy=policy)
    planned = core.error_write("ValueError", "bad", permanent=False)
    assert planned.outcome == Outcome("retrying", "Running", 7.0)
    assert planned.outcome.token == TOKEN
    assert policy.asked[0]["count"] == 2
    first = planned.forms[0]
    assert first.action == "retry" and not first.phase_change
    assert first.until == now_of(core) + timedelta(seconds=7)
    assert first.update["$set"]["attempts"] == 2
    assert first.update["$set"]["lastError"]["type"] == "ValueError"
    assert first.update["$set"]["lastError"]["message"] == "bad"
    assert first.update["$set"]["lastError"]["phase"] == "Running"
    assert first.update["$set"]["lastToken"] == TOKEN


def test_the_last_attempt_or_a_permanent_error_moves_to_the_failed_phase() -> None:
    for core, permanent in ((lease({"attempts": 2}), False), (lease(), True)):
        planned = core.error_write("Failed", "gave up", permanent=permanent)
        assert planned.outcome == Outcome("failed", "Failed", None)
        write = planned.forms[0]
        assert (write.action, write.phase_change, write.next_phase) == ("fail", True, "Failed")
        assert write.until == EPOCH
        assert write.update["$set"]["phase"] == "Failed"
        assert write.update["$set"]["failedBy"] == core.handler.key
        assert write.update["$set"]["attempts"] == (3 if not permanent else 1)


def test_the_handler_s_failed_phase_and_max_attempts_override_the_settings() -> None:
    core = lease({"attempts": 3}, failed_phase="Broken", max_attempts=5)
    assert core.error_write("E", "m", permanent=False).outcome.action == "retrying"
    core = lease({"attempts": 4}, failed_phase="Broken", max_attempts=5)
    assert core.error_write("E", "m", permanent=False).outcome == Outcome("failed", "Broken")


def test_a_broken_retry_policy_still_counts_the_attempt_and_says_so() -> None:
    core = lease(retry_policy=Fixed(RuntimeError("down")))
    planned = core.error_write("E", "m", permanent=False)
    assert planned.outcome == Outcome("retrying", "Running", 30.0)  # the lock timeout
    message = planned.forms[0].update["$set"]["lastError"]["message"]
    assert message == "m [retry_policy raised RuntimeError: down; waiting 30s instead]"


def test_a_record_too_large_is_tried_cut_short_then_bare_then_not_at_all() -> None:
    planned = lease().error_write("E", "x" * 5000, permanent=False)
    whole, cut, bare, none = (w.update for w in planned.forms)
    assert whole["$set"]["lastError"]["message"] == "x" * 2000  # error_record's own cap
    assert cut["$set"]["lastError"]["message"] == (
        "x" * 200 + " [cut: the document is near 16 MiB]"
    )
    assert bare["$set"]["lastError"]["message"] == (
        "[not stored: the document is at the 16 MiB limit]"
    )
    assert bare["$unset"]["previousError"] == ""
    assert "previousError" not in whole.get("$unset", {})
    # The last stores no record and no history entry: the attempt counts at the limit.
    assert "lastError" not in none["$set"] and history.HISTORY_FIELD not in str(none)
    assert none["$unset"] == {"lockToken": "", "lastError": "", "previousError": ""}
    assert all(w.update["$set"]["attempts"] == 1 for w in planned.forms)
    assert all(w.update["$set"]["lastToken"] == TOKEN for w in planned.forms)


def test_every_outcome_with_a_history_entry_has_a_lighter_form_without_it() -> None:
    core = lease()
    unlock, _ = core.unlock_write({"x": 1})
    [lighter] = unlock.lighter
    assert history.HISTORY_FIELD in str(unlock.update) and history.HISTORY_FIELD not in str(lighter)
    assert lighter == {
        op: {k: v for k, v in fields.items() if k != history.HISTORY_FIELD}
        for op, fields in unlock.update.items()
        if op != "$push"
    }
    assert unlock.forms == (unlock.update, lighter)
    for write in (core.relock_write(5, {})[0], core.advance_write("Next", {})[0]):
        assert len(write.forms) == 2 and history.HISTORY_FIELD not in str(write.lighter)
    planned = core.error_write("E", "m", permanent=True)
    assert [len(w.forms) for w in planned.forms] == [2, 2, 1, 1]


# -- the state machine --------------------------------------------------------------------


def test_a_held_lease_writes_under_its_token_and_a_phase_change_under_its_phase() -> None:
    core = lease()
    core.check(LeaseWrite.UNLOCK)
    assert core.fence(False) == {"_id": 7, "lockToken": TOKEN}
    assert core.fence(True) == {"_id": 7, "lockToken": TOKEN, "phase": "Running"}
    assert core.held and not core.lost


def test_after_its_outcome_a_lease_only_records_its_error_once() -> None:
    core = lease()
    write, _ = core.unlock_write({})
    first = Outcome("unlocked", "Running", None, TOKEN)
    core.landed(write, first)
    assert not core.held and not core.lost and core.outcome == first
    with pytest.raises(LeaseLost, match="already gave an outcome"):
        core.check(LeaseWrite.ADVANCE)
    core.check(LeaseWrite.RECORD, after=True)
    assert core.fence(False) == lease_writes.released_fence(7, TOKEN, EPOCH, "Running")
    planned = core.error_write("E", "after its unlock", permanent=False)
    assert planned.outcome.action == "retrying"  # an unlock keeps the phase's streak
    assert core.landed(planned.forms[0], planned.outcome) == first
    assert core.outcome == first  # the first outcome stands
    with pytest.raises(LeaseLost, match="already recorded"):
        core.check(LeaseWrite.RECORD, after=True)


def test_an_error_after_an_advance_is_only_noted_on_the_new_phase() -> None:
    core = lease()
    write, _ = core.advance_write("Done", {})
    advanced = Outcome("advanced", "Done", None, TOKEN)
    core.landed(write, advanced)
    assert core.fence(False) == lease_writes.released_fence(7, TOKEN, EPOCH, "Done")
    planned = core.error_write("E", "late", permanent=False)
    assert planned.outcome is advanced
    assert [w.action for w in planned.forms] == ["note"] * 3
    assert planned.forms[0].update == {
        "$set": {"lastError": planned.forms[0].update["$set"]["lastError"]}
    }


def test_an_error_after_a_removal_writes_nothing() -> None:
    core = lease()
    removed = Outcome("removed", "Running", None, TOKEN)
    core.removed(removed)
    planned = core.error_write("E", "late", permanent=False)
    assert planned.forms == () and planned.outcome is removed


def test_a_lost_lease_refuses_every_write() -> None:
    core = lease()
    error = core.lose(LeaseWrite.UNLOCK)
    assert isinstance(error, LeaseLost) and error.token == TOKEN and error.action == "unlock"
    assert core.lost and not core.held
    for action, after in (("unlock", False), ("record", True)):
        with pytest.raises(LeaseLost, match="another replica holds it now"):
            core.check(action, after=after)
    assert "it expired" in str(lease().lose(LeaseWrite.EXTEND, "it expired"))


def test_a_lease_expires_at_its_expiry_and_an_extension_moves_it() -> None:
    core = lease()
    now = now_of(core)
    assert not core.expired(now + timedelta(seconds=29.999))
    assert core.expired(now + timedelta(seconds=30))
    extended_at, until, update = core.extend_write()
    assert until == extended_at + timedelta(seconds=30)
    assert update == lease_writes.extend_update(extended_at, until)
    core.extended(extended_at + timedelta(seconds=1), until + timedelta(seconds=1))
    assert core.locked_at == extended_at + timedelta(seconds=1)
    assert not core.expired(now + timedelta(seconds=30))


def test_what_a_lease_says_about_itself() -> None:
    core = lease({"phase": 3})
    assert (core.id, core.collection, core.phase) == (7, "jobs", None)
    assert repr(lease()) == "<LeaseCore jobs/7 phase=Running held>"


# -- the lease's life, as a table ----------------------------------------------------------


def test_every_state_has_its_transitions_and_its_refusals_and_leads_only_to_states() -> None:
    assert set(TRANSITIONS) == set(REFUSALS) == set(LeaseState)
    assert {to for row in TRANSITIONS.values() for to in row.values()} <= set(LeaseState)
    ends = [state for state, row in TRANSITIONS.items() if not row]
    assert all(REFUSALS[state] for state in ends)  # an end refuses every step's write


def test_an_event_its_state_has_no_transition_for_is_a_fault_not_a_guess() -> None:
    with pytest.raises(LeaseStateError, match="a lease removed cannot be lost"):
        fire(LeaseState.REMOVED, LeaseEvent.LOST)
    core = lease()
    core.removed(core.remove_outcome())
    with pytest.raises(LeaseStateError):
        core.lose(LeaseWrite.RECORD)
    assert core.state is LeaseState.REMOVED


def carried(core: LeaseCore[Any], phase: str | None = None) -> None:
    """``core``'s unlock (or advance into ``phase``) carried on into the next step."""
    core.carrier = lambda lease, next_phase: lease.handler
    write, outcome = core.unlock_write({}) if phase is None else core.advance_write(phase, {})
    carry = core.carry_plan(write)
    assert carry is not None and carry.fence == core.fence(True)
    assert core.carried_on(write, outcome, carry) == outcome
    assert core.carried is carry and not core.held and not core.lost


def test_a_record_after_a_carried_unlock_releases_what_was_carried_on() -> None:
    core = lease()
    carried(core)
    assert core.state is LeaseState.CARRIED
    holder = core.carried
    assert holder is not None
    assert core.fence(False) == lease_writes.released_fence(
        7, TOKEN, holder.expires_at, "Running", holder=holder.token
    )
    planned = core.error_write("E", "after its unlock", permanent=False)
    assert planned.outcome.action == "retrying"
    assert core.landed(planned.forms[0], planned.outcome).action == "unlocked"
    assert core.state is LeaseState.RECORDED and core.carried is None


def test_a_note_after_a_carried_advance_keeps_what_was_carried_on() -> None:
    core = lease()
    carried(core, "Done")
    assert core.state is LeaseState.ADVANCED_CARRIED
    holder = core.carried
    planned = core.error_write("E", "after its advance", permanent=False)
    assert [w.action for w in planned.forms] == ["note"] * 3
    core.landed(planned.forms[0], planned.outcome)
    assert core.state is LeaseState.NOTED_CARRIED and core.carried is holder


def test_a_lease_lost_after_carrying_on_keeps_its_carry_for_the_engine_to_hand_back() -> None:
    core = lease()
    carried(core)
    holder = core.carried
    core.lose(LeaseWrite.RETRY)
    assert core.state is LeaseState.LOST_CARRIED and core.lost and core.carried is holder


def test_an_advance_into_its_own_phase_keeps_the_phase_s_streak_of_attempts() -> None:
    core = lease()
    core.landed(*core.advance_write("Running", {}))
    assert core.state is LeaseState.RELEASED
    assert core.error_write("E", "m", permanent=False).outcome.action == "retrying"


def test_an_unconfirmed_extension_is_fenced_on_either_expiry_until_one_is_confirmed() -> None:
    legacy = Settings(tick=1, lock_timeout=30, legacy_lock_timeout=60)
    core = lease(settings=legacy)
    first = core.expires_at
    extended_at, until, _ = core.extend_write()
    later = until + timedelta(seconds=5)
    core.extension_unconfirmed(later)
    assert core.state is LeaseState.UNCONFIRMED and core.held
    stamps = [InHouse(60).stamp(u) for u in (first, later)]
    assert core.fence(False)["lockedAt"] == {"$in": stamps}
    core.extended(extended_at, until)
    assert core.state is LeaseState.HELD
    assert core.fence(False)["lockedAt"] == InHouse(60).stamp(until)


# -- the exact writes: what lands on the document -----------------------------------------


def stamp(update: dict[str, Any]) -> dict[str, Any]:
    """``update`` as a releasing write of this lease carries it: its token left behind."""
    update["$set"]["lastToken"] = TOKEN
    return update


NO_HISTORY = Settings(tick=1, lock_timeout=30, max_wait=600, max_attempts=3, history=0)


def test_each_outcome_writes_exactly_its_update() -> None:
    core = lease({"updatedAt": datetime(2026, 1, 1, tzinfo=UTC)}, settings=NO_HISTORY)
    now = bson_time(now_of(core))
    epoch = bson_time(EPOCH)
    assert core.resource is core.doc and core.claimed_at == core.locked_at == now_of(core)
    assert core.unlock_write({"n": 1})[0].update == stamp(
        {
            "$set": {"n": 1, "lockedUntil": epoch, "attempts": 0},
            "$unset": {"lockToken": ""},
            "$rename": {"lastError": "previousError"},
        }
    )
    assert core.relock_write(5, {"n": 1})[0].update == stamp(
        {
            "$set": {"n": 1, "lockedUntil": now + timedelta(seconds=5), "attempts": 0},
            "$inc": {"relocks": 1},
            "$unset": {"lockToken": ""},
            "$rename": {"lastError": "previousError"},
        }
    )
    assert core.advance_write("Done", {"n": 1})[0].update == stamp(
        {
            "$set": {
                "n": 1,
                "phase": "Done",
                "lockedUntil": epoch,
                "updatedAt": now,
                "attempts": 0,
                "relocks": 0,
            },
            "$unset": {"lockToken": "", "failedBy": ""},
            "$rename": {"lastError": "previousError"},
        }
    )
    assert core.release_write()[0].update == stamp(
        {"$set": {"lockedUntil": epoch}, "$unset": {"lockToken": ""}}
    )
    extended_at, until, update = core.extend_write()
    assert update == {
        "$set": {
            "lockedAt": bson_time(extended_at),
            "lockedUntil": bson_time(until),
        }
    }


def test_a_failed_attempt_writes_exactly_its_record() -> None:
    core = lease(retry_policy=Fixed(7), settings=NO_HISTORY)
    now = bson_time(now_of(core))
    error = {"type": "E", "message": "m", "at": now, "phase": "Running"}
    retry = core.error_write("E", "m", permanent=False)
    assert retry.forms[0].update == stamp(
        {
            "$set": {
                "attempts": 1,
                "lastError": error,
                "lockedUntil": now + timedelta(seconds=7),
            },
            "$unset": {"lockToken": ""},
        }
    )
    assert retry.outcome.token == TOKEN
    failed = core.error_write("E", "m", permanent=True)
    assert failed.outcome.token == TOKEN
    assert failed.forms[0].update == stamp(
        {
            "$set": {
                "phase": "Failed",
                "attempts": 1,
                "lastError": error,
                "failedBy": core.handler.key,
                "updatedAt": now,
                "lockedUntil": bson_time(EPOCH),
            },
            "$unset": {"lockToken": ""},
        }
    )


def test_a_lease_lost_names_the_document_the_lease_and_what_was_dropped() -> None:
    def raised(core: LeaseCore[Any], action: LeaseWrite, after: bool = False) -> LeaseLost:
        with pytest.raises(LeaseLost) as caught:
            core.check(action, after=after)
        return caught.value

    released = lease()
    released.landed(*released.unlock_write({}))
    lost = lease()
    for error in (
        raised(released, LeaseWrite.ADVANCE),
        lost.lose(LeaseWrite.ADVANCE),
        lease().lose(LeaseWrite.ADVANCE, "x"),
    ):
        assert (error.collection, error.doc_id, error.token, error.action) == (
            "jobs",
            7,
            TOKEN,
            "advance",
        )
        assert str(error).startswith(f"lease {TOKEN[:8]} on jobs/7 is no longer held (")
        assert str(error).endswith("); advance dropped")
    assert "(another replica holds it now, or its phase was changed from outside)" in str(
        lease().lose(LeaseWrite.ADVANCE)
    )
    assert "(this step already gave an outcome; a step returns exactly one)" in str(
        raised(released, LeaseWrite.ADVANCE)
    )
    assert "(another replica holds it now)" in str(raised(lost, LeaseWrite.UNLOCK))
    recorded = lease()
    planned = recorded.error_write("E", "m", permanent=False)
    recorded.landed(planned.forms[0], planned.outcome)
    assert "(this step's failed attempt is already recorded)" in str(
        raised(recorded, LeaseWrite.RECORD, after=True)
    )


def test_a_note_after_a_release_is_fenced_on_the_release_it_follows() -> None:
    until = datetime(2026, 1, 1, 0, 0, 1, 234567, tzinfo=UTC)
    assert lease_writes.released_fence(7, TOKEN, until, "Done") == {
        "_id": 7,
        "lockToken": {"$exists": False},
        "lastToken": TOKEN,
        "lockedUntil": datetime(2026, 1, 1, 0, 0, 1, 234000),
        "phase": "Done",
    }


# -- the history each release carries ------------------------------------------------------


def entry_of(update: dict[str, Any]) -> dict[str, Any]:
    pushed = update["$push"][history.HISTORY_FIELD]
    assert pushed["$slice"] == -history.DEFAULT_HISTORY
    (entry,) = pushed["$each"]
    return cast(dict[str, Any], entry)


@pytest.mark.pure
def test_each_release_carries_its_steps_history_entry_in_the_same_write() -> None:
    core = lease(taken_from="pod-dead")
    now = bson_time(now_of(core))
    entry = entry_of(core.advance_write("Done", {})[0].update)
    assert entry == {
        "kind": "step",
        "at": now,
        "took": 0.0,
        "by": core.settings.replica_id,
        "outcome": "advanced",
        "phase": "Running",
        "to": "Done",
        "tookOverFrom": "pod-dead",
    }
    assert entry_of(core.unlock_write({})[0].update)["outcome"] == "unlocked"
    assert entry_of(core.relock_write(3, {})[0].update)["to"] == "Running"
    assert entry_of(core.release_write()[0].update)["outcome"] == "released"


@pytest.mark.pure
def test_a_failed_attempts_entry_keeps_its_error_and_traceback_but_not_at_the_size_limit() -> None:
    core = lease(retry_policy=Fixed(7))
    forms = core.error_write("E", "m", permanent=False, trace="Traceback ...").forms
    whole, cut, bare, none = (form.update for form in forms)
    assert entry_of(whole)["error"]["traceback"] == "Traceback ..."
    assert whole["$set"]["lastError"]["traceback"] == "Traceback ..."
    assert entry_of(whole)["outcome"] == "retrying"
    assert "traceback" not in entry_of(cut)["error"]
    for last in (bare, none):
        assert "$push" not in last and history.HISTORY_FIELD not in last.get("$set", {})
    failed = core.error_write("E", "m", permanent=True).forms[0].update
    assert entry_of(failed)["outcome"] == "failed" and entry_of(failed)["to"] == "Failed"


@pytest.mark.pure
@pytest.mark.parametrize("stored", ["text", 3, {"a": 1}, None])
def test_a_history_that_is_no_list_is_replaced_never_pushed_onto(stored: Any) -> None:
    """$push onto a non-array is refused by the server, and with it the step's outcome:
    whatever a writer left in the field, the release writes."""
    update = lease({history.HISTORY_FIELD: stored}).unlock_write({})[0].update
    assert "$push" not in update
    (entry,) = update["$set"][history.HISTORY_FIELD]
    assert entry["outcome"] == "unlocked"
    assert "$push" in lease().unlock_write({})[0].update  # absent: pushed


@pytest.mark.pure
def test_history_off_writes_none() -> None:
    core = lease(settings=NO_HISTORY)
    assert "$push" not in core.unlock_write({})[0].update
