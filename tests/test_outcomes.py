"""The two vocabularies' tables on their own, no I/O: what each ``StepOutcome`` means (the
scheduler, tracing and metrics classify by it), and that both enums stay their strings."""

from __future__ import annotations

import pytest

from orchestrator.core.outcomes import LeaseWrite, StepOutcome

pytestmark = pytest.mark.pure  # no I/O: in the mutation run (scripts/mutation)

MEANINGS = {
    # outcome: (frees_work, is_failure, is_recorded)
    StepOutcome.UNLOCKED: (True, False, True),
    StepOutcome.RELOCKED: (False, False, True),  # it waits: nothing new to claim
    StepOutcome.ADVANCED: (True, False, True),
    StepOutcome.REMOVED: (False, False, True),
    StepOutcome.DONE: (True, False, True),
    StepOutcome.RETRYING: (False, True, True),
    StepOutcome.FAILED: (True, True, True),
    StepOutcome.LOST: (True, True, False),  # a phase changed from outside frees its document
    StepOutcome.TIMED_OUT: (True, True, True),
    StepOutcome.RELEASED: (True, False, True),
    StepOutcome.UNRECORDED: (False, True, False),
    StepOutcome.INTERRUPTED: (False, True, False),
}


def test_every_outcome_has_a_meaning() -> None:
    assert set(MEANINGS) == set(StepOutcome)


@pytest.mark.parametrize("outcome", list(StepOutcome), ids=str)
def test_what_each_outcome_means(outcome: StepOutcome) -> None:
    assert (outcome.frees_work, outcome.is_failure, outcome.is_recorded) == MEANINGS[outcome]


@pytest.mark.parametrize("member", [*StepOutcome, *LeaseWrite], ids=str)
def test_a_value_is_its_own_name_in_logs_labels_and_stats(member: StepOutcome | LeaseWrite) -> None:
    """Log records, metrics labels, span attributes and ``stats()`` keys carry the value,
    as they did when outcomes were plain strings."""
    assert member == member.name.lower()
    assert str(member) == f"{member}" == member.value == member.name.lower()
    assert type(member)(member.value) is member
    assert {member.value: 1}[member] == 1  # a str key finds it: stats() counts by value
