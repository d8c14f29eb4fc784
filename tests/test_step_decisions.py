"""What a step's life decides (``orchestrator.core.steps``), tested without I/O: whether a
claimed lease runs, whether a handler's return is its outcome, how an error reads, and
what ``stop`` reports."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.core import steps
from orchestrator.core.errors import ConfigError
from orchestrator.core.lease_values import Outcome
from orchestrator.core.outcomes import StepOutcome
from orchestrator.core.registry import Handler, Registry
from orchestrator.core.settings import Settings
from orchestrator.runners.registration import Registration

pytestmark = pytest.mark.pure  # no I/O: in the mutation run (scripts/mutation)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stopping", "expired", "reason"),
    [
        (False, False, None),
        (True, False, "the replica is stopping"),
        (False, True, "its lease expired before it started"),
        (True, True, "the replica is stopping"),  # a stop says why first
    ],
)
def test_a_claimed_lease_runs_unless_the_replica_stops_or_it_expired(
    stopping: bool, expired: bool, reason: str | None
) -> None:
    assert steps.hand_back_reason(stopping=stopping, expired=expired) == reason


def test_a_handler_returns_its_own_outcome_or_none() -> None:
    own = Outcome(StepOutcome.UNLOCKED, "Running", None, "t1")
    assert steps.wrong_result(None, "t1", "h") is None
    assert steps.wrong_result(own, "t1", "h") is None


@pytest.mark.parametrize(
    ("result", "what"),
    [
        (Outcome(StepOutcome.UNLOCKED, "Running", None, "t2"), "another lease's outcome"),
        (42, "int"),
        ("unlock", "str"),
        ({"phase": "Done"}, "dict"),
        (True, "bool"),
    ],
)
def test_anything_else_a_handler_returns_is_named_in_its_error(result: object, what: str) -> None:
    message = steps.wrong_result(result, "t1", "jobs Running")
    assert message is not None
    assert message.startswith(f"jobs Running returned {what};")
    assert "unlock(), relock(), advance(...), fail(...), remove() or None" in message


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_an_error_is_described_even_when_it_cannot_print_itself() -> None:
    assert steps.describe(ValueError("boom")) == "boom"
    assert steps.describe(ValueError()) == "ValueError()"  # an empty message: its repr
    assert steps.describe(_Unprintable()) == "<_Unprintable with an unprintable message>"


@pytest.mark.parametrize("recorded", list(StepOutcome), ids=str)
def test_an_error_after_the_steps_own_outcome_says_that_outcome_stands(
    recorded: StepOutcome,
) -> None:
    message = steps.noted_message("boom", recorded)
    if recorded in {StepOutcome.RETRYING, StepOutcome.FAILED}:
        assert message == "boom"  # the error is the attempt's record
    else:
        assert message == f"boom (after its own outcome, {recorded.value}, which stands)"


def test_only_the_last_attempt_is_logged_as_an_error() -> None:
    assert steps.settled_level(StepOutcome.FAILED) == logging.ERROR
    assert steps.settled_level(StepOutcome.RETRYING) == logging.WARNING
    assert steps.settled_level(StepOutcome.LOST) == logging.WARNING


def test_claim_latency_is_how_long_the_document_was_due() -> None:
    assert steps.claim_latency(NOW, NOW - timedelta(seconds=3)) == 3.0
    assert steps.claim_latency(NOW, NOW) == 0.0
    assert steps.claim_latency(NOW, None) is None  # its fields do not tell
    # A lockedUntil ahead of now: a bogus lease the claim took as free, no latency.
    assert steps.claim_latency(NOW, NOW + timedelta(seconds=1)) is None


def test_a_stop_with_nothing_left_is_logged_as_info() -> None:
    level, line = steps.stop_summary(["jobs/1"], [])
    assert level == logging.INFO
    assert line == (
        "orchestrator stopped: 1 unstarted lease(s) handed back, 0 step(s) still running"
    )


def test_a_stop_with_steps_left_to_expire_warns_and_names_them() -> None:
    level, line = steps.stop_summary([], ["jobs/1", "jobs/2"])
    assert level == logging.WARNING
    assert line == (
        "orchestrator stopped: 0 unstarted lease(s) handed back, 2 step(s) still running: "
        "jobs/1, jobs/2 left to expire"
    )


def _registered(*registrations: tuple[str, Any]) -> list[Handler]:
    """The handlers of ``jobs`` registered by the real decorators: ``("phase", "B")`` is
    ``phase("jobs", "B")``, ``("when", {...})`` is ``when("jobs", {...})``."""
    made = Registration(Registry(Settings()), lambda func: None, lambda handlers: None)
    for kind, what in registrations:
        decorator = made.phase("jobs", what) if kind == "phase" else made.when("jobs", what)
        decorator(lambda lease: None)
    return list(made.registry.handlers)


@pytest.mark.parametrize("kind", ["phase", "when"])
def test_a_lease_is_carried_into_a_handler_whose_filter_is_the_phase_alone(kind: str) -> None:
    """``when("jobs", {"phase": "B"})`` is ``phase("jobs", "B")``: one registration (the
    same key, refused twice), whose filter the carry's own write satisfies (it sets the
    phase, fenced on the lease's token), so nothing is left for the server to judge."""
    [handler] = _registered((kind, "B" if kind == "phase" else {"phase": "B"}))
    assert handler.key == 'jobs {"phase": "B"}' and handler.exclusion is None
    assert steps.carry_target([handler], "jobs", "B") is handler
    assert steps.carry_target([handler], "jobs", "C") is None
    assert steps.carry_target([handler], "other", "B") is None
    with pytest.raises(ConfigError, match="already handles"):
        _registered(("phase", "B"), ("when", {"phase": "B"}))


@pytest.mark.parametrize(
    "match",
    [
        {"phase": "B", "state": "Deleted"},  # a field besides the phase
        {"phase": {"$in": ["B"]}},  # the phase by an operator
        {"phase": {"$eq": "B"}},
        {"$or": [{"phase": "B"}]},
    ],
)
def test_no_lease_is_carried_into_a_when_handler_with_more_to_its_filter(
    match: dict[str, Any],
) -> None:
    """A ``when`` filter with anything more than the phase is the server's to judge (the
    document may not match it as the step left it): its document is released and claimed."""
    [handler] = _registered(("when", match))
    assert steps.carry_target([handler], "jobs", "B") is None


def test_no_lease_is_carried_into_a_handler_of_its_failed_phase() -> None:
    """A handler of the failed phase keeps off what it failed itself (``failedBy``): a
    condition for the server, so nothing is carried into it."""
    [handler] = _registered(("phase", "Failed"))
    assert handler.exclusion is not None
    assert steps.carry_target([handler], "jobs", "Failed") is None
