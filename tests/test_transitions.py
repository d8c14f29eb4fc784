"""A handler's declared transitions (``to=``): its advances to those phases land, and any
other advance is refused before anything is written (a ``ConfigError`` raised in the
step, recorded as its failed attempt unless the handler catches it). On both engines."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import ConfigError
from tests.conftest import MakeEither

pytestmark = pytest.mark.anyio


def _doc(db: Database[Any]) -> dict[str, Any]:
    doc = db.jobs.find_one({})
    assert doc is not None
    return doc


@pytest.mark.parametrize("to", ["Done", ["Done"], ("Cancelled", "Done")])
async def test_an_advance_to_a_declared_phase_lands(
    replicas: MakeEither, db: Database[Any], to: Any
) -> None:
    orch = await replicas()

    @orch.phase("jobs", "Running", to=to)
    async def step(lease: Any) -> Any:
        return await lease.advance("Done", result=7)

    await orch.submit("jobs", {"phase": "Running"})
    assert (await orch.run_once()).get("advanced") == 1
    doc = _doc(db)
    assert doc["phase"] == "Done" and doc["result"] == 7
    assert "lastError" not in doc


async def test_an_advance_to_an_undeclared_phase_is_refused_and_recorded(
    replicas: MakeEither, db: Database[Any]
) -> None:
    orch = await replicas(max_attempts=3)

    @orch.phase("jobs", "Running", to=["Done", "Cancelled"])
    async def step(lease: Any) -> Any:
        return await lease.advance("Elsewhere", result=7)

    await orch.submit("jobs", {"phase": "Running"})
    assert (await orch.run_once()).get("retrying") == 1
    doc = _doc(db)
    assert doc["phase"] == "Running" and "result" not in doc
    assert doc["attempts"] == 1
    assert doc["lastError"]["type"] == "ConfigError"
    message = doc["lastError"]["message"]
    assert "may advance to ['Done', 'Cancelled'], not 'Elsewhere'" in message
    assert "lockToken" not in doc  # the attempt's record released the lease


async def test_a_refused_advance_writes_nothing_and_leaves_the_lease_held(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """The refusal comes before any write: a handler that catches it still holds its
    lease, and its declared advance lands."""
    orch = await replicas()
    refused: list[ConfigError] = []

    @orch.phase("jobs", "Running", to="Done")
    async def step(lease: Any) -> Any:
        try:
            await lease.advance("Running")  # its own phase is no declared transition either
        except ConfigError as exc:
            refused.append(exc)
        assert lease.held
        return await lease.advance("Done")

    await orch.submit("jobs", {"phase": "Running"})
    assert (await orch.run_once()).get("advanced") == 1
    assert len(refused) == 1 and "not 'Running'" in str(refused[0])
    doc = _doc(db)
    assert doc["phase"] == "Done" and "lastError" not in doc and doc["attempts"] == 0


async def test_without_declared_transitions_any_advance_lands(
    replicas: MakeEither, db: Database[Any]
) -> None:
    orch = await replicas()

    @orch.phase("jobs", "Running")
    async def step(lease: Any) -> Any:
        return await lease.advance("Anywhere")

    await orch.submit("jobs", {"phase": "Running"})
    assert (await orch.run_once()).get("advanced") == 1
    assert _doc(db)["phase"] == "Anywhere"
