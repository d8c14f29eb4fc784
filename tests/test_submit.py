"""Idempotent creation and the indexes the claim and submit rely on."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import EPOCH, ConfigError, Lease, Resource
from orchestrator.operations import Reports
from tests.conftest import MakeEither, MakeReplica


def test_sixteen_threads_submitting_one_key_create_one_document(
    make: MakeReplica, db: Database[Any]
) -> None:
    replicas = [make(f"pod-{n}") for n in range(4)]
    barrier = threading.Barrier(16)
    returned: list[Any] = []
    errors: list[BaseException] = []

    def submit(n: int) -> None:
        barrier.wait()
        try:
            doc = replicas[n % 4].submit(
                "gateways", {"name": "gw-a", "phase": "Creating", "n": n}, unique="name"
            )
            returned.append(doc["_id"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert db.gateways.count_documents({"name": "gw-a"}) == 1
    assert len(returned) == 16
    assert len(set(returned)) == 1


class Gateway(Resource):
    collection = "gateways"
    unique = ("name",)
    name: str
    custom_domain: str | None = None


def test_submit_of_a_model_stores_camel_case_unlocked_and_returns_the_stored_document(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()
    first = orch.submit(
        Gateway, Gateway(name="a", phase="Creating", custom_domain="a.example"), unique="name"
    )
    again = orch.submit(
        Gateway, {"name": "a", "phase": "Creating", "customDomain": "other"}, unique="name"
    )
    assert first["_id"] == again["_id"]
    stored = db.gateways.find_one({"name": "a"})
    assert stored is not None
    assert stored["customDomain"] == "a.example", "the second submit must not overwrite"
    assert stored["lockedUntil"] == EPOCH
    assert stored["attempts"] == 0
    assert stored["createdAt"] == stored["updatedAt"]


def test_submit_refuses_bad_documents_clearly(make: MakeReplica) -> None:
    orch = make()
    with pytest.raises(ConfigError, match="unique key"):
        orch.submit("gateways", {"phase": "Creating"}, unique="name")
    with pytest.raises(ConfigError, match="phase"):
        orch.submit("gateways", {"name": "a"})
    with pytest.raises(ConfigError, match="phase"):
        orch.submit("gateways", {"name": "a", "phase": ""})
    with pytest.raises(ConfigError, match=r"\$"):
        orch.submit("gateways", {"phase": "Creating", "$where": "1"})
    with pytest.raises(ConfigError, match="invalid Gateway"):
        orch.submit(Gateway, {"phase": "Creating"})
    with pytest.raises(ConfigError, match="collection"):
        orch.submit("system.users", {"phase": "Creating"})


@pytest.mark.parametrize(
    "doc",
    [
        {"phase": "Creating", "orchestratorTrace": {"traceparent": "00-ab-cd-01"}},
        {"phase": "Creating", "orchestratorTrace.traceparent": "00-ab-cd-01"},
        Gateway(name="a", phase="Creating", orchestratorTrace={"traceparent": "x"}),
    ],
    ids=["dict", "dotted", "model-extra"],
)
def test_the_trace_context_is_the_orchestrator_s_to_store(
    make: MakeReplica, db: Database[Any], doc: Any
) -> None:
    """Stored by the listeners only (``SubmittingEvent``): a submit naming it is refused,
    as for the lease fields, through a dict or a model."""
    with pytest.raises(ConfigError, match=r"'orchestratorTrace.*' is managed by the orchestrator"):
        make().submit(Gateway if isinstance(doc, Gateway) else "gateways", doc)
    assert db.gateways.count_documents({}) == 0


def test_ensure_indexes_creates_the_claim_index_and_unique_keys(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()

    @orch.phase(Gateway, "Creating")
    def create(lease: Lease[Gateway]) -> Any:
        return lease.advance("Created")

    @orch.phase("domains", "Creating")
    def create_domain(lease: Lease[Any]) -> Any:
        return lease.advance("Created")

    orch.submit("domains", {"phase": "Creating", "host": "x"}, unique=["host"])
    orch.ensure_indexes()
    for name in ("gateways", "domains"):
        keys = {tuple(k for k, _ in info["key"]) for info in db[name].index_information().values()}
        assert ("phase", "claimPriority", "lockedUntil", "updatedAt", "_id") in keys
        assert ("phase", "lastError.at", "_id") in keys
    gateways = db.gateways.index_information()
    assert any(info.get("unique") and info["key"] == [("name", 1)] for info in gateways.values())
    domains = db.domains.index_information()
    assert any(info.get("unique") and info["key"] == [("host", 1)] for info in domains.values())
    orch.ensure_indexes()  # idempotent


def test_status_counts_documents_without_a_lease_field(
    make: MakeReplica, db: Database[Any], clock: Any
) -> None:
    """The claim treats a missing lockedUntil as free, so the status must count it too."""
    orch = make()
    orch.submit("jobs", {"phase": "Queued"})
    db.jobs.insert_one({"phase": "Queued"})
    rows = {r.phase: r for r in Reports(db).phase_summary("jobs", orch.clock.now())}
    assert rows["Queued"].count == 2
    assert rows["Queued"].leased == 0


@pytest.mark.anyio
async def test_each_document_submitted_between_two_run_onces_is_run_and_counted_by_the_next(
    replicas: MakeEither,
) -> None:
    """Submit, run_once, fifty times over: each tick runs the step of the document just
    submitted and counts it. A worker of the tick before that had not left yet when its
    run_once returned took the submit's wake and ran the step itself, between the two
    calls: the next run_once counted nothing (``{'ticks': 1}``), a few times in fifty."""
    replica = await replicas()

    @replica.phase("jobs", "A")
    async def step(lease: Any) -> Any:
        return await lease.advance("Done")

    counts = []
    for _ in range(50):
        await replica.submit("jobs", {"phase": "A"})
        counts.append(await replica.run_once())
    assert [c for c in counts if c.get("advanced") != 1] == []
