"""Certificate provisioning: the domain waits for the authority's signal, by the server's
clock; a failed certificate is requested again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator.core.steps import started
from orchestrator.demo.workflows.certificates import ISSUED, RuntimeDomain
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


async def test_the_domain_waits_for_the_authoritys_signal_and_polls_nothing(
    workflow: Workflow, db: Database[Any], clock: FakeClock
) -> None:
    await submit_domain(workflow)
    await workflow.orch.run_once()  # requests the certificate, then waits for it
    domain = db.runtimeDomains.find_one({})
    assert domain["phase"] == "Creating"
    assert domain["orchestratorWait"]["name"] == ISSUED
    assert db.certificates.find_one({"_id": "shop.example.com"})["status"] == "Pending"
    steps = started(workflow.orch.stats())

    for _ in range(59):  # a minute less a second: the certificate is not due
        clock.advance(1.0)
        await workflow.orch.run_once()
        assert db.ingresses.count_documents({}) == 0  # no ingress before the certificate
    # Nothing polled: the domain's wait was judged once more, at its lock timeout (30 s).
    assert started(workflow.orch.stats()) == steps + 1

    clock.advance(1.0)
    await workflow.orch.run_once()  # the authority issues it and signals; the domain goes on
    domain = db.runtimeDomains.find_one({})
    assert domain["phase"] == "Created"
    assert [s["name"] for s in domain["orchestratorSignals"]] == [ISSUED]
    assert not domain.get("orchestratorWait")
    cert = db.certificates.find_one({"_id": "shop.example.com"})
    assert (cert["phase"], cert["status"]) == ("Issued", "Ready")
    ingress = db.ingresses.find_one({"_id": "shop.apps.example.net"})
    assert ingress["tls"] is True
    assert await workflow.platform.repeats() == 0


async def test_a_domain_the_authority_never_answers_fails_at_its_timeout(
    workflow: Workflow, db: Database[Any], clock: FakeClock
) -> None:
    await submit_domain(workflow)
    await workflow.orch.run_once()
    db.certificates.delete_one({})  # the authority lost the request: no signal will come
    for _ in range(20):
        clock.advance(60.0)
        await workflow.orch.run_once()
        if db.runtimeDomains.find_one({})["phase"] == "Failed":
            break
    domain = db.runtimeDomains.find_one({})
    assert domain["phase"] == "Failed"
    assert (
        "waited past its timeout for signal 'certificate-issued'"
        in (domain["lastError"]["message"])
    )
    assert workflow.platform.certs.timeout == 600.0  # ten times its delay


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
