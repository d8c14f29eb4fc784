"""What a real MongoDB does that a naive client trips over, and the unique keys submit
takes by default: each case as the driver meets it, in memory (the in-memory store answers
as the server does) and against ``MONGODB_URI`` where a server can show it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

import bson
import pytest
from bson import DatetimeMS
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.son import SON
from pymongo.database import Database
from pymongo.errors import (
    DocumentTooLarge,
    OperationFailure,
    WriteConcernError,
    WriteError,
    WTimeoutError,
)

from orchestrator import ConfigError, Lease, Orchestrator, Resource, StoreError
from orchestrator.cli import connecting
from orchestrator.cli import main as cli
from orchestrator.core.clock import bson_time
from orchestrator.core.history import HISTORY_FIELD
from orchestrator.core.names import CLAIM_INDEX_NAME
from orchestrator.core.queries import claims, lease_writes
from orchestrator.core.settings import Settings
from orchestrator.mongo import Store
from orchestrator.mongo.connection import MIN_SERVER_VERSION
from orchestrator.mongo.driver_errors import driver_errors
from orchestrator.testing import FakeClock, memory_database
from orchestrator.testing.memory import MAX_BSON_SIZE
from tests.conftest import MakeEither, MakeReplica, server_name


class Gateway(Resource):
    collection = "gateways"
    unique: ClassVar[tuple[str, ...]] = ("name",)
    name: str


def index_names(db: Database[Any], collection: str) -> dict[str, list[tuple[str, Any]]]:
    return {name: info["key"] for name, info in db[collection].index_information().items()}


# -- the model's unique keys are submit's default --------------------------------------------


def test_submit_defaults_to_the_unique_keys_the_model_declares(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()
    first = orch.submit(Gateway, {"name": "a", "phase": "Creating"})
    again = orch.submit(Gateway, Gateway(name="a", phase="Creating"))
    assert again["_id"] == first["_id"]
    assert db.gateways.count_documents({"name": "a"}) == 1

    @orch.phase(Gateway, "Creating")
    def create(lease: Lease[Gateway]) -> Any:
        return lease.advance("Created")

    # By collection name, the model registered on the collection gives the keys too.
    by_name = orch.submit("gateways", {"name": "a", "phase": "Creating"})
    assert by_name["_id"] == first["_id"]
    assert db.gateways.count_documents({"name": "a"}) == 1


# -- indexes that already exist under another name ----------------------------------------------


def test_an_applications_unique_index_under_another_name_is_reused(
    make: MakeReplica, db: Database[Any]
) -> None:
    db.gateways.create_index([("name", 1)], unique=True, name="gateway_by_name")
    orch = make()
    orch.submit(Gateway, {"name": "a", "phase": "Creating"})
    orch.submit(Gateway, {"name": "a", "phase": "Creating"})
    orch.ensure_indexes()
    assert db.gateways.count_documents({}) == 1
    keys = index_names(db, "gateways")
    assert [name for name, key in keys.items() if key == [("name", 1)]] == ["gateway_by_name"]


def test_a_unique_index_on_the_same_fields_in_another_order_is_reused(
    make: MakeReplica, db: Database[Any]
) -> None:
    db.domains.create_index([("host", -1), ("zone", 1)], unique=True, name="by_zone_host")
    make().submit("domains", {"zone": "z", "host": "h", "phase": "New"}, unique=["zone", "host"])
    assert set(index_names(db, "domains")) == {"_id_", "by_zone_host"}


def test_a_non_unique_index_on_the_unique_keys_is_refused_by_name(
    make: MakeReplica, db: Database[Any]
) -> None:
    db.gateways.create_index([("name", 1)], name="name_lookup")
    orch = make()
    with pytest.raises(ConfigError, match=r"'name_lookup' on \(name\) that is not unique"):
        orch.submit(Gateway, {"name": "a", "phase": "Creating"})

    @orch.phase(Gateway, "Creating")
    def create(lease: Lease[Gateway]) -> Any:
        return lease.advance("Created")

    with pytest.raises(ConfigError, match="name_lookup"):
        orch.start()
    assert db.gateways.count_documents({}) == 0


def test_a_unique_index_cannot_be_built_over_duplicates_and_says_so(
    make: MakeReplica, db: Database[Any]
) -> None:
    db.gateways.insert_many([{"name": "a", "phase": "Creating"} for _ in range(2)])
    with pytest.raises(ConfigError, match=r"same \(name\).*duplicates"):
        make().submit(Gateway, {"name": "a", "phase": "Creating"})


def test_an_equivalent_claim_index_under_another_name_is_reused(
    make: MakeReplica, db: Database[Any]
) -> None:
    db.jobs.create_index(claims.CLAIM_INDEX, name="app_claim")
    orch = make()

    @orch.phase("jobs", "Queued")
    def run(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.ensure_indexes()
    orch.ensure_indexes()
    claim_keys = [
        name for name, key in index_names(db, "jobs").items() if key == claims.CLAIM_INDEX
    ]
    assert claim_keys == ["app_claim"]


@pytest.mark.parametrize(
    ("options", "reason"),
    [({"sparse": True}, "is sparse"), ({"unique": True}, "is unique")],
)
def test_an_index_on_the_claim_keys_that_cannot_serve_it_is_refused_by_name(
    make: MakeReplica, db: Database[Any], options: dict[str, Any], reason: str
) -> None:
    db.jobs.create_index(claims.CLAIM_INDEX, name="odd_claim", **options)
    orch = make()

    @orch.phase("jobs", "Queued")
    def run(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    with pytest.raises(ConfigError, match=f"'odd_claim' on .* that {reason}"):
        orch.ensure_indexes()


def test_the_claim_index_of_an_earlier_version_is_replaced(
    make: MakeReplica, db: Database[Any]
) -> None:
    """An upgrade that changes the claim's key pattern keeps the index name."""
    db.jobs.create_index([("phase", 1), ("lockedAt", 1)], name=CLAIM_INDEX_NAME)
    db.jobs.insert_one({"phase": "Queued"})
    orch = make()

    @orch.phase("jobs", "Queued")
    def run(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.ensure_indexes()
    assert index_names(db, "jobs")[CLAIM_INDEX_NAME] == claims.CLAIM_INDEX


def test_the_in_memory_store_refuses_conflicting_indexes_as_the_server_does() -> None:
    db = memory_database()
    db.c.create_index([("a", 1)], name="mine")
    assert db.c.create_index([("a", 1)], name="mine") == "mine"  # identical: no-op
    with pytest.raises(OperationFailure) as clash:
        db.c.create_index([("a", 1)], name="yours")
    assert clash.value.code == 85
    assert "Index already exists with a different name: mine" in str(clash.value)
    with pytest.raises(OperationFailure) as same_name:
        db.c.create_index([("b", 1)], name="mine")
    assert same_name.value.code == 86
    with pytest.raises(OperationFailure) as options:
        db.c.create_index([("a", 1)], name="mine", expireAfterSeconds=5)
    assert options.value.code == 85
    # Since MongoDB 5.0 uniqueness is part of an index's identity: both may exist.
    assert db.c.create_index([("a", 1)], name="unique_a", unique=True) == "unique_a"
    older = memory_database(wire_version=9)  # MongoDB 4.4
    older.c.create_index([("a", 1)], name="mine")
    with pytest.raises(OperationFailure) as before_5:
        older.c.create_index([("a", 1)], name="unique_a", unique=True)
    assert before_5.value.code == 85


def test_a_non_unique_index_is_refused_the_same_on_servers_before_5_0(clock: FakeClock) -> None:
    db = memory_database(clock=clock, wire_version=9)
    db.gateways.create_index([("name", 1)], name="name_lookup")
    with pytest.raises(ConfigError, match=r"'name_lookup' on \(name\) that is not unique"):
        Orchestrator(db, clock=clock).submit(Gateway, {"name": "a", "phase": "Creating"})


# -- write concern without a majority ------------------------------------------------------------


@pytest.mark.pure
def test_write_timeout_is_a_bounded_setting() -> None:
    assert Settings().write_timeout == 10.0
    for bad in (0, -1, 601, float("inf")):
        with pytest.raises(ConfigError, match="write_timeout"):
            Settings.build(write_timeout=bad)


def test_lease_writes_without_a_majority_fail_transiently_instead_of_blocking(
    clock: FakeClock,
) -> None:
    db = memory_database(clock=clock)
    orch = Orchestrator(db, replica_id="pod-1", clock=clock, write_timeout=5)

    @orch.phase("jobs", "Queued")
    def run(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Queued"})
    replication = db.replication  # type: ignore[attr-defined]
    replication.lose_majority()
    counts: dict[str, int] = {}
    tick = threading.Thread(target=lambda: counts.update(orch.run_once()))
    tick.start()
    try:
        replication.wait_until(lambda: replication.stalled or replication.timed_out)
        assert replication.stalled == 0, "a lease write blocked waiting for a majority"
    finally:
        replication.restore_majority()
        tick.join()
    assert counts.get("claim_errors") == 1
    assert db.jobs.find_one({})["phase"] == "Queued"
    # With a majority back, the work goes on (the claim applied; its lease expires).
    clock.advance(31)
    assert orch.run_once().get("advanced") == 1


def test_a_write_concern_timeout_is_a_transient_store_error(clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    store = Store(db, "majority", write_timeout=2.5)
    assert store.collection("jobs").write_concern.document == {"w": "majority", "wtimeout": 2500}
    store.collection("jobs").insert_one({"_id": 1, "phase": "Queued", "lockToken": "t"})
    db.replication.lose_majority()  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match="no majority acknowledged") as raised:
        store.write("jobs", lease_writes.fenced(1, "t"), {"$set": {"x": 1}})
    assert raised.value.transient
    assert isinstance(raised.value.__cause__, WTimeoutError)
    assert raised.value.__cause__.code == 64
    assert db.jobs.find_one({"_id": 1})["x"] == 1  # applied on the primary all the same


@pytest.mark.pure
@pytest.mark.parametrize(
    "error",
    [
        WriteConcernError("waiting for replication timed out", 64, {"code": 64}),
        WriteConcernError("timed out", 100, {"errInfo": {"wtimeout": True}}),
    ],
)
def test_every_form_of_write_concern_timeout_is_transient(error: WriteConcernError) -> None:
    with pytest.raises(StoreError) as raised, driver_errors("claim on jobs"):
        raise error
    assert raised.value.transient


# -- hello before MongoDB 4.4.2, and the minimum server version ----------------------------------


def test_a_server_without_hello_is_asked_is_master(clock: FakeClock) -> None:
    db = memory_database(clock=clock.skewed(7), hello=False)
    with pytest.raises(OperationFailure) as refused:
        db.command("hello")
    assert refused.value.code == 59
    orch = Orchestrator(db, replica_id="pod-1", clock=clock)

    @orch.phase("jobs", "Queued")
    def run(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Queued"})
    assert orch.clock.offset == timedelta(seconds=7)
    assert orch.run_once().get("advanced") == 1


@pytest.mark.parametrize(("wire", "release"), [(8, "4.2"), (7, "4.0"), (6, "3.6")])
def test_start_refuses_a_server_older_than_the_minimum(
    clock: FakeClock, wire: int, release: str
) -> None:
    orch = Orchestrator(memory_database(clock=clock, wire_version=wire), clock=clock)

    @orch.phase("jobs", "Queued")
    def run(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    try:
        with pytest.raises(StoreError, match=f"MongoDB {MIN_SERVER_VERSION} or newer.*{release}"):
            orch.start()
    finally:
        orch.stop(timeout=5)


def test_start_accepts_the_minimum_server_version(clock: FakeClock) -> None:
    orch = Orchestrator(memory_database(clock=clock, wire_version=9, hello=False), clock=clock)
    try:
        orch.start()
    finally:
        orch.stop(timeout=5)


# -- clients with other codec options --------------------------------------------------------------

CODECS = {
    "tz_aware": CodecOptions(tz_aware=True),
    "tz_aware in UTC+5": CodecOptions(tz_aware=True, tzinfo=timezone(timedelta(hours=5))),
    "DATETIME_MS": CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS),
    "SON documents": CodecOptions(document_class=SON),
}


def test_the_in_memory_store_decodes_with_the_clients_codec_options() -> None:
    db = memory_database(codec_options=CODECS["DATETIME_MS"])
    db.c.insert_one({"_id": 1, "at": datetime(2026, 1, 1, 0, 0, 0, 123456)})
    assert db.c.find_one({})["at"] == DatetimeMS(datetime(2026, 1, 1, 0, 0, 0, 123000, UTC))
    aware = db.with_options(codec_options=CODECS["tz_aware in UTC+5"])
    at = next(aware.c.find())["at"]
    assert at.utcoffset() == timedelta(hours=5)
    assert at == datetime(2026, 1, 1, 0, 0, 0, 123000, UTC)
    # Commands decode with pymongo's defaults, as pymongo's Database.command does.
    assert db.command("hello")["localTime"].tzinfo is None


@pytest.mark.parametrize("codec", CODECS.values(), ids=list(CODECS))
def test_leases_work_whatever_the_clients_codec_options(
    clock: FakeClock, codec: CodecOptions[Any]
) -> None:
    """Handlers see aware UTC datetimes in ``lease.doc``, whatever the client's options."""
    db = memory_database(clock=clock.skewed(3), codec_options=codec)
    orch = Orchestrator(db, replica_id="pod-1", clock=clock)
    seen: list[dict[str, Any]] = []
    waits: list[float | None] = []

    @orch.phase("certs", "Issuing")
    def issue(lease: Lease[Any]) -> Any:
        seen.append(dict(lease.doc))
        outcome = lease.relock()
        waits.append(outcome.wait)
        return outcome

    orch.submit("certs", {"phase": "Issuing"})
    clock.advance(50)
    orch.run_once()
    assert len(seen) == 1
    # The relock's wait grows with the time spent in the phase (read from updatedAt).
    assert waits == [pytest.approx(5.0)]
    server_now = bson_time(clock.now() + timedelta(seconds=3)).replace(tzinfo=UTC)
    for field in ("lockedAt", "createdAt", "updatedAt"):
        assert isinstance(seen[0][field], datetime)
        assert seen[0][field].tzinfo is UTC
    assert seen[0]["lockedAt"] == server_now


# -- an error record that would take a document past 16 MiB ---------------------------------------


def test_the_in_memory_store_refuses_documents_over_16_mib_as_the_server_does() -> None:
    db = memory_database()
    db.c.insert_one({"_id": 1, "blob": "x" * (MAX_BSON_SIZE - 100)})
    with pytest.raises(WriteError) as update:
        db.c.update_one({"_id": 1}, {"$set": {"more": "y" * 200}})
    assert update.value.code == 17419
    assert "Resulting document after update is larger than 16777216" in str(update.value)
    with pytest.raises(OperationFailure) as find_and_modify:
        db.c.find_one_and_update({"_id": 1}, {"$set": {"more": "y" * 200}})
    assert find_and_modify.value.code == 17419
    assert "more" not in db.c.find_one({"_id": 1}), "a refused update changes nothing"
    with pytest.raises(DocumentTooLarge):
        db.c.insert_one({"_id": 2, "blob": "x" * MAX_BSON_SIZE})
    assert db.c.count_documents({}) == 1


def fill_to(db: Database[Any], doc_id: Any, size: int) -> None:
    """Pad the stored document to exactly ``size`` bytes of BSON."""
    doc = db.big.find_one({"_id": doc_id})
    doc["pad"] = ""
    padding = size - len(bson.encode(doc))
    db.big.update_one({"_id": doc_id}, {"$set": {"pad": "p" * padding}})
    assert len(bson.encode(db.big.find_one({"_id": doc_id}))) == size


@pytest.fixture
def size_limit(db: Database[Any]) -> None:
    """These tests show what the orchestrator does when the server refuses an update past
    16 MiB, as MongoDB does; a server that stores such a document cannot show it. Asked of
    the server itself, not assumed from its name."""
    probe = db["sizeLimitProbe"]
    probe.insert_one({"_id": 1, "blob": "x" * (MAX_BSON_SIZE - 100)})
    try:
        probe.update_one({"_id": 1}, {"$set": {"more": "y" * 200}})
    except WriteError:
        return
    finally:
        probe.drop()
    pytest.skip(
        f"the server {server_name(db)} stored a document past 16 MiB (an update to 16 MiB "
        "+ 100 bytes was accepted): what a write refused as too large does cannot be shown on it"
    )


def failing(make: MakeReplica) -> Orchestrator:
    orch = make(max_attempts=3)

    @orch.phase("big", "Working")
    def work(lease: Lease[Any]) -> Any:
        raise RuntimeError("provider said: " + "e" * 5000)

    return orch


@pytest.mark.usefixtures("size_limit")
def test_an_error_record_too_large_for_the_document_is_cut_and_the_attempt_counts(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = failing(make)
    doc_id = orch.submit("big", {"phase": "Working"})["_id"]
    fill_to(db, doc_id, MAX_BSON_SIZE - 1100)  # room for a short record, not a full one
    assert orch.run_once().get("retrying") == 1
    stored = db.big.find_one({"_id": doc_id})
    assert stored["attempts"] == 1
    message = stored["lastError"]["message"]
    assert message.startswith("provider said: eee")
    assert message.endswith("[cut: the document is near 16 MiB]")
    assert len(message) < 300


@pytest.mark.usefixtures("size_limit")
def test_with_no_room_for_a_message_the_attempt_still_counts(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = failing(make)
    doc_id = orch.submit("big", {"phase": "Working"})["_id"]
    at = bson_time(orch.clock.now())
    old = {"type": "E", "message": "m" * 2000, "at": at, "phase": "Working"}
    db.big.update_one({"_id": doc_id}, {"$set": {"previousError": old}})
    fill_to(db, doc_id, MAX_BSON_SIZE - 250)
    assert orch.run_once().get("retrying") == 1
    stored = db.big.find_one({"_id": doc_id})
    assert stored["attempts"] == 1
    assert stored["lastError"]["type"] == "RuntimeError"
    assert "not stored" in stored["lastError"]["message"]
    assert "previousError" not in stored


NEAR_LIMIT = MAX_BSON_SIZE - 150
"""A document with room for a claim's lease fields, and for no history entry or error."""


@pytest.mark.anyio
@pytest.mark.usefixtures("size_limit")
async def test_a_document_at_16_mib_counts_each_failed_attempt_and_reaches_its_failed_phase(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """No form of the error record fits, not even a placeholder: the attempt still counts,
    with no record stored, and max_attempts ends it. Its write once failed in every form,
    so no attempt counted and the step ran again at every lease expiry, for ever."""
    replica = await replicas(max_attempts=3)

    @replica.phase("big", "Working")
    async def work(lease: Any) -> Any:
        raise RuntimeError("provider said: " + "e" * 5000)

    doc_id = (await replica.submit("big", {"phase": "Working"}))["_id"]
    fill_to(db, doc_id, NEAR_LIMIT)
    for attempt in (1, 2):
        assert (await replica.run_once()).get("retrying") == 1
        stored = db.big.find_one({"_id": doc_id})
        assert stored["attempts"] == attempt and stored["phase"] == "Working"
        assert "lastError" not in stored and "lockToken" not in stored
        clock.advance(replica.settings.max_wait)
    assert (await replica.run_once()).get("failed") == 1
    stored = db.big.find_one({"_id": doc_id})
    assert stored["phase"] == "Failed" and stored["attempts"] == 3
    assert len(bson.encode(stored)) <= MAX_BSON_SIZE


@pytest.mark.anyio
@pytest.mark.usefixtures("size_limit")
async def test_a_document_at_16_mib_takes_its_steps_outcomes_without_their_history_entries(
    replicas: MakeEither, db: Database[Any]
) -> None:
    """An advance (whose carry into the next step does not fit either) and a relock land
    without their history entries, which would take the document past 16 MiB. They once
    failed as the handler's error: the step's outcome never landed."""
    replica = await replicas()

    @replica.phase("big", "Working")
    async def work(lease: Any) -> Any:
        return await lease.advance("Waiting", note="n" * 60)

    @replica.phase("big", "Waiting")
    async def wait(lease: Any) -> Any:
        return await lease.relock(wait=600)

    doc_id = (await replica.submit("big", {"phase": "Working"}))["_id"]
    fill_to(db, doc_id, NEAR_LIMIT - 80)
    counts = await replica.run_once()
    assert counts.get("advanced") == 1 and counts.get("relocked") == 1, counts
    stored = db.big.find_one({"_id": doc_id})
    assert stored["phase"] == "Waiting" and stored["note"] == "n" * 60
    assert stored["relocks"] == 1 and "lockToken" not in stored
    assert HISTORY_FIELD not in stored


# -- orchestrator retry stamps the server's time ---------------------------------------------------


def failed_job(db: Database[Any], clock: FakeClock) -> None:
    """A failed job; no replica is live, so a retry to its phase takes --force."""
    error = {"type": "E", "message": "no", "at": bson_time(clock.now()), "phase": "Queued"}
    db.jobs.insert_one({"_id": "j", "phase": "Failed", "attempts": 5, "lastError": error})


def test_retry_stamps_updated_at_with_the_servers_clock(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeClock(datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC))  # not this machine's time
    db = memory_database(clock=server)
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    failed_job(db, server)
    assert cli.main(["retry", "j", "-c", "jobs", "--force", "--uri", "mongodb://db"]) == 0
    assert db.jobs.find_one({"_id": "j"})["updatedAt"] == datetime(2031, 5, 6, 7, 8, 9)
    assert capsys.readouterr().err == ""


def test_retry_says_so_when_the_server_gives_no_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = memory_database(clock=FakeClock(), server_time=False)
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    failed_job(db, FakeClock())
    assert cli.main(["retry", "j", "-c", "jobs", "--force", "--uri", "mongodb://db"]) == 0
    assert "this machine's clock" in capsys.readouterr().err
    assert db.jobs.find_one({"_id": "j"})["phase"] == "Queued"
