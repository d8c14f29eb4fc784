"""Credentials never reach a log or a document; the client's options are the user's; the
orchestrator only sends commands that readWrite on the application's database allows."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import AutoReconnect

from orchestrator import Lease, Orchestrator
from orchestrator.core.redact import RedactingFilter, redact
from orchestrator.testing import FakeClock
from orchestrator.testing.faults import Faults

SECRET_URI = "mongodb://admin:hunter2@db-0.example:27017,db-1.example/app?authSource=admin"


@pytest.mark.pure
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SECRET_URI, "mongodb://admin:***@db-0.example:27017,db-1.example/app?authSource=admin"),
        ("mongodb+srv://u:p%40ss@cluster0.x.net/db", "mongodb+srv://u:***@cluster0.x.net/db"),
        ("MONGODB://U:Secret@h/", "MONGODB://U:***@h/"),
        ("mongodb://u:pa/ss@h/db", "mongodb://u:***@h/db"),
        ("mongodb://u:@h/", "mongodb://u:***@h/"),
        ("mongodb://h:27017/db?password=x&w=1", "mongodb://h:27017/db?password=***&w=1"),
        ("tlsCertificateKeyFilePassword=abc", "tlsCertificateKeyFilePassword=***"),
        (
            "authMechanismProperties=AWS_SESSION_TOKEN:tok123,x:y",
            "authMechanismProperties=AWS_SESSION_TOKEN:***,x:y",
        ),
        ("a mongodb://a:1@h and mongodb://b:2@k", "a mongodb://a:***@h and mongodb://b:***@k"),
        ("mongodb://user@h/db", "mongodb://user@h/db"),  # no password: nothing to hide
        ("no uri here", "no uri here"),
    ],
)
def test_redact_masks_every_credential_and_keeps_the_rest(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(redact(text)) == expected


def test_log_records_are_redacted_in_message_arguments_and_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test.security")
    log.addFilter(RedactingFilter())
    try:
        try:
            raise RuntimeError(f"cannot reach {SECRET_URI}")
        except RuntimeError:
            with caplog.at_level(logging.ERROR, logger="test.security"):
                log.exception("connect to %s failed", SECRET_URI)
    finally:
        log.filters.clear()
    assert "hunter2" not in caplog.text
    assert caplog.text.count("admin:***@") == 2  # the message and the traceback


def test_a_driver_error_carrying_a_password_reaches_no_log_and_no_document(
    db: Database[Any], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    faults = Faults(clock=clock)
    orch = Orchestrator(faults.wrap(db), replica_id="pod-1", clock=clock, clock_refresh=1e6)

    @orch.phase("jobs", "Running")
    def step(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    orch.submit("jobs", {"phase": "Running"})
    faults.fail_next("update_one", AutoReconnect(f"connection to {SECRET_URI} reset"))
    faults.fail_next("find_one_and_update", AutoReconnect(f"lost {SECRET_URI}"))
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        orch.run_once()  # the claim fails, logged
        orch.run_once()  # the advance fails: logged with its chained traceback, recorded
    records = [r for r in caplog.records if r.name == "orchestrator"]
    assert len(records) >= 2 and any(r.exc_info for r in records)
    assert "hunter2" not in caplog.text and "admin:***@" in caplog.text
    doc = db.jobs.find_one({})
    assert doc is not None and "admin:***@" in doc["lastError"]["message"]
    assert "hunter2" not in repr(doc)


def test_tls_and_auth_options_reach_mongo_client_untouched() -> None:
    """The orchestrator takes the user's Database and only adds a write concern per
    collection: the client, with its TLS and auth options, is used as given."""
    client: MongoClient[Any] = MongoClient(
        "mongodb://app:pw@127.0.0.1:1/?authSource=admin&authMechanism=SCRAM-SHA-256",
        tls=True,
        tlsAllowInvalidHostnames=True,
        connect=False,
    )
    orch = Orchestrator(client["app"], replica_id="pod-1")
    collection = orch._store.collection("jobs")
    assert collection.database.client is client
    options = collection.database.client.options
    assert options.pool_options._ssl_context is not None
    assert options._options["authsource"] == "admin"
    assert options._options["authmechanism"] == "SCRAM-SHA-256"
    assert collection.write_concern.document == {"w": "majority", "wtimeout": 10000}
    client.close()


# Each command the orchestrator's run-time sends, and the readWrite action that allows it.
COMMANDS = {
    "command": "hello (no privilege needed)",
    "find_one_and_update": "findAndModify: find, update (and insert for submit's upsert)",
    "update_one": "update: update",
    "insert_one": "insert: insert",
    "find_one": "find: find",
    "find": "find: find (the operators' pauses, at start and when no probe read them)",
    "aggregate": "aggregate: find (the tick's probe of every collection, pauses included)",
    "create_index": "createIndexes: createIndex",
    "list_indexes": "listIndexes: listIndexes (to reuse an application's equivalent index)",
    "drop_index": "dropIndexes: dropIndex (an earlier version's index of the same name)",
    "list_collections": "listCollections: the default collation, when an index has one",
    "delete_one": "delete: remove",
    "find_one_and_replace": "findAndModify: find, update, insert (a replica's record)",
}


def test_a_full_lifecycle_sends_only_the_documented_commands(
    db: Database[Any], clock: FakeClock
) -> None:
    faults = Faults(clock=clock)  # no faults: it records every operation
    orch = Orchestrator(faults.wrap(db), replica_id="pod-1", clock=clock, clock_refresh=1e6)

    @orch.phase("jobs", "A")
    def a(lease: Lease[Any]) -> Any:
        if lease.doc.get("n", 0) < 2:
            return lease.unlock(n=lease.doc.get("n", 0) + 1)
        return lease.relock() if lease.doc.get("waited") is None else lease.advance("B")

    @orch.phase("jobs", "B")
    def b(lease: Lease[Any]) -> Any:
        raise RuntimeError("fails, then is recorded")

    orch.ensure_indexes()
    orch.submit("jobs", {"phase": "A", "name": "x"}, unique="name")
    orch.submit("jobs", {"phase": "A", "waited": True})
    for _ in range(3):
        orch.run_once()
        clock.advance(5)
    orch.heartbeat()
    orch.start()  # the replica's record: written, refreshed, removed
    orch.heartbeat()
    orch.stop()
    assert set(faults.operations) <= set(COMMANDS), faults.operations
    assert {
        "aggregate",
        "find_one_and_update",
        "update_one",
        "create_index",
        "command",
        "find_one_and_replace",
        "delete_one",
    } <= set(faults.operations)
