"""Retention of finished documents (``orch.retain``): the write entering a retained phase
dates the document for deletion in that same write, one leaving it undates it, a TTL index
has the server delete it, and the operators see it. On both engines and every database
mode (the ``mongodb`` tier included); time comes from the FakeClock, never from sleeps.

The in-memory store's TTL monitor (a pass at each whole minute of its clock) is driven
here by that clock. The wire tier's server may delete at once or within a minute (a real
MongoDB's monitor): there the field and the index are what is asserted.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.database import Database

from bench.instrument import CountingDatabase, Meter
from orchestrator import ConfigError, Lease, Orchestrator
from orchestrator.cli import connecting
from orchestrator.core.clock import as_utc
from orchestrator.core.names import RETENTION_INDEX_NAME
from orchestrator.core.resource import EXPIRY_FIELD
from orchestrator.operations import Action, Filter, Operations
from orchestrator.testing import FakeClock, async_view, memory_database
from tests.cli_kit import URI, publish, run
from tests.conftest import MakeEither, MakeReplica
from tests.operator_page import mounted

pytestmark = pytest.mark.anyio

DAY = timedelta(days=1)


def stored(db: Database[Any], doc_id: Any, collection: str = "reports") -> dict[str, Any]:
    doc = db[collection].find_one({"_id": doc_id})
    assert doc is not None
    return doc


def dated(doc: dict[str, Any]) -> timedelta:
    """How long after its phase's entry the document is dated for deletion."""
    return as_utc(doc[EXPIRY_FIELD]) - as_utc(doc["updatedAt"])


async def test_a_step_entering_a_retained_phase_dates_the_document_for_deletion(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    replica.orch.retain("reports", {"Done": "30d", "Failed": "90d"})

    @replica.phase("reports", "Render", max_attempts=1)
    async def render(lease: Any) -> Any:
        if lease.doc["_id"] == "broken":
            raise RuntimeError("no template")
        if lease.doc["_id"] == "refused":
            return await lease.fail("bad input")
        return await lease.advance("Done" if lease.doc["_id"] == "ok" else "Review")

    for doc_id in ("ok", "broken", "refused", "review"):
        await replica.submit("reports", {"_id": doc_id, "phase": "Render"})
    await replica.run_once()
    ok, broken, refused, review = (stored(db, i) for i in ("ok", "broken", "refused", "review"))
    assert (ok["phase"], dated(ok)) == ("Done", 30 * DAY)
    assert (broken["phase"], dated(broken)) == ("Failed", 90 * DAY)
    assert (refused["phase"], dated(refused)) == ("Failed", 90 * DAY)
    assert review["phase"] == "Review" and EXPIRY_FIELD not in review


async def test_a_step_taking_a_document_out_of_a_retained_phase_undates_it(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    replica.orch.retain("reports", {"Done": "1d"})

    @replica.phase("reports", "Done")
    async def archive(lease: Any) -> Any:
        return await lease.advance("Archived")

    submitted = await replica.submit("reports", {"_id": "r", "phase": "Done"})
    assert dated(submitted) == DAY  # submitted straight into a retained phase
    assert dated(stored(db, "r")) == DAY
    await replica.run_once()
    doc = stored(db, "r")
    assert doc["phase"] == "Archived" and EXPIRY_FIELD not in doc


async def test_ensure_indexes_makes_a_ttl_index_on_each_retained_collection(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    replica.orch.retain("reports", {"Done": 3600})
    await replica._call("ensure_indexes")
    [index] = [i for i in db.reports.list_indexes() if i["name"] == RETENTION_INDEX_NAME]
    assert dict(index["key"]) == {EXPIRY_FIELD: 1} and index["expireAfterSeconds"] == 0
    await replica._call("ensure_indexes")  # again: the index is there, nothing changes


async def test_an_index_on_the_expiry_field_with_other_options_is_refused_in_one_line(
    replicas: MakeEither, db: Database[Any]
) -> None:
    db.reports.create_index([(EXPIRY_FIELD, 1)], name="apps", expireAfterSeconds=60)
    replica = await replicas()
    replica.orch.retain("reports", {"Done": "1d"})
    with pytest.raises(ConfigError) as caught:
        await replica._call("ensure_indexes")
    message = str(caught.value)
    assert "'apps'" in message and "does not expire documents 0s after" in message
    assert "\n" not in message


async def test_an_earlier_index_of_the_retention_name_is_replaced_saying_so(
    replicas: MakeEither, db: Database[Any], caplog: pytest.LogCaptureFixture
) -> None:
    db.reports.create_index([(EXPIRY_FIELD, 1)], name=RETENTION_INDEX_NAME, expireAfterSeconds=9)
    replica = await replicas()
    replica.orch.retain("reports", {"Done": "1d"})
    await replica._call("ensure_indexes")
    [index] = [i for i in db.reports.list_indexes() if i["name"] == RETENTION_INDEX_NAME]
    assert index["expireAfterSeconds"] == 0
    assert f"replacing index {RETENTION_INDEX_NAME!r} on reports" in caplog.text


@pytest.mark.mongodb
async def test_the_dated_document_and_its_ttl_index_are_on_the_server(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """On every tier: the date the server deletes by, and the index it deletes with."""
    replica = await replicas()
    replica.orch.retain("reports", {"Done": "45s"})

    @replica.phase("reports", "Render")
    async def render(lease: Any) -> Any:
        return await lease.advance("Done")

    await replica._call("ensure_indexes")
    await replica.submit("reports", {"_id": "r", "phase": "Render"})
    await replica.run_once()
    assert dated(stored(db, "r")) == timedelta(seconds=45)
    names = {i["name"]: i.get("expireAfterSeconds") for i in db.reports.list_indexes()}
    assert names[RETENTION_INDEX_NAME] == 0


def test_retaining_adds_no_command_to_a_step() -> None:
    """The date rides in the advance: the same commands as without a retention."""

    def commands(retain: bool) -> dict[str, int]:
        clock, meter = FakeClock(), Meter()
        db = CountingDatabase(memory_database(clock=clock), meter)
        # One worker: the claims a tick makes do not depend on how workers race.
        orch = Orchestrator(db, replica_id="pod", clock=clock, clock_refresh=1e6, max_concurrency=1)  # type: ignore[arg-type]
        if retain:
            orch.retain("reports", {"Done": "30d"})

        @orch.phase("reports", "Render")
        def render(lease: Lease[Any]) -> Any:
            return lease.advance("Done")

        orch.submit("reports", {"_id": 1, "phase": "Render"})
        orch.measure_clock()
        meter.reset()
        orch.run_once()
        assert (EXPIRY_FIELD in db.reports.find_one({"_id": 1})) is retain  # type: ignore[operator]
        return dict(meter.ops)

    assert commands(retain=True) == commands(retain=False)


def test_a_document_holding_garbage_in_its_expiry_field_never_stops_a_step() -> None:
    clock = FakeClock()
    db = memory_database(clock=clock)
    orch = Orchestrator(db, replica_id="pod", clock=clock, clock_refresh=1e6)
    orch.retain("reports", {"Done": "1d"})

    @orch.phase("reports", "Render")
    def render(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    db.reports.insert_one({"_id": 1, "phase": "Render", EXPIRY_FIELD: ["soon", {"at": 1}]})
    orch.run_once()
    assert dated(stored(db, 1)) == DAY
    ops = Operations(db)
    assert ops.document("reports", 1)["phase"] == "Done"


# -- the in-memory store's TTL monitor -------------------------------------------------------


@pytest.mark.parametrize("engine", ["sync", "async"])
async def test_the_memory_store_deletes_past_their_date_at_its_monitors_next_pass(
    engine: str,
) -> None:
    """As MongoDB's TTL monitor: a pass each whole minute of the server's clock deletes
    what its index's date (the earliest of an array) puts past; other values stay."""
    clock = FakeClock(datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC))
    db = memory_database(clock=clock)
    db.docs.create_index([(EXPIRY_FIELD, 1)], expireAfterSeconds=0)
    at = clock.now()
    db.docs.insert_many(
        [
            {"_id": "date", EXPIRY_FIELD: at + timedelta(seconds=20)},
            {
                "_id": "array",
                EXPIRY_FIELD: ["x", at + timedelta(days=1), at + timedelta(seconds=5)],
            },
            {"_id": "text", EXPIRY_FIELD: "tomorrow"},
            {"_id": "number", EXPIRY_FIELD: 0},
            {"_id": "none"},
            {"_id": "later", EXPIRY_FIELD: at + timedelta(minutes=5)},
        ]
    )
    everything = {"date", "array", "text", "number", "none", "later"}

    async def ids() -> set[str]:
        if engine == "sync":
            return {d["_id"] for d in db.docs.find()}
        return {d["_id"] for d in await async_view(db).docs.find().to_list()}

    clock.advance(40)  # 00:00:50: both dates are past, but no pass since
    assert await ids() == everything
    clock.advance(10)  # 00:01:00: the monitor's pass
    assert await ids() == everything - {"date", "array"}
    clock.advance(5 * 60)
    assert await ids() == {"text", "number", "none"}


# -- the operators ---------------------------------------------------------------------------


async def test_an_operators_cancel_dates_and_a_retry_undates_by_the_live_replicas_retention(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    replica.orch.retain("reports", {"Cancelled": "7d", "Failed": "90d"})

    @replica.phase("reports", "Render", max_attempts=1)
    async def render(lease: Any) -> Any:
        raise RuntimeError("no template")

    await replica.submit("reports", {"_id": "c", "phase": "Waiting"})
    await replica.submit("reports", {"_id": "f", "phase": "Render"})
    await replica.run_once()
    assert dated(stored(db, "f")) == 90 * DAY
    await replica.start()  # its record: what the operators' tools act by
    ops = Operations(db, actor="ops@test")
    [record] = ops.replicas()
    assert record.retention_of("reports") == {
        "Cancelled": 7 * 86400.0,
        "Failed": 90 * 86400.0,
    }
    ops.cancel("reports", ops.document("reports", "c"), any_phase=True)
    assert dated(stored(db, "c")) == 7 * DAY
    replica.request_stop()
    ops.retry("reports", ops.document("reports", "f"), "Render")
    doc = stored(db, "f")
    assert doc["phase"] == "Render" and EXPIRY_FIELD not in doc
    for doc_id in ("b1", "b2"):
        await replica.submit("reports", {"_id": doc_id, "phase": "Waiting"})
    result = ops.bulk(Action.CANCEL, Filter("reports", phases=("Waiting",)))
    assert len(result.changed) == 2
    assert [dated(stored(db, i)) for i in ("b1", "b2")] == [7 * DAY, 7 * DAY]


# -- what operators see ----------------------------------------------------------------------


def test_status_the_page_and_a_documents_views_show_the_retention_and_the_expiry(
    db: Database[Any], make: MakeReplica, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    monkeypatch.setenv("COLUMNS", "200")
    orch = make("pod-1")
    orch.retain("reports", {"Done": "30d", "Failed": "90d"})

    @orch.phase("reports", "Render")
    def render(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.submit("reports", {"_id": "r", "phase": "Render"})
    orch.run_once()
    publish(db, orch)
    expires = as_utc(stored(db, "r")[EXPIRY_FIELD])
    shown = f"{expires:%Y-%m-%d %H:%M:%S}"

    code, out, _ = run(["status", "--uri", URI], capsys)
    assert code == 0 and "reports: Done 30d, Failed 90d" in out
    code, out, _ = run(["status", "--uri", URI, "--json"], capsys)
    assert json.loads(out)["retention"]["reports"]["Done"] == {
        "seconds": 30 * 86400.0,
        "shown": "30d",
    }
    code, out, _ = run(["history", "r", "-c", "reports", "--uri", URI], capsys)
    assert code == 0 and f"deleted by the server from {shown} UTC" in out

    with mounted(db) as page:
        overview = page.get("/ops/").text
        assert "Retention" in overview and "Done 30d, Failed 90d" in overview
        document = page.get("/ops/document", params={"c": "reports", "id": "r"}).text
        assert EXPIRY_FIELD in document and f"{shown} UTC" in document
        found = page.get("/ops/api/document", params={"c": "reports", "id": "r"}).json()
        assert found["row"]["expires_at"] == expires.isoformat()
        status = page.get("/ops/api/status").json()
        assert status["retention"] == {
            "reports": {
                "Done": {"seconds": 30 * 86400.0, "shown": "30d"},
                "Failed": {"seconds": 90 * 86400.0, "shown": "90d"},
            }
        }
