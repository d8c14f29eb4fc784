"""Which handler a document's ``failedBy`` keeps off it, and for how long: a
registration's key (its collection and filter) names it, not its function's name, which
handlers made by one helper function share; and the mark holds only while the document
stays in the failed phase that handler sent it to."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import ConfigError, Orchestrator
from orchestrator.testing import FakeClock
from tests.conftest import MakeEither


def _made_by_one_helper(action: str) -> Any:
    """Handlers from one factory: the same module and qualified name for each."""

    async def step(lease: Any) -> Any:
        if action == "raise":
            raise RuntimeError("the provider said no")
        return await lease.advance(action)

    return step


@pytest.mark.anyio
async def test_the_failed_phase_s_own_handler_claims_what_a_namesake_failed(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """Before the fix ``failedBy`` was the shared name, so the Failed phase's handler
    (made by the same helper) never claimed the document: it stayed in Failed."""
    orch = await replicas(max_attempts=1)
    orch.phase("invoices", "Charging")(_made_by_one_helper("raise"))
    orch.phase("invoices", "Failed")(_made_by_one_helper("Reported"))
    await orch.submit("invoices", {"phase": "Charging"})
    await orch.run_once()
    doc = db.invoices.find_one({})
    assert doc is not None and doc["phase"] == "Reported"


@pytest.mark.anyio
async def test_a_failed_document_moved_back_is_claimed_by_its_phase_s_handler_again(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """The API moves a failed document back to Provisioning. Before the fix its
    ``failedBy`` kept Provisioning's handler off it for good: free, never claimed."""
    orch = await replicas(max_attempts=1)
    attempts: list[str] = []

    @orch.phase("certs", "Provisioning")
    async def provision(lease: Any) -> Any:
        attempts.append(lease.phase)
        if len(attempts) == 1:
            raise RuntimeError("the CA is down")
        return await lease.advance("Ready")

    await orch.submit("certs", {"phase": "Provisioning"})
    await orch.run_once()
    assert db.certs.find_one({})["phase"] == "Failed"  # type: ignore[index]
    db.certs.update_one({}, {"$set": {"phase": "Provisioning"}})  # the API tries again
    await orch.run_once()
    assert attempts == ["Provisioning", "Provisioning"]
    assert db.certs.find_one({})["phase"] == "Ready"  # type: ignore[index]


@pytest.mark.anyio
async def test_a_filter_that_matches_its_failed_phase_still_leaves_what_it_failed(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """The mark still does its job: a handler whose filter matches its own failed phase
    does not claim what it failed while it stays there."""
    orch = await replicas(max_attempts=1)
    calls: list[Any] = []

    @orch.when("items", {"state": "Deleted"})
    async def delete(lease: Any) -> Any:
        calls.append(lease.phase)
        raise RuntimeError("cannot delete")

    await orch.submit("items", {"phase": "Running", "state": "Deleted"})
    for _ in range(3):
        await orch.run_once()
        clock.advance(60)
    assert calls == ["Running"]
    assert db.items.find_one({})["phase"] == "Failed"  # type: ignore[index]


def test_two_registrations_for_one_filter_are_refused(db: Database[Any], clock: FakeClock) -> None:
    """One key per registration: a second handler of the same documents is refused at
    decoration time (their marks and their claims would be one)."""
    orch = Orchestrator(db, clock=clock)
    orch.phase("jobs", "Running")(lambda lease: lease.advance("Done"))
    with pytest.raises(ConfigError, match="already handles jobs documents"):
        orch.phase("jobs", "Running")(lambda lease: lease.advance("Other"))
