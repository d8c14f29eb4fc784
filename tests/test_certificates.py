"""Certificate provisioning: progressive backoff until Ready, by the server's clock."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator.core.clock import as_utc
from orchestrator.demo.workflows.certificates import RuntimeDomain
from orchestrator.demo.workflows.gateway import LEDGER, Faults, Workflow, build
from orchestrator.testing import FakeClock

pytestmark = pytest.mark.anyio


@pytest.fixture
async def workflow(adb: AsyncDatabase[Any], clock: FakeClock) -> AsyncIterator[Workflow]:
    faults = Faults()
    w = build(
        adb,
        replica_id="pod-1",
        clock=clock,
        lock_timeout=30,
        tick=0.1,
        clock_refresh=1e6,
        cert_delay=60.0,
        faults=faults,
    )
    await w.orch.measure_clock()  # before any clock.advance: see tests/conftest.py
    yield w
    await w.orch.stop(timeout=5)


async def submit_domain(w: Workflow, custom: str | None = "shop.example.com") -> None:
    await w.orch.submit(
        RuntimeDomain,
        RuntimeDomain(
            gateway_id="g1",
            gateway_name="shop",
            host="shop.apps.example.net",
            custom_domain=custom,
            phase="Creating",
        ),
        unique="gateway_id",
    )


def next_claimable(db: Database[Any]) -> Any:
    doc = db.runtimeDomains.find_one({})
    return as_utc(doc["lockedUntil"])


async def test_the_step_relocks_with_growing_waits_until_the_certificate_is_ready(
    workflow: Workflow, db: Database[Any], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orchestrator.demo.workflows.certificates")
    server = workflow.orch.clock  # lease times are the server's: compare with its estimate
    await submit_domain(workflow)
    start = server.now()
    waits: list[tuple[float, float]] = []  # (seconds in phase, wait chosen)
    for _ in range(200):
        await workflow.orch.run_once()
        doc = db.runtimeDomains.find_one({})
        if doc["phase"] == "Created":
            break
        assert db.ingresses.count_documents({}) == 0  # no ingress before the certificate
        due, now = next_claimable(db), server.now()
        waits.append(((now - start).total_seconds(), (due - now).total_seconds()))
        clock.advance((due - now).total_seconds() + 0.001)  # claimable after `due`
    else:
        raise AssertionError("the domain never reached Created")

    assert (server.now() - start).total_seconds() >= 60.0
    # The wait is a tenth of the time spent in the phase, never under one tick (0.1 s).
    for elapsed, wait in waits:
        assert wait == pytest.approx(max(elapsed / 10, 0.1), abs=0.002)
    seen = [wait for _, wait in waits]
    assert seen == sorted(seen)
    assert any(w == pytest.approx(1.0, abs=0.11) for w in seen)
    assert max(seen) >= 3.0
    # Far fewer checks than one per tick over a minute (600).
    assert len(waits) < 60
    logged = [r.wait for r in caplog.records if getattr(r, "outcome", None) == "relocked"]
    assert logged == pytest.approx(seen, abs=0.002)
    certificates = [r for r in caplog.records if r.name.endswith(".certificates")]
    assert "next check in" in certificates[-1].getMessage()

    cert = db.certificates.find_one({"_id": "shop.example.com"})
    assert cert["status"] == "Ready"
    ingress = db.ingresses.find_one({"_id": "shop.apps.example.net"})
    assert ingress["tls"] is True
    assert await workflow.platform.repeats() == 0


async def test_a_failed_certificate_is_discarded_and_requested_again(
    workflow: Workflow, db: Database[Any], clock: FakeClock
) -> None:
    workflow.platform.faults.schedule("certificate")
    await submit_domain(workflow)
    for _ in range(300):
        await workflow.orch.run_once()
        if db.runtimeDomains.find_one({})["phase"] == "Created":
            break
        clock.advance(1.0)
    else:
        raise AssertionError("the domain never reached Created")

    domain = db.runtimeDomains.find_one({})
    assert domain["certificateRequests"] == 2
    assert workflow.orch.stats()["retrying"] == 1
    ledger = {e["_id"].split(":", 1)[1] for e in db[LEDGER].find()}
    assert ledger == {"certificate:0", "certificate:1", "ingress"}
    assert await workflow.platform.repeats() == 0


async def test_a_domain_without_custom_domain_needs_no_certificate(
    workflow: Workflow, db: Database[Any]
) -> None:
    await submit_domain(workflow, custom=None)
    await workflow.orch.run_once()
    assert db.runtimeDomains.find_one({})["phase"] == "Created"
    assert db.certificates.count_documents({}) == 0
    assert db.ingresses.find_one({})["tls"] is False
