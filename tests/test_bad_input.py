"""Bad input, each case with its defined outcome: a clear error at once, or a failure
recorded on the document while the loop goes on. Never a crashed loop, never lost data.

The table in docs/reliability.md lists the same cases."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from orchestrator import EPOCH, ConfigError, Lease, Orchestrator, Resource, StoreError
from orchestrator.core.clock import bson_time
from orchestrator.testing import FakeClock, memory_database
from tests.conftest import MakeReplica


class Gadget(Resource):
    collection: ClassVar[str] = "gadgets"
    name: str
    size: int = 1


def _raw(db: Database[Any], orch: Orchestrator, collection: str = "items", **fields: Any) -> Any:
    """Insert a document as written from outside, dated by ``orch``'s estimate of the
    server's clock (the only time that means anything on a real server)."""
    now = bson_time(orch.clock.now())
    doc = {"phase": "A", "lockedUntil": EPOCH, "createdAt": now, "updatedAt": now, **fields}
    for key in [k for k, v in doc.items() if v is _MISSING]:
        del doc[key]
    return db[collection].insert_one(doc).inserted_id


_MISSING = object()


def _advancing(orch: Orchestrator, collection: str = "items") -> list[Any]:
    ran: list[Any] = []

    @orch.phase(collection, "A")
    def step(lease: Lease[Any]) -> Any:
        ran.append(lease.id)
        return lease.advance("Done")

    return ran


# -- malformed lease fields: claimable, and run once ------------------------------------


@pytest.mark.parametrize(
    "locked_at",
    [_MISSING, None, "yesterday", 0, True, datetime(2100, 1, 1)],
    ids=["missing", "null", "string", "number", "boolean", "far-future"],
)
def test_a_document_with_a_malformed_lock_time_is_claimed_and_runs_once(
    make: MakeReplica, db: Database[Any], locked_at: Any
) -> None:
    orch = make()
    ran = _advancing(orch)
    doc_id = _raw(db, orch, lockedUntil=locked_at)
    orch.run_once()
    orch.run_once()
    assert ran == [doc_id]
    assert db.items.find_one({"_id": doc_id})["phase"] == "Done"  # type: ignore[index]


def test_a_lease_within_max_wait_in_the_future_is_honoured_not_capped(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    """A relock's lockedUntil lies ahead by up to max_wait: never stolen."""
    orch = make(max_wait=3600)
    ran = _advancing(orch)
    _raw(db, orch, lockedUntil=orch.clock.now() + timedelta(seconds=3600))
    orch.run_once()
    clock.advance(3599)
    orch.run_once()
    assert ran == []
    clock.advance(1.1)
    orch.run_once()
    assert len(ran) == 1


def test_relock_works_without_updated_at_or_created_at(
    make: MakeReplica, db: Database[Any], clock: FakeClock
) -> None:
    orch = make()
    polls: list[float | None] = []

    @orch.phase("items", "A")
    def poll(lease: Lease[Any]) -> Any:
        outcome = lease.relock()
        polls.append(outcome.wait)
        return outcome

    _raw(db, orch, updatedAt=_MISSING, createdAt=_MISSING)
    orch.run_once()
    assert polls == [1.0]  # no time in phase known: the floor of one tick
    clock.advance(1.01)
    orch.run_once()
    assert len(polls) == 2


@pytest.mark.parametrize("phase", [_MISSING, "Bogus", 7, {"$gt": ""}], ids=str)
def test_a_document_in_no_known_phase_is_left_untouched(
    make: MakeReplica, db: Database[Any], phase: Any
) -> None:
    orch = make()
    ran = _advancing(orch)
    odd = _raw(db, orch, phase=phase)
    good = _raw(db, orch)
    before = db.items.find_one({"_id": odd})
    orch.run_once()
    assert ran == [good]
    assert db.items.find_one({"_id": odd}) == before


def test_corrupt_counters_count_as_zero_for_a_collection_handler(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make(max_attempts=2)

    @orch.phase("items", "A")
    def fail(lease: Lease[Any]) -> Any:
        raise RuntimeError("no")

    doc_id = _raw(db, orch, attempts="many", relocks=-4)
    orch.run_once()
    doc = db.items.find_one({"_id": doc_id})
    assert doc is not None and doc["attempts"] == 1 and doc["phase"] == "A"


# -- documents that do not fit the model: recorded failures -------------------------------


@pytest.mark.parametrize(
    "fields",
    [{"size": "huge"}, {"name": 42}, {"lastError": "boom"}, {"attempts": "x"}],
    ids=["wrong-type", "name-not-a-string", "garbage-lastError", "garbage-attempts"],
)
def test_a_document_that_does_not_fit_the_model_fails_with_its_validation_error(
    make: MakeReplica, db: Database[Any], fields: dict[str, Any]
) -> None:
    orch = make()
    ran: list[str] = []

    @orch.phase(Gadget, "A")
    def step(lease: Lease[Gadget]) -> Any:
        ran.append(lease.resource.name)
        return lease.advance("Done")

    bad = _raw(db, orch, "gadgets", **{"name": "bad", **fields})
    _raw(db, orch, "gadgets", name="good")
    orch.run_once()
    assert ran == ["good"]  # the loop went on
    doc = db.gadgets.find_one({"_id": bad})
    assert doc is not None and doc["phase"] == "Failed"
    assert doc["lastError"]["type"] == "ValidationError"
    assert "lockToken" not in doc


# -- writes the server would refuse: recorded failures, nothing half-written ---------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"blob": "x" * (16 * 1024 * 1024 + 1)}, "a MongoDB document holds at most"),
        ({"tags": {"a", "b"}}, "cannot be stored"),
        ({"big": 2**70}, "8-byte ints"),
        ({"text": "lone \ud800 surrogate"}, "cannot be stored"),
        ({"$set": {"phase": "Done"}}, "starts with '$'"),
        ({"spec": {"$where": "1"}}, "starts with '$'"),
        ({"spec": {1: "x"}}, "cannot be stored"),
        ({"lockedAt": EPOCH}, "managed by the orchestrator"),
        ({"phase": "Done"}, "managed by the orchestrator"),
        ({"orchestratorTrace": {"traceparent": "x"}}, "managed by the orchestrator"),
    ],
    ids=[
        "enormous",
        "unencodable-set",
        "int-too-big",
        "lone-surrogate",
        "dollar-key",
        "nested-dollar-key",
        "non-string-key",
        "lease-field",
        "phase-field",
        "trace-field",
    ],
)
def test_a_write_the_server_would_refuse_is_a_recorded_error(
    make: MakeReplica, db: Database[Any], fields: dict[str, Any], expected: str
) -> None:
    orch = make()

    @orch.phase("items", "A")
    def step(lease: Lease[Any]) -> Any:
        return lease.unlock(**fields)

    ran = _advancing(orch, "others")
    doc_id = _raw(db, orch)
    _raw(db, orch, "others")
    orch.run_once()
    doc = db.items.find_one({"_id": doc_id})
    assert doc is not None and doc["attempts"] == 1
    assert doc["lastError"]["type"] == "ConfigError"
    assert expected in doc["lastError"]["message"]
    assert not set(fields) & set(doc) - {"phase", "lockedAt"}  # nothing half-written
    assert len(ran) == 1


def test_unicode_field_names_and_values_are_stored_verbatim(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()

    @orch.phase("items", "A")
    def step(lease: Lease[Any]) -> Any:
        return lease.advance("Done", **{"名前": "ünïcødé 🚀", "déjà": {"vu": "ça"}})

    doc_id = _raw(db, orch)
    orch.run_once()
    doc = db.items.find_one({"_id": doc_id})
    assert doc is not None and doc["名前"] == "ünïcødé 🚀" and doc["déjà"] == {"vu": "ça"}


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (lambda lease: lease.relock(wait=-1), "relock(wait=...)"),
        (lambda lease: lease.relock(wait=math.nan), "relock(wait=...)"),
        (lambda lease: lease.advance("$set"), "advance() needs a phase name"),
        (lambda lease: lease.advance(""), "advance() needs a phase name"),
    ],
    ids=["negative-wait", "nan-wait", "dollar-phase", "empty-phase"],
)
def test_invalid_lease_calls_are_recorded_errors(
    make: MakeReplica, db: Database[Any], action: Callable[[Lease[Any]], Any], expected: str
) -> None:
    orch = make()
    orch.phase("items", "A")(action)
    doc_id = _raw(db, orch)
    orch.run_once()
    doc = db.items.find_one({"_id": doc_id})
    assert doc is not None and doc["phase"] == "A" and expected in doc["lastError"]["message"]


# -- handlers that misbehave ---------------------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


@pytest.mark.parametrize(
    ("raised", "kind", "expected"),
    [
        (Unprintable(), "Unprintable", "<Unprintable with an unprintable message>"),
        (
            RuntimeError("caf\u00e9 \ud800 mongodb://admin:hunter2@db/app " + "x" * 5000),
            "RuntimeError",
            "café ? mongodb://admin:***@db/app",
        ),
        (KeyError("k"), "KeyError", "'k'"),
        (ValueError(), "ValueError", "ValueError()"),
    ],
    ids=["unprintable", "surrogate-and-password", "key-error", "empty-message"],
)
def test_any_exception_is_recorded_storable_and_redacted(
    make: MakeReplica, db: Database[Any], raised: Exception, kind: str, expected: str
) -> None:
    orch = make()

    @orch.phase("items", "A")
    def step(lease: Lease[Any]) -> Any:
        raise raised

    doc_id = _raw(db, orch)
    assert orch.run_once().get("retrying") == 1
    error = db.items.find_one({"_id": doc_id})["lastError"]  # type: ignore[index]
    assert error["type"] == kind and error["message"].startswith(expected)
    assert len(error["message"]) <= 2000 and "hunter2" not in error["message"]


@pytest.mark.parametrize("result", ["done", 42, {"phase": "Done"}, ["x"]], ids=repr)
def test_a_handler_returning_a_non_outcome_is_a_recorded_type_error(
    make: MakeReplica, db: Database[Any], result: Any
) -> None:
    orch = make()
    orch.phase("items", "A")(lambda lease: result)
    doc_id = _raw(db, orch)
    orch.run_once()
    error = db.items.find_one({"_id": doc_id})["lastError"]  # type: ignore[index]
    assert error["type"] == "TypeError" and "a handler returns" in error["message"]


def test_a_handler_that_writes_its_outcome_but_returns_none_is_done(
    make: MakeReplica, db: Database[Any]
) -> None:
    orch = make()

    @orch.phase("items", "A")
    def forgot_return(lease: Lease[Any]) -> None:
        lease.advance("Done")

    doc_id = _raw(db, orch)
    assert orch.run_once().get("done") == 1
    assert db.items.find_one({"_id": doc_id})["phase"] == "Done"  # type: ignore[index]


# -- registration and setup: clear errors before any work --------------------------------


def test_async_and_duplicate_handlers_are_refused_at_registration(make: MakeReplica) -> None:
    orch = make()

    async def handler(lease: Lease[Any]) -> Any:
        return None

    with pytest.raises(ConfigError, match="async"):
        orch.phase("items", "A")(handler)
    orch.phase("items", "A")(lambda lease: None)
    with pytest.raises(ConfigError, match="already handles"):
        orch.phase("items", "A")(lambda lease: None)
    with pytest.raises(ConfigError):
        orch.phase("system.users", "A")(lambda lease: None)
    with pytest.raises(ConfigError, match="the claim owns them"):
        orch.when("items", {"lockedAt": {"$lt": 1}})(lambda lease: None)


@pytest.mark.parametrize(
    "options",
    [
        {"lock_timeout": -1},
        {"lock_timeout": math.inf},
        {"max_wait": math.nan},
        {"tick": 0},
        {"tick": 60, "lock_timeout": 30},
        {"max_concurrency": 0},
        {"step_timeout": 10, "lock_timeout": 30},
        {"lock_timout": 30},
        {"write_concern": 0},
    ],
    ids=[
        "negative-timeout",
        "infinite-timeout",
        "nan-max-wait",
        "zero-tick",
        "tick-over-lock-timeout",
        "zero-concurrency",
        "step-timeout-under-lock-timeout",
        "misspelt-option",
        "zero-write-concern",
    ],
)
def test_invalid_settings_are_a_config_error_naming_the_field(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="invalid orchestrator settings"):
        Orchestrator(memory_database(), **options)


@pytest.mark.parametrize("name", ["my app", "a.b", "a$b", "x" * 64, ""])
def test_an_invalid_database_name_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid database name"):
        Orchestrator(memory_database(name))


def test_an_unreachable_uri_fails_fast_at_start_with_the_password_redacted() -> None:
    client: MongoClient[Any] = MongoClient(
        "mongodb://app:s3cr3t@127.0.0.1:1/?serverSelectionTimeoutMS=100", connect=False
    )
    orch = Orchestrator(client["app"], replica_id="pod-1")
    orch.phase("items", "A")(lambda lease: None)
    with pytest.raises(StoreError) as raised:
        orch.start()
    assert "s3cr3t" not in str(raised.value) and "127.0.0.1:1" in str(raised.value)
    orch.stop(timeout=0)
    client.close()


def test_submit_refuses_documents_it_cannot_track(make: MakeReplica, db: Database[Any]) -> None:
    orch = make()
    with pytest.raises(ConfigError, match="unique key"):
        orch.submit("items", {"phase": "A"}, unique="name")
    with pytest.raises(ConfigError, match="'phase'"):
        orch.submit("items", {"name": "x"})
    with pytest.raises(ConfigError, match="at most"):
        orch.submit("items", {"phase": "A", "blob": "x" * (16 * 1024 * 1024 + 1)})
    with pytest.raises(ConfigError, match="invalid Gadget"):
        orch.submit(Gadget, {"phase": "A", "name": "g", "size": "huge"})
    assert db.items.count_documents({}) == 0 and db.gadgets.count_documents({}) == 0
