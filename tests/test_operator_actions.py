"""What operators do to the work, on both engines: a document's history as its steps and
the operators leave it; pause and resume; cancel of a running step; actions on every
document of a filter; refusals of phases no live replica handles; the audit trail; and the
record of a dead replica's leases taken over."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import ConfigError, LeaseLost, Orchestrator
from orchestrator.core import history
from orchestrator.core.audit import AuditKind
from orchestrator.core.clock import bson_time
from orchestrator.operations import (
    Action,
    Cancelled,
    Filter,
    LeaseHeld,
    LeaseState,
    NoErrorPhase,
    Operations,
    OperatorError,
    Refusal,
    Retried,
    Scope,
    UnhandledPhase,
)
from orchestrator.testing import FakeClock
from orchestrator.testing.faults import Faults
from tests.cli_kit import publish
from tests.conftest import MakeEither
from tests.engines import hold, wait

pytestmark = pytest.mark.anyio


def entries(db: Database[Any], doc_id: Any) -> list[history.Entry]:
    return history.entries(db.jobs.find_one({"_id": doc_id}) or {})


# -- history ----------------------------------------------------------------------------------


async def test_each_step_leaves_its_entry_in_the_same_write(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas("pod-1", max_attempts=2)

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        if lease.doc.get("n") is None:
            return await lease.unlock(n=1)
        if lease.doc.get("waited") is None:
            return await lease.relock(5, waited=True)
        return await lease.advance("B")

    @replica.phase("jobs", "B")
    async def b(lease: Any) -> Any:
        raise RuntimeError("the bank said no; password=hunter2")

    await replica.submit("jobs", {"_id": "j", "phase": "A"})
    for _ in range(4):
        await replica.run_once()
        clock.advance(10)
    steps = entries(db, "j")
    assert [(e.what, e.phase, e.to) for e in steps] == [
        ("unlocked", "A", "A"),
        ("relocked", "A", "A"),
        ("advanced", "A", "B"),
        ("retrying", "B", "B"),
        ("failed", "B", "Failed"),
    ]
    assert {e.kind for e in steps} == {"step"} and {e.by for e in steps} == {"pod-1"}
    assert all(e.at is not None and e.took is not None and e.took >= 0 for e in steps)
    failed = steps[-1]
    assert failed.error_type == "RuntimeError" and "hunter2" not in (failed.error_message or "")
    assert failed.traceback is not None and "raise RuntimeError" in failed.traceback
    assert "hunter2" not in failed.traceback
    stored = db.jobs.find_one({"_id": "j"})
    assert stored is not None and "raise RuntimeError" in stored["lastError"]["traceback"]


async def test_the_history_keeps_its_last_entries_and_may_be_off(
    replicas: MakeEither, db: Database[Any]
) -> None:
    short = await replicas("pod-1", history=3, traceback_chars=0, max_unlocks_per_tick=50)
    count = {"n": 0}

    @short.phase("jobs", "A")
    async def spin(lease: Any) -> Any:
        count["n"] += 1
        if count["n"] < 8:
            return await lease.unlock()
        raise ValueError("no traceback kept")

    await short.submit("jobs", {"_id": "j", "phase": "A"})
    await short.run_once()
    kept = entries(db, "j")
    assert [e.what for e in kept] == ["unlocked", "unlocked", "retrying"]
    assert kept[-1].traceback is None
    off = await replicas("pod-2", history=0)

    @off.phase("jobs", "C")
    async def c(lease: Any) -> Any:
        return await lease.advance("D")

    await off.submit("jobs", {"_id": "k", "phase": "C"})
    await off.run_once()
    doc = db.jobs.find_one({"_id": "k"})
    assert doc is not None and doc["phase"] == "D" and history.HISTORY_FIELD not in doc


@pytest.mark.parametrize("odd", ["a string", 7, {"entries": []}, None])
async def test_a_history_field_holding_anything_never_blocks_a_step(
    replicas: MakeEither, db: Database[Any], odd: Any
) -> None:
    replica = await replicas()

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        return await lease.advance("B")

    db.jobs.insert_one({"_id": "j", "phase": "A", history.HISTORY_FIELD: odd})
    assert (await replica.run_once()).get("advanced") == 1
    assert [e.what for e in entries(db, "j")] == ["advanced"]


async def test_a_step_that_takes_over_an_expired_lease_says_whose_it_was(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas("pod-2")

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        return await lease.advance("B")

    now = bson_time(replica.clock.now())
    db.jobs.insert_one(
        {
            "_id": "j",
            "phase": "A",
            "lockToken": "t-dead",
            "lockedBy": "pod-dead",
            "lockedUntil": now - timedelta(seconds=1),
        }
    )
    await replica.run_once()
    assert [(e.what, e.taken_from) for e in entries(db, "j")] == [("advanced", "pod-dead")]
    assert replica.stats()["taken_over"] == 1
    [record] = Operations(db).audit()
    assert (record.kind, record.by, record.taken_from) == (AuditKind.TAKEOVER, "pod-2", "pod-dead")
    assert record.documents == ('"j"',)
    assert [t.taken_from for t in Operations(db).status().takeovers] == ["pod-dead"]


# -- pauses -----------------------------------------------------------------------------------


async def test_a_pause_takes_hold_at_the_next_heartbeat_and_a_resume_too(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    done: list[str] = []

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        done.append(lease.doc["_id"])
        return await lease.advance("Done")

    @replica.phase("jobs", "B")
    async def b(lease: Any) -> Any:
        done.append(lease.doc["_id"])
        return await lease.advance("Done")

    ops = Operations(db, actor="ops@test")
    assert ops.pause(Scope("jobs", "A"), force=True, why="the CA is down")
    assert not ops.pause(Scope("jobs", "A"), force=True, by="someone else")  # one pause per scope
    await replica.heartbeat()
    await replica.submit("jobs", {"_id": "a1", "phase": "A"})
    await replica.submit("jobs", {"_id": "b1", "phase": "B"})
    await replica.run_once()
    assert done == ["b1"]  # A is paused on this replica; B is not
    [pause] = ops.pauses()
    assert (pause.by, pause.why, pause.scope.describe()) == (
        "ops@test",
        "the CA is down",
        "jobs, phase A",
    )
    assert ops.resume(Scope("jobs", "A"))
    await replica.run_once()
    assert done == ["b1", "a1"]  # the next tick's probe read the pauses with the rest
    assert [a.action for a in ops.audit()] == ["resume", "pause"]


async def test_a_pause_of_a_collection_or_a_handler_covers_just_that(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    done: list[str] = []

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        done.append("A")
        return await lease.advance("Done")

    @replica.phase("other", "A")
    async def other(lease: Any) -> Any:
        done.append("other")
        return await lease.advance("Done")

    ops = Operations(db)
    name = next(h.name for h in replica.orch.handlers if h.collection == "other")
    assert name.endswith(
        ":test_a_pause_of_a_collection_or_a_handler_covers_just_that.<locals>.other"
    )
    ops.pause(Scope("other", handler=name), force=True)
    await replica.heartbeat()
    await replica.submit("jobs", {"phase": "A"})
    await replica.submit("other", {"phase": "A"})
    await replica.run_once()
    assert done == ["A"]
    ops.resume(Scope("other", handler=name))
    ops.pause(Scope("jobs"), force=True)
    await replica.heartbeat()
    await replica.submit("jobs", {"phase": "A"})
    await replica.run_once()
    assert done == ["A", "other"]


async def test_an_advance_into_a_paused_phase_releases_the_document_instead_of_carrying_it(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """A step that frees its document for a handler an operator paused writes a plain
    release (no lease carried on into the paused handler's step), and resuming runs it."""
    replica = await replicas()
    done: list[str] = []

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        done.append("A")
        return await lease.advance("B")

    @replica.phase("jobs", "B")
    async def b(lease: Any) -> Any:
        done.append("B")
        return await lease.advance("Done")

    ops = Operations(db)
    ops.pause(Scope("jobs", "B"), force=True)
    await replica.heartbeat()
    await replica.submit("jobs", {"_id": "j1", "phase": "A"})
    await replica.run_once()
    doc = db.jobs.find_one({"_id": "j1"})
    assert done == ["A"] and doc is not None
    assert doc["phase"] == "B" and "lockToken" not in doc  # released, held by nobody
    assert replica.orch.stats().get("carried", 0) == 0
    ops.resume(Scope("jobs", "B"))
    await replica.run_once()
    assert done == ["A", "B"]
    assert db.jobs.find_one({"_id": "j1"}, {"phase": 1}) == {"_id": "j1", "phase": "Done"}


@pytest.mark.parametrize("replicas", ["async"], indirect=True)
async def test_a_probe_answer_that_lands_after_a_heartbeats_read_does_not_undo_its_pause(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """A tick's probe reads the pauses with its answer; a heartbeat's read sent after it
    and answered first is the fresher: the probe's answer, held back until then, neither
    lifts the pause the heartbeat read nor lets the paused handler claim."""
    replica = await replicas()
    orch = replica.orch
    done: list[str] = []

    @orch.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        done.append("A")
        return await lease.advance("Done")

    @orch.phase("jobs", "B")
    async def b(lease: Any) -> Any:
        return await lease.advance("Done")

    store = orch._store
    real_probe = store.probe
    answered, landing = asyncio.Event(), asyncio.Event()

    async def held_probe(*args: Any, **kwargs: Any) -> Any:
        found = await real_probe(*args, **kwargs)  # read now: no pause, A has work
        answered.set()
        await landing.wait()  # its reply lands after the heartbeat's read
        return found

    store.probe = held_probe
    await replica.submit("jobs", {"_id": "a1", "phase": "A"})
    tick = asyncio.ensure_future(orch.run_once(heartbeat=False))
    await answered.wait()
    Operations(db).pause(Scope("jobs", "A"), force=True)
    await orch.heartbeat()  # reads the pause and applies it
    landing.set()
    await tick
    assert done == []  # the paused handler claimed nothing
    assert orch._pauses.scopes == ["jobs, phase A"]  # the probe's older answer was dropped
    doc = db.jobs.find_one({"_id": "a1"})
    assert doc is not None and doc["phase"] == "A" and "lockToken" not in doc


def test_an_idle_tick_reads_the_pauses_within_its_one_probe(
    db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(clock=clock)
    plain = Orchestrator(faults.wrap(db), replica_id="pod-1", clock=clock, clock_refresh=1e6)

    @plain.phase("jobs", "A")
    def a(lease: Any) -> Any:
        return lease.advance("B")

    Operations(db).pause(Scope("jobs", "B"), force=True)
    plain.heartbeat()
    before = dict(faults.operations)
    for _ in range(5):
        plain.run_once()
    sent = {k: v - before.get(k, 0) for k, v in faults.operations.items()}
    assert {k: v for k, v in sent.items() if v} == {"aggregate": 5}  # one probe a tick
    assert plain.stats().get("claimed", 0) == 0


# -- actions ----------------------------------------------------------------------------------


async def test_a_cancel_takes_the_lease_of_a_running_step_whose_write_then_fails(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box = hold(replica)
    await replica.submit("jobs", {"_id": "j", "phase": "Running"})
    tick = asyncio.ensure_future(replica.run_once())
    assert await wait(box["claimed"])
    ops = Operations(db, actor="ops@test")
    seen = ops.document("jobs", "j")
    cancelled = ops.cancel("jobs", seen, why="customer asked")
    assert isinstance(cancelled, Cancelled) and cancelled.action is Action.CANCEL
    assert cancelled.document["phase"] == "Cancelled" and cancelled.lease_taken
    box["go"].set()
    await tick
    assert isinstance(box["lost"], LeaseLost)
    doc = db.jobs.find_one({"_id": "j"})
    assert doc is not None and doc["phase"] == "Cancelled" and "lockToken" not in doc
    [entry] = history.entries(doc)
    assert (entry.kind, entry.what, entry.by, entry.why) == (
        "operator",
        "cancel",
        "ops@test",
        "customer asked",
    )
    assert (entry.phase, entry.to) == ("Running", "Cancelled")


async def test_retry_and_cancel_go_only_to_phases_a_live_replica_handles(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()

    @replica.phase("jobs", "Charging")
    async def charge(lease: Any) -> Any:
        return await lease.fail("card declined")

    await replica.submit("jobs", {"_id": "j", "phase": "Charging"})
    await replica.run_once()
    ops = Operations(db)
    with pytest.raises(UnhandledPhase, match=r"'Chargin'.*no replica is live"):
        ops.retry("jobs", ops.document("jobs", "j"), "Chargin")
    # Live by its record, not started: a started replica would claim what the test sends
    # to Charging (and fail it) before the test reads it.
    publish(db, replica.orch)
    with pytest.raises(UnhandledPhase, match=r"'Chargin'.*they handle: Charging"):
        ops.retry("jobs", ops.document("jobs", "j"), "Chargin")
    with pytest.raises(UnhandledPhase, match="Bogus"):
        ops.cancel("jobs", ops.document("jobs", "j"), to="Bogus")
    retried = ops.retry("jobs", ops.document("jobs", "j"))  # its error's phase: handled
    assert isinstance(retried, Retried) and retried.target == "Charging"
    forced = ops.retry("jobs", ops.document("jobs", "j"), "Elsewhere", any_phase=True)
    assert forced.document["phase"] == "Elsewhere"
    # Retried once, it is retried again to its previous error's phase.
    again = ops.retry("jobs", ops.document("jobs", "j"))
    assert again.target == "Charging"
    db.jobs.insert_one({"_id": "fresh", "phase": "Charging"})
    with pytest.raises(NoErrorPhase) as refused:
        ops.retry("jobs", ops.document("jobs", "fresh"))
    # A bulk retry of its phase leaves it alone for the same refusal.
    [left] = ops.bulk(Action.RETRY, Filter("jobs", ("Charging",)), dry_run=True).skipped
    assert left.row.id == "fresh" and left.refusal is refused.value.refusal
    await replica.stop()


async def test_a_bulk_retry_lists_then_acts_on_what_still_matches(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas(max_attempts=1)

    @replica.phase("invoices", "Charging")
    async def charge(lease: Any) -> Any:
        if lease.doc.get("fixed"):
            return await lease.advance("Paid")
        raise RuntimeError("card declined")

    for n in range(5):
        await replica.submit(
            "invoices", {"phase": "Charging", "invoiceNo": f"INV-{n}"}, unique="invoiceNo"
        )
    await replica.run_once()
    ops = Operations(db, actor="ops@test")
    await replica.start()
    failed = Filter("invoices", ("Failed",), LeaseState.FAILED)
    dry = ops.bulk(Action.RETRY, failed, dry_run=True)
    assert sorted(r.key or "" for r in dry.changed) == [f"invoiceNo=INV-{n}" for n in range(5)]
    assert db.invoices.count_documents({"phase": "Failed"}) == 5  # nothing changed
    # One is claimed by a replica meanwhile (a live lease): not retried without force.
    now = bson_time(replica.clock.now())
    db.invoices.update_one(
        {"invoiceNo": "INV-0"},
        {
            "$set": {
                "lockToken": "t",
                "lockedBy": "pod-x",
                "lockedUntil": now + timedelta(seconds=60),
            }
        },
    )
    db.invoices.update_many({}, {"$set": {"fixed": True}})
    done = ops.bulk(Action.RETRY, failed, why="the card was updated")
    assert sorted(r.key or "" for r in done.changed) == [f"invoiceNo=INV-{n}" for n in range(1, 5)]
    [skipped] = done.skipped
    assert skipped.row.key == "invoiceNo=INV-0" and "live lease" in skipped.why
    assert skipped.refusal is Refusal.LEASE_HELD
    [record] = [a for a in ops.audit() if a.action == "retry"]
    assert (record.count, record.by, record.why) == (4, "ops@test", "the card was updated")
    assert record.scope["state"] == "failed"
    await replica.stop()
    await replica.run_once()
    assert db.invoices.count_documents({"phase": "Paid"}) == 4
    # The same document refused alone: the same refusal, raised.
    with pytest.raises(LeaseHeld) as refused:
        ops.retry("invoices", ops.find("invoices", "INV-0"), "Charging", any_phase=True)
    assert refused.value.refusal is skipped.refusal


async def test_a_bulk_retry_of_the_failed_list_leaves_documents_still_retrying_alone(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """Failed is what a handler gave up on; a document whose attempt failed and that the
    library tries again is retrying, listed apart, and a bulk retry of the failed list
    changes none of it (before: the failed list held both, and its retry reset the
    attempts of the ones still being retried)."""
    replica = await replicas(max_attempts=3)

    @replica.phase("invoices", "Charging")
    async def charge(lease: Any) -> Any:
        if lease.doc.get("fixed"):
            return await lease.advance("Paid")
        if lease.doc["stolen"]:
            return await lease.fail("the card was reported stolen")
        raise RuntimeError("the bank did not answer")

    for n in range(4):
        doc = {"phase": "Charging", "invoiceNo": f"INV-{n}", "stolen": n < 2}
        await replica.submit("invoices", doc, unique="invoiceNo")
    await replica.run_once()  # the clock stands still: the retries wait out their backoff
    await replica.start()
    ops = Operations(db, actor="ops@test")

    def keys(state: LeaseState) -> list[str]:
        return [r.key or "" for r in ops.browse(Filter("invoices", state=state)).rows]

    assert sorted(keys(LeaseState.FAILED)) == ["invoiceNo=INV-0", "invoiceNo=INV-1"]
    assert sorted(keys(LeaseState.RETRYING)) == ["invoiceNo=INV-2", "invoiceNo=INV-3"]
    [charging, failed] = ops.status(["invoices"]).phases
    assert (failed.phase, failed.failed, failed.retrying) == ("Failed", 2, 0)
    assert (charging.phase, charging.failed, charging.retrying) == ("Charging", 0, 2)
    db.invoices.update_many({}, {"$set": {"fixed": True}})
    done = ops.bulk(Action.RETRY, Filter("invoices", state=LeaseState.FAILED), why="card fixed")
    assert sorted(r.key or "" for r in done.changed) == ["invoiceNo=INV-0", "invoiceNo=INV-1"]
    assert not done.skipped
    for n in (2, 3):
        left = db.invoices.find_one({"invoiceNo": f"INV-{n}"})
        assert left is not None
        assert (left["phase"], left["attempts"], left["lastError"]["type"]) == (
            "Charging",
            1,
            "RuntimeError",
        )
        assert [e.what for e in history.entries(left)] == ["retrying"]
    await replica.stop()


async def test_a_document_is_found_by_its_business_key(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    await replica.submit("invoices", {"phase": "New", "invoiceNo": "INV-1003"}, unique="invoiceNo")
    ops = Operations(db)
    assert ops.find("invoices", "INV-1003")["invoiceNo"] == "INV-1003"
    page = ops.browse(Filter("invoices", fields=ops.key_filter("invoices", "INV-1003")))
    assert [r.key for r in page.rows] == ["invoiceNo=INV-1003"]


# -- whatever the stored documents hold ---------------------------------------------------------


async def test_what_is_no_pause_is_skipped_and_a_history_of_anything_reads(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        return await lease.advance("B")

    db["orchestrator.pauses"].insert_many(
        [{}, {"collection": 5}, {"collection": "$x"}, {"collection": "jobs", "phase": ["A"]}]
    )
    await replica.heartbeat()
    await replica.submit("jobs", {"_id": "j", "phase": "A"})
    assert (await replica.run_once()).get("advanced") == 1  # no pause read from garbage
    assert Operations(db).pauses() == []
    db.jobs.update_one(
        {"_id": "j"},
        {"$set": {history.HISTORY_FIELD: [1, "x", None, {"at": "then", "took": "long"}, []]}},
    )
    read = Operations(db).history("jobs", "j")
    assert [(e.kind, e.at, e.took) for e in read] == [("?", None, None)] * 5


def test_a_filter_or_a_cursor_that_is_no_value_is_refused(db: Database[Any]) -> None:
    db.jobs.insert_one({"_id": 1, "phase": "A", "n": 1})
    ops = Operations(db)
    with pytest.raises(OperatorError, match="cursor"):
        ops.browse(Filter("jobs"), after="not-a-cursor")
    with pytest.raises(OperatorError, match="1 to 500"):
        ops.browse(Filter("jobs"), limit=0)
    with pytest.raises(ConfigError, match="unknown collection 'nope'"):
        ops.browse(Filter("nope"))
    with pytest.raises(OperatorError, match="must be a name"):
        Scope("jobs", phase="$where")
    with pytest.raises(OperatorError, match="narrow it") as refused:
        ops.bulk(Action.UNLOCK, Filter("jobs"), limit=0)
    assert refused.value.refusal is Refusal.TOO_MANY
    [left] = ops.bulk(Action.UNLOCK, Filter("jobs"), dry_run=True).skipped
    assert left.refusal is Refusal.ALREADY_FREE and "free already" in left.why


async def test_a_claim_reads_the_last_history_entry_only(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """A claim's reply, and its decoding on every step, do not grow with the history."""
    replica = await replicas(history=50, max_unlocks_per_tick=100)
    seen: list[Any] = []

    @replica.phase("jobs", "A")
    async def a(lease: Any) -> Any:
        seen.append(lease.doc.get(history.HISTORY_FIELD))
        return await (lease.unlock() if len(seen) < 6 else lease.advance("B"))

    await replica.submit("jobs", {"_id": "j", "phase": "A"})
    await replica.run_once()
    assert seen[0] is None and all(len(h) == 1 for h in seen[1:])
    assert len(entries(db, "j")) == 6
