"""The gateway lifecycle: children made once and waited for, deletion that resumes, the data
last, many replicas.

The workflow is async (``AsyncOrchestrator``); the tests drive it with ``run_once`` on the
tests' fake clock and read the result through the sync ``db`` it shares data with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator import EPOCH, ConfigError
from orchestrator.demo.workflows.gateway import (
    CHILDREN_PER_KIND,
    CREATE_ORDER,
    LEDGER,
    Faults,
    Workflow,
    build,
)
from orchestrator.testing import FakeClock

pytestmark = pytest.mark.anyio

MakeWorkflow = Callable[..., Any]
USERS = [kind for kind in CREATE_ORDER if kind != "databases"]
"""What may write to a gateway's database."""


@pytest.fixture
async def replica(adb: AsyncDatabase[Any], clock: FakeClock) -> AsyncIterator[MakeWorkflow]:
    made: list[Workflow] = []

    async def factory(replica_id: str = "pod-1", **options: Any) -> Workflow:
        options.setdefault("cert_delay", 5.0)
        workflow = build(
            adb,
            replica_id=replica_id,
            clock=clock,
            lock_timeout=30,
            tick=1.0,
            clock_refresh=1e6,
            **options,
        )
        await workflow.orch.measure_clock()  # before any clock.advance: see tests/conftest.py
        made.append(workflow)
        return workflow

    yield factory
    for workflow in made:
        await workflow.orch.stop(timeout=5)


async def drive(
    replicas: list[Workflow], clock: FakeClock, done: Callable[[], bool], limit: int = 200
) -> int:
    """Tick every replica, then let a second pass, until ``done``; returns ticks used."""
    for tick in range(limit):
        if done():
            return tick
        for workflow in replicas:
            await workflow.orch.run_once()
        clock.advance(1.0)
    raise AssertionError(f"not done after {limit} ticks")


def phase(db: Database[Any], name: str) -> str | None:
    doc = db.gateways.find_one({"name": name})
    return None if doc is None else doc["phase"]


async def test_creating_makes_each_child_once_then_waits_for_them(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    w = await replica(cert_delay=10.0)
    await w.platform.create_gateway("shop", custom_domain="shop.example.com")
    await w.orch.run_once()

    gateway = db.gateways.find_one({"name": "shop"})
    assert gateway is not None
    assert gateway["phase"] == "Creating"  # the certificate is not ready yet
    assert gateway["orchestratorWait"]["kind"] == "children"
    assert gateway["orchestratorOwns"] == list(CREATE_ORDER)  # the runtime domain first
    for kind, count in CHILDREN_PER_KIND.items():
        children = list(db[kind].find({"gatewayId": gateway["_id"]}))
        assert len(children) == count
        owners = {
            (c["orchestratorOwner"]["collection"], c["orchestratorOwner"]["id"]) for c in children
        }
        assert owners == {("gateways", gateway["_id"])}

    # A step whose wait was never written (its replica died) runs again: it makes no child
    # twice.
    db.gateways.update_one(
        {"_id": gateway["_id"]},
        {"$unset": {"orchestratorWait": "", "lockToken": ""}, "$set": {"lockedUntil": EPOCH}},
    )
    await w.orch.run_once()
    assert db.cloudFunctions.count_documents({"gatewayId": gateway["_id"]}) == 3

    await drive([w], clock, lambda: phase(db, "shop") == "Created")
    assert clock.monotonic() >= 10.0
    assert await w.platform.audit(["shop"], []) == []
    assert await w.platform.repeats() == 0


async def test_a_deletion_removes_each_child_once_the_data_last_and_resumes_half_way(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults()
    w = await replica(cert_delay=0.0, faults=faults)
    await w.platform.create_gateway("shop")
    await drive([w], clock, lambda: phase(db, "shop") == "Created")
    gateway_id = db.gateways.find_one({"name": "shop"})["_id"]

    faults.schedule("delete:stages")
    assert await w.platform.set_state("shop", "Deleted")
    await w.orch.run_once()
    assert phase(db, "shop") == "Deleting"
    stuck = db.stages.find_one({"gatewayId": gateway_id, "lastError": {"$exists": True}})
    assert stuck["phase"] == "Deleting"
    assert stuck["lastError"]["type"] == "ServiceError"
    # A step whose wait was never written runs again: what it moved is left as it is.
    db.gateways.update_one(
        {"_id": gateway_id},
        {"$unset": {"orchestratorWait": "", "lockToken": ""}, "$set": {"lockedUntil": EPOCH}},
    )

    def gone_data_last() -> bool:
        others = sum(db[k].count_documents({"gatewayId": gateway_id}) for k in USERS)
        data = db.databases.count_documents({"gatewayId": gateway_id})
        assert data or not others, "the database went before what uses it"
        return phase(db, "shop") is None

    await drive([w], clock, gone_data_last)
    archived = db.gatewaysArchive.find_one({"name": "shop"})
    assert archived["orchestratorOwns"] == list(CREATE_ORDER)
    assert await w.platform.audit([], ["shop"]) == []
    # Each child's removal ran once: the failed one was retried by its own step.
    deletions = [e for e in db[LEDGER].find() if e["_id"].endswith(":delete")]
    assert len(deletions) == sum(CHILDREN_PER_KIND.values())
    assert await w.platform.repeats() == 0
    assert w.orch.stats()["retrying"] == 1


async def test_deleting_a_gateway_still_creating_waits_for_a_stable_phase(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    w = await replica(cert_delay=20.0)
    await w.platform.create_gateway("shop", custom_domain="shop.example.com")
    await w.orch.run_once()
    await w.platform.set_state("shop", "Deleted")
    await w.orch.run_once()
    assert phase(db, "shop") == "Creating"  # never deleted under a running creation

    await drive([w], clock, lambda: phase(db, "shop") is None)
    assert await w.platform.audit([], ["shop"]) == []
    assert await w.platform.repeats() == 0


async def test_a_gateway_whose_certificate_keeps_failing_fails_and_can_be_deleted(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults()
    faults.schedule("certificate", times=5)  # CertManager.max_requests
    w = await replica(cert_delay=1.0, faults=faults)
    await w.platform.create_gateway("shop", custom_domain="shop.example.com")
    await drive([w], clock, lambda: phase(db, "shop") == "Failed", limit=2000)
    domain = db.runtimeDomains.find_one({})
    assert domain["phase"] == "Failed"  # the child's failure failed its gateway
    assert domain["lastError"]["message"] == "certificate for shop.example.com failed 5 times"
    assert w.orch.stats()["retrying"] == 4  # the first four failures were retried

    await w.platform.set_state("shop", "Deleted")
    await drive([w], clock, lambda: phase(db, "shop") is None)
    assert await w.platform.audit([], ["shop"]) == []


async def test_the_audit_finds_a_child_its_gateway_does_not_own_and_one_left_behind(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    w = await replica(cert_delay=0.0)
    for name in ("kept", "gone"):
        await w.platform.create_gateway(name)
    await drive([w], clock, lambda: phase(db, "kept") == phase(db, "gone") == "Created")
    await w.platform.set_state("gone", "Deleted")
    await drive([w], clock, lambda: phase(db, "gone") is None)
    assert await w.platform.audit(["kept"], ["gone"]) == []

    kept = db.gateways.find_one({"name": "kept"})["_id"]
    gone = db.gatewaysArchive.find_one({"name": "gone"})["_id"]
    db.stages.update_one({"gatewayId": kept}, {"$set": {"orchestratorOwner.id": "other"}})
    db.stages.insert_one({"orchestratorOwner": {"collection": "gateways", "id": gone}})
    problems = await w.platform.audit(["kept"], ["gone"])
    assert len(problems) == 2
    assert "kept: stages" in problems[0] and "owned by" in problems[0]
    assert problems[1] == "gone: stages left behind"


async def test_stopping_and_starting_scale_the_functions(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    w = await replica(cert_delay=0.0)
    await w.platform.create_gateway("shop")
    await drive([w], clock, lambda: phase(db, "shop") == "Created")

    await w.platform.set_state("shop", "Stopped")
    await w.orch.run_once()
    assert {f["replicas"] for f in db.cloudFunctions.find()} == {0}
    await w.orch.run_once()  # nothing more to do: the stop does not repeat
    assert db.gateways.find_one({})["stopped"] is True

    await w.platform.set_state("shop", "Running")
    await w.orch.run_once()
    assert {f["replicas"] for f in db.cloudFunctions.find()} == {1}
    assert await w.platform.set_state("nope", "Running") is False


async def test_three_replicas_share_forty_gateways_and_no_side_effect_runs_twice(
    replica: MakeWorkflow, db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(rate=0.05, seed=7)
    replicas = [await replica(f"pod-{n}", cert_delay=3.0, faults=faults) for n in range(3)]
    names = [f"gw-{n:02d}" for n in range(40)]
    for n, name in enumerate(names):
        await replicas[n % 3].platform.create_gateway(name, custom_domain=f"{name}.example.com")

    async def tick_together() -> None:
        # The replicas' ticks interleave on the loop at every database call.
        await asyncio.gather(*(w.orch.run_once() for w in replicas))
        clock.advance(1.0)

    async def until(done: Callable[[], bool]) -> None:
        for _ in range(300):
            if done():
                return
            await tick_together()
        raise AssertionError("not done after 300 ticks")

    await until(lambda: db.gateways.count_documents({"phase": "Created"}) == 40)
    deleted = names[::2]
    for name in deleted:
        await replicas[1].platform.set_state(name, "Deleted")
    await until(lambda: db.gatewaysArchive.count_documents({}) == 20)

    kept = sorted(set(names) - set(deleted))
    assert await replicas[0].platform.audit(kept, deleted) == []
    assert await replicas[0].platform.repeats() == 0
    busy = [w for w in replicas if w.orch.stats().get("claimed", 0) > 0]
    assert len(busy) > 1, "the work should be shared between replicas"
    assert sum(w.orch.stats().get("retrying", 0) for w in replicas) > 0  # faults were retried


async def test_the_demo_never_drops_gateways_it_did_not_make(
    adb: AsyncDatabase[Any], replica: MakeWorkflow
) -> None:
    workflow = await replica()
    # The default database is shared: an API server's gateway is already there.
    await adb.gateways.insert_one({"name": "prod-1", "phase": "Created"})
    with pytest.raises(ConfigError, match=r"holds gateways, which the demo did not make.*--db"):
        await workflow.platform.reset()
    assert await adb.gateways.count_documents({}) == 1

    # A database the demo made (its mark left) is reset as often as it runs.
    await adb.gateways.drop()
    await workflow.platform.reset()
    await adb.gateways.insert_one({"name": "gw-000", "phase": "Created"})
    await workflow.platform.reset()
    assert await adb.gateways.count_documents({}) == 0
