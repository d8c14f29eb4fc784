"""The gateway lifecycle: provisioning step by step, deletion that resumes, many replicas."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator.testing import FakeClock
from orchestrator.tools.workflows.gateway import (
    CREATE_ORDER,
    DELETE_ORDER,
    LEDGER,
    Faults,
    Workflow,
    build,
)

MakeWorkflow = Callable[..., Workflow]


@pytest.fixture
def replica(db: Database[Any], clock: FakeClock) -> Iterator[MakeWorkflow]:
    made: list[Workflow] = []

    def factory(replica_id: str = "pod-1", **options: Any) -> Workflow:
        options.setdefault("cert_delay", 5.0)
        workflow = build(
            db,
            replica_id=replica_id,
            clock=clock,
            lock_timeout=30,
            tick=1.0,
            clock_refresh=1e6,
            **options,
        )
        workflow.orch.measure_clock()  # before any clock.advance: see tests/conftest.py
        made.append(workflow)
        return workflow

    yield factory
    for workflow in made:
        workflow.orch.stop(timeout=5)


def drive(
    replicas: list[Workflow], clock: FakeClock, done: Callable[[], bool], limit: int = 200
) -> int:
    """Tick every replica, then let a second pass, until ``done``; returns ticks used."""
    for tick in range(limit):
        if done():
            return tick
        for workflow in replicas:
            workflow.orch.run_once()
        clock.advance(1.0)
    raise AssertionError(f"not done after {limit} ticks")


def phase(db: Database[Any], name: str) -> str | None:
    doc = db.gateways.find_one({"name": name})
    return None if doc is None else doc["phase"]


def test_creating_provisions_one_kind_per_step_then_waits_for_the_domain(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    w = replica(cert_delay=10.0)
    w.platform.create_gateway("shop", custom_domain="shop.example.com")
    w.orch.run_once()

    gateway = db.gateways.find_one({"name": "shop"})
    assert gateway is not None
    assert gateway["provisioned"] == list(CREATE_ORDER)  # each kind once, in order
    assert gateway["phase"] == "Creating"  # the certificate is not ready yet
    assert db.cloudFunctions.count_documents({"gatewayId": gateway["_id"]}) == 3
    assert db.runtimeDomains.find_one({"gatewayId": gateway["_id"]})["phase"] == "Creating"

    drive([w], clock, lambda: phase(db, "shop") == "Created")
    assert clock.monotonic() >= 10.0
    assert w.platform.audit(["shop"], []) == []
    assert w.platform.repeats() == 0
    assert w.orch.stats()["relocked"] > 0


def test_a_deletion_failing_half_way_resumes_without_repeating_finished_kinds(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults()
    w = replica(cert_delay=0.0, faults=faults)
    w.platform.create_gateway("shop")
    drive([w], clock, lambda: phase(db, "shop") == "Created")
    gateway_id = db.gateways.find_one({"name": "shop"})["_id"]

    faults.schedule("delete:stages")
    assert w.platform.set_state("shop", "Deleted")
    w.orch.run_once()

    stuck = db.gateways.find_one({"name": "shop"})
    assert stuck["phase"] == "Deleting"
    assert stuck["removed"] == ["cronTriggers", "cloudFunctions"]
    assert stuck["attempts"] == 1
    assert stuck["lastError"]["type"] == "ServiceError"
    assert stuck["lastError"]["phase"] == "Deleting"
    assert db.stages.count_documents({"gatewayId": gateway_id}) == 2
    assert db.cronTriggers.count_documents({"gatewayId": gateway_id}) == 0

    drive([w], clock, lambda: phase(db, "shop") is None)
    archived = db.gatewaysArchive.find_one({"name": "shop"})
    assert archived["removed"] == list(DELETE_ORDER)
    assert w.platform.audit([], ["shop"]) == []
    # Each kind's removal ran once: the retry started at stages.
    deletions = {e["_id"].split(":", 1)[1]: e["repeats"] for e in db[LEDGER].find()}
    assert {k: v for k, v in deletions.items() if k.startswith("delete:")} == {
        f"delete:{kind}": 0 for kind in DELETE_ORDER
    }
    assert w.orch.stats()["retrying"] == 1


def test_deleting_a_gateway_still_creating_waits_for_a_stable_phase(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    w = replica(cert_delay=20.0)
    w.platform.create_gateway("shop", custom_domain="shop.example.com")
    w.orch.run_once()
    w.platform.set_state("shop", "Deleted")
    w.orch.run_once()
    assert phase(db, "shop") == "Creating"  # never deleted under a running creation

    drive([w], clock, lambda: phase(db, "shop") is None)
    assert w.platform.audit([], ["shop"]) == []
    assert w.platform.repeats() == 0


def test_a_gateway_whose_certificate_keeps_failing_fails_and_can_be_deleted(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults()
    faults.schedule("certificate", times=5)  # CertManager.max_requests
    w = replica(cert_delay=1.0, faults=faults)
    w.platform.create_gateway("shop", custom_domain="shop.example.com")
    drive([w], clock, lambda: phase(db, "shop") == "Failed", limit=2000)
    gateway = db.gateways.find_one({"name": "shop"})
    assert "runtime domain of shop failed" in gateway["lastError"]["message"]
    domain = db.runtimeDomains.find_one({})
    assert domain["phase"] == "Failed"
    assert domain["lastError"]["message"] == "certificate for shop.example.com failed 5 times"
    assert w.orch.stats()["retrying"] == 4  # the first four failures were retried

    w.platform.set_state("shop", "Deleted")
    drive([w], clock, lambda: phase(db, "shop") is None)
    assert w.platform.audit([], ["shop"]) == []


def test_stopping_and_starting_scale_the_functions(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    w = replica(cert_delay=0.0)
    w.platform.create_gateway("shop")
    drive([w], clock, lambda: phase(db, "shop") == "Created")

    w.platform.set_state("shop", "Stopped")
    w.orch.run_once()
    assert {f["replicas"] for f in db.cloudFunctions.find()} == {0}
    w.orch.run_once()  # nothing more to do: the stop does not repeat
    assert db.gateways.find_one({})["stopped"] is True

    w.platform.set_state("shop", "Running")
    w.orch.run_once()
    assert {f["replicas"] for f in db.cloudFunctions.find()} == {1}
    assert w.platform.set_state("nope", "Running") is False


def test_three_replicas_share_forty_gateways_and_no_side_effect_runs_twice(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(rate=0.05, seed=7)
    replicas = [replica(f"pod-{n}", cert_delay=3.0, faults=faults) for n in range(3)]
    names = [f"gw-{n:02d}" for n in range(40)]
    for n, name in enumerate(names):
        replicas[n % 3].platform.create_gateway(name, custom_domain=f"{name}.example.com")

    def tick_together() -> None:
        barrier = threading.Barrier(len(replicas))
        errors: list[BaseException] = []

        def run(w: Workflow) -> None:
            barrier.wait()
            try:
                w.orch.run_once()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(w,)) for w in replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        clock.advance(1.0)

    def until(done: Callable[[], bool]) -> None:
        for _ in range(300):
            if done():
                return
            tick_together()
        raise AssertionError("not done after 300 ticks")

    until(lambda: db.gateways.count_documents({"phase": "Created"}) == 40)
    deleted = names[::2]
    for name in deleted:
        replicas[1].platform.set_state(name, "Deleted")
    until(lambda: db.gatewaysArchive.count_documents({}) == 20)

    kept = sorted(set(names) - set(deleted))
    assert replicas[0].platform.audit(kept, deleted) == []
    assert replicas[0].platform.repeats() == 0
    busy = [w for w in replicas if w.orch.stats().get("claimed", 0) > 0]
    assert len(busy) > 1, "the work should be shared between replicas"
    assert sum(w.orch.stats().get("retrying", 0) for w in replicas) > 0  # faults were retried
