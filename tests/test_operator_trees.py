"""Trees and events from the operators' side, on both engines and every store: a signal
an operator sends wakes the document waiting for it (the replicas' next tick moves it on),
a cancel reaches what the cancelled document owns (its children and theirs; those done
with left; abandoned on request; a cycle of owners not followed round; bounded), and an
operator's cancel of a child wakes the parent that waits for it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import ConfigError
from orchestrator.core.history import HISTORY_FIELD
from orchestrator.core.names import AUDIT_COLLECTION
from orchestrator.core.trees import OWNER_FIELD, OWNS_FIELD, SIGNALS_FIELD, WAIT_FIELD
from orchestrator.operations import (
    Action,
    Children,
    DocumentNotFound,
    Filter,
    Operations,
    OperatorError,
)
from orchestrator.operations._sync import trees as operator_trees
from orchestrator.testing import FakeClock
from tests.cli_kit import publish
from tests.conftest import MakeEither
from tests.engines import Replica

pytestmark = pytest.mark.anyio


def doc(db: Database[Any], collection: str, doc_id: Any) -> dict[str, Any]:
    found = db[collection].find_one({"_id": doc_id})
    assert found is not None, f"{collection}/{doc_id} is gone"
    return found


def due_now(stored: dict[str, Any]) -> bool:
    until = stored.get("lockedUntil")
    return isinstance(until, datetime) and until.replace(tzinfo=None) == datetime(1970, 1, 1)


def audited(db: Database[Any], action: str) -> list[dict[str, Any]]:
    return list(db[AUDIT_COLLECTION].find({"action": action}).sort("at", 1))


# -- signals ------------------------------------------------------------------------------


def certificate(replica: Replica, box: dict[str, Any]) -> None:
    @replica.phase("certificates", "Requesting")
    async def requesting(lease: Any) -> Any:
        return await lease.wait_for("dns-verified", then="Validating")

    @replica.phase("certificates", "Validating")
    async def validating(lease: Any) -> Any:
        signal = lease.signal("dns-verified")
        box.setdefault("payloads", []).append(None if signal is None else signal.payload)
        return await lease.advance("Issued")


async def test_an_operators_signal_wakes_the_waiting_document_for_the_replicas_next_tick(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}
    certificate(replica, box)
    await replica.submit(
        "certificates", {"_id": "c1", "phase": "Requesting", "domain": "a.example"}, unique="domain"
    )
    await replica.run_once(heartbeat=False)
    assert not due_now(doc(db, "certificates", "c1"))
    ops = Operations(db, actor="ops@test")
    delivered = ops.signal(
        "certificates", "c1", "dns-verified", {"txt": "abc"}, why="checked the TXT record"
    )
    assert delivered.woke
    woken = doc(db, "certificates", "c1")
    assert woken["phase"] == "Requesting" and due_now(woken)  # no replica claimed it yet
    assert [s["id"] for s in woken[SIGNALS_FIELD]] == [delivered.id]
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == "Issued"
    assert box["payloads"] == [{"txt": "abc"}]
    [record] = audited(db, "signal")
    assert (record["by"], record["why"], record["collection"]) == (
        "ops@test",
        "checked the TXT record",
        "certificates",
    )
    assert record["scope"] == {
        "_id": '"c1"',  # as canonical Extended JSON: exact
        "signal": "dns-verified",
        "woke": "yes",
        "key": "domain=a.example",
    }
    assert record["documents"] == ['"c1"'] and record["count"] == 1


async def test_an_operators_signal_to_a_document_not_waiting_is_found_by_its_later_wait(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}
    certificate(replica, box)
    db["certificates"].insert_one({"_id": 7, "phase": "New"})
    delivered = Operations(db).signal("certificates", 7, "dns-verified", [1, 2])
    assert not delivered.woke
    assert not due_now(doc(db, "certificates", 7))
    db["certificates"].update_one({"_id": 7}, {"$set": {"phase": "Requesting"}})
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", 7)["phase"] == "Issued"
    assert box["payloads"] == [[1, 2]]
    [record] = audited(db, "signal")
    assert record["scope"]["woke"] == "no" and "key" not in record["scope"]


@pytest.mark.parametrize(
    ("doc_id", "name", "payload", "error"),
    [
        ("c1", "", None, ConfigError),
        ("c1", "x" * 201, None, ConfigError),
        ("c1", 5, None, ConfigError),
        ("c1", "ping", {"$set": {"phase": "Done"}}, ConfigError),
        ("c1", "ping", {"at": object()}, ConfigError),
        ("missing", "ping", None, DocumentNotFound),
        (1, "ping", None, DocumentNotFound),  # the string "1" is another document
    ],
)
def test_a_bad_signal_from_an_operator_is_refused_in_one_line_and_changes_nothing(
    db: Database[Any], doc_id: Any, name: Any, payload: Any, error: type[Exception]
) -> None:
    db["certificates"].insert_one({"_id": "c1", "phase": "New"})
    db["certificates"].insert_one({"_id": "1", "phase": "New"})
    with pytest.raises(error) as caught:
        Operations(db).signal("certificates", doc_id, name, payload, why="try")
    assert "\n" not in str(caught.value)
    assert doc(db, "certificates", "c1") == {"_id": "c1", "phase": "New"}
    assert audited(db, "signal") == []


# -- a cancel's cascade -----------------------------------------------------------------------


def tree(replica: Replica, box: dict[str, Any]) -> None:
    """A gateway making a domain (done at once) and a database, which makes a backup
    (held) and waits for it: three generations."""

    @replica.phase("gateways", "Creating")
    async def creating(lease: Any) -> Any:
        await lease.create_child("domains", "domain", {"phase": "Provisioning"})
        await lease.create_child("databases", "db", {"phase": "Provisioning"})
        return await lease.wait_for_children(then="Ready")

    @replica.phase("gateways", "Ready")
    async def ready(lease: Any) -> Any:
        return await lease.advance("Live")

    @replica.phase("domains", "Provisioning")
    async def domain(lease: Any) -> Any:
        return await lease.advance("Done")

    @replica.phase("databases", "Provisioning")
    async def database(lease: Any) -> Any:
        await lease.create_child("backups", "nightly", {"phase": "Copying"})
        return await lease.wait_for_children(then="Done")

    @replica.phase("backups", "Copying")
    async def backup(lease: Any) -> Any:
        box["copied"] = box.get("copied", 0) + 1
        if box.get("hold", True):
            return await lease.relock(600)
        return await lease.advance("Done")


DB = "gateways/g1/db"
DOMAIN = "gateways/g1/domain"
BACKUP = f"databases/{DB}/nightly"


async def grown(replicas: MakeEither, db: Database[Any], box: dict[str, Any]) -> Replica:
    replica = await replicas()
    tree(replica, box)
    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    publish(db, replica.orch)  # its record: the operators' view of its handlers
    assert doc(db, "gateways", "g1")[WAIT_FIELD]["kind"] == "children"
    assert doc(db, "domains", DOMAIN)["phase"] == "Done"
    assert doc(db, "databases", DB)[WAIT_FIELD]["kind"] == "children"
    assert doc(db, "backups", BACKUP)["phase"] == "Copying"
    return replica


async def test_a_cancel_reaches_the_grandchildren_and_leaves_what_is_done_with(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    box: dict[str, Any] = {}
    replica = await grown(replicas, db, box)
    cancelled_phase = replica.settings.cancelled_phase
    ops = Operations(db, actor="ops@test")
    done = ops.cancel("gateways", doc(db, "gateways", "g1"), why="customer left")
    assert done.document["phase"] == cancelled_phase
    cascade = done.cascade
    assert cascade.policy is Children.CANCEL and not cascade.cut
    assert [(d.collection, d.id, d.owner, d.phase) for d in cascade.cancelled] == [
        ("databases", DB, "gateways/g1", "Provisioning"),
        ("backups", BACKUP, f"databases/{DB}", "Copying"),
    ]
    assert [(d.collection, d.id, d.phase) for d in cascade.left] == [("domains", DOMAIN, "Done")]
    for collection, doc_id in (("databases", DB), ("backups", BACKUP)):
        stored = doc(db, collection, doc_id)
        assert stored["phase"] == cancelled_phase and WAIT_FIELD not in stored
        entry = stored[HISTORY_FIELD][-1]
        assert (entry["kind"], entry["action"], entry["by"]) == ("operator", "cancel", "ops@test")
        assert entry["why"].startswith("cancel of its owner ") and "customer left" in entry["why"]
    assert "gateways/g1" in doc(db, "databases", DB)[HISTORY_FIELD][-1]["why"]
    assert doc(db, "domains", DOMAIN)["phase"] == "Done"
    records = audited(db, "cancel")
    assert [(r["collection"], r["scope"].get("cascadeFrom"), r["documents"]) for r in records] == [
        ("gateways", None, ['"g1"']),
        ("databases", 'gateways/"g1"', [f'"{DB}"']),
        ("backups", f'databases/"{DB}"', [f'"{BACKUP}"']),
    ]
    assert {r["scope"].get("root") for r in records[1:]} == {'gateways/"g1"'}
    clock.advance(600)
    await replica.run_once(heartbeat=False)
    assert box["copied"] == 1  # the backup's work stopped with its owner's


async def test_a_cancel_that_abandons_the_children_leaves_them_going(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    box: dict[str, Any] = {}
    replica = await grown(replicas, db, box)
    done = Operations(db).cancel("gateways", doc(db, "gateways", "g1"), children="abandon")
    assert done.cascade.policy is Children.ABANDON
    assert done.cascade.cancelled == () and done.cascade.left == ()
    assert doc(db, "backups", BACKUP)["phase"] == "Copying"
    assert [r["collection"] for r in audited(db, "cancel")] == ["gateways"]
    box["hold"] = False
    clock.advance(600)
    await replica.run_once(heartbeat=False)
    assert doc(db, "backups", BACKUP)["phase"] == "Done"
    assert doc(db, "databases", DB)["phase"] == "Done"  # woken by its child, as ever


def test_a_cancel_with_a_policy_that_is_none_is_refused_before_any_change(
    db: Database[Any],
) -> None:
    db["gateways"].insert_one({"_id": "g1", "phase": "Creating"})
    ops = Operations(db)
    with pytest.raises(OperatorError, match="children is 'cancel' or 'abandon', not 'orphan'"):
        ops.cancel("gateways", doc(db, "gateways", "g1"), children="orphan")
    with pytest.raises(OperatorError, match="not 'orphan'"):
        ops.bulk(Action.CANCEL, Filter("gateways"), children="orphan")
    assert doc(db, "gateways", "g1")["phase"] == "Creating"
    assert audited(db, "cancel") == []


async def test_a_cycle_of_owners_is_not_followed_round(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()

    @replica.phase("a", "Working")
    @replica.phase("b", "Working")
    async def working(lease: Any) -> Any:
        return await lease.relock(600)

    publish(db, replica.orch)
    # Stored garbage: a/1 owns b/1, which owns a/1 and a/2.
    db["a"].insert_one(
        {
            "_id": 1,
            "phase": "Working",
            OWNS_FIELD: ["b"],
            OWNER_FIELD: {"collection": "b", "id": 1, "name": "loop"},
        }
    )
    db["b"].insert_one(
        {
            "_id": 1,
            "phase": "Working",
            OWNS_FIELD: ["a"],
            OWNER_FIELD: {"collection": "a", "id": 1, "name": "b"},
        }
    )
    db["a"].insert_one(
        {"_id": 2, "phase": "Working", OWNER_FIELD: {"collection": "b", "id": 1, "name": "c"}}
    )
    done = Operations(db).cancel("a", doc(db, "a", 1))
    assert [(d.collection, d.id) for d in done.cascade.cancelled] == [("b", "1"), ("a", "2")]
    cancelled = replica.settings.cancelled_phase
    assert {d["phase"] for d in [*db["a"].find(), *db["b"].find()]} == {cancelled}


async def test_a_cascade_stops_at_its_bound_and_says_so(
    replicas: MakeEither, db: Database[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    replica = await replicas()

    @replica.phase("jobs", "Working")
    async def working(lease: Any) -> Any:
        return await lease.relock(600)

    publish(db, replica.orch)
    monkeypatch.setattr(operator_trees, "MAX_CASCADE", 3)
    db["parents"].insert_one({"_id": "p", "phase": "Working", OWNS_FIELD: ["jobs"]})
    owner = {"collection": "parents", "id": "p", "name": "n"}
    db["jobs"].insert_many([{"_id": n, "phase": "Working", OWNER_FIELD: owner} for n in range(5)])
    done = Operations(db).cancel("parents", doc(db, "parents", "p"), any_phase=True)
    assert done.cascade.cut
    assert [d.id for d in done.cascade.cancelled] == ["0", "1", "2"]
    assert db["jobs"].count_documents({"phase": "Working"}) == 2


async def test_a_bulk_cancel_reaches_what_each_document_owns(
    replicas: MakeEither, db: Database[Any]
) -> None:
    await grown(replicas, db, {})
    ops = Operations(db)
    result = ops.bulk(Action.CANCEL, Filter("gateways"), why="region closed")
    assert [r.id for r in result.changed] == ["g1"]
    assert [d.id for d in result.cascade.cancelled] == [DB, BACKUP]
    assert result.to_dict()["cascade"]["cancelled"][0]["owner"] == "gateways/g1"
    dry = ops.bulk(Action.CANCEL, Filter("databases"), dry_run=True)
    assert dry.cascade.cancelled == ()


# -- an owner's wake --------------------------------------------------------------------------


async def test_an_operators_cancel_of_a_child_wakes_the_parent_waiting_for_it(
    replicas: MakeEither, db: Database[Any]
) -> None:
    box: dict[str, Any] = {}
    replica = await grown(replicas, db, box)
    assert not due_now(doc(db, "databases", DB))
    Operations(db).cancel("backups", doc(db, "backups", BACKUP), why="not needed")
    assert due_now(doc(db, "databases", DB))  # its owner, not a lock timeout later
    assert not due_now(doc(db, "gateways", "g1"))  # the database has not ended yet
    await replica.run_once(heartbeat=False)
    # The database's wait ends (its backup ended), which wakes the gateway in turn.
    assert doc(db, "databases", DB)["phase"] == "Done"
    assert doc(db, "gateways", "g1")["phase"] == "Live"


async def test_an_operators_retry_to_a_phase_still_handled_wakes_no_one(
    replicas: MakeEither, db: Database[Any]
) -> None:
    await grown(replicas, db, {})
    Operations(db).retry("backups", doc(db, "backups", BACKUP), "Copying", force=True)
    assert not due_now(doc(db, "databases", DB))
    Operations(db).retry(
        "backups", doc(db, "backups", BACKUP), "Archived", force=True, any_phase=True
    )
    assert due_now(doc(db, "databases", DB))
