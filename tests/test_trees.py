"""Trees and events on both engines and every store: children made once, waits that end
when their condition holds (and not before), failures and deletions that reach the
children, and signals that wake a waiting document at once, whenever they were sent."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.database import Database

from orchestrator import ConfigError, Operations, OperatorError, StoreError
from orchestrator.core.trees import MAX_SIGNALS, OWNER_FIELD, SENT_FIELD, SIGNALS_FIELD, WAIT_FIELD
from orchestrator.testing import FakeClock
from tests.conftest import MakeEither
from tests.engines import Replica

pytestmark = pytest.mark.anyio


def doc(db: Database[Any], collection: str, doc_id: Any) -> dict[str, Any]:
    found = db[collection].find_one({"_id": doc_id})
    assert found is not None, f"{collection}/{doc_id} is gone"
    return found


def gateway(replica: Replica, box: dict[str, Any], **wait: Any) -> None:
    """A gateway that makes a domain and a database, waits for them, and is Ready."""

    @replica.phase("gateways", "Creating")
    async def creating(lease: Any) -> Any:
        box["creating"] = box.get("creating", 0) + 1
        await lease.create_child("domains", "domain", {"phase": "Provisioning"})
        await lease.create_child("databases", "db", {"phase": "Provisioning", "size": 1})
        if box.get("raise_once") and box["creating"] == 1:
            raise RuntimeError("crashed after making its children")
        return await lease.wait_for_children(then="Ready", **wait)

    @replica.phase("gateways", "Ready")
    async def ready(lease: Any) -> Any:
        box["ready"] = [(c["_id"], c["phase"]) for c in await lease.children()]
        return await lease.advance("Live")

    for collection in ("domains", "databases"):

        @replica.phase(collection, "Provisioning")
        async def provisioning(lease: Any) -> Any:
            if lease.doc["_id"] in box.get("hold", ()):
                return await lease.relock(600)
            if lease.doc["_id"] in box.get("fail", ()):
                return await lease.fail("no capacity")
            return await lease.advance("Done")


# -- children ---------------------------------------------------------------------------


async def test_a_retried_step_finds_the_children_it_made_rather_than_making_more(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {"raise_once": True, "hold": {"gateways/g1/domain"}}
    gateway(replica, box)
    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    for _ in range(3):
        await replica.run_once(heartbeat=False)
        clock.advance(60)
    assert box["creating"] == 2
    assert db["domains"].count_documents({}) == 1
    assert db["databases"].count_documents({}) == 1
    child = doc(db, "domains", "gateways/g1/domain")
    assert child[OWNER_FIELD] == {"collection": "gateways", "id": "g1", "name": "domain"}


async def test_a_child_id_held_by_another_document_is_refused_in_one_line(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    db["domains"].insert_one({"_id": "taken", "phase": "Done"})
    said: list[str] = []

    @replica.phase("gateways", "Creating")
    async def creating(lease: Any) -> Any:
        try:
            await lease.create_child("domains", "domain", {"_id": "taken", "phase": "New"})
        except ConfigError as exc:
            said.append(str(exc))
        return await lease.advance("Done")

    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    assert len(said) == 1 and "is not the child 'domain'" in said[0]
    assert doc(db, "domains", "taken") == {"_id": "taken", "phase": "Done"}


async def test_a_cycle_of_owners_is_refused(replicas: MakeEither, db: Database[Any]) -> None:
    replica = await replicas()
    said: list[str] = []

    @replica.phase("nodes", "Growing")
    async def growing(lease: Any) -> Any:
        owner = lease.owner
        # Itself, then its own parent, as its child: each is there and is not that child.
        for child_id in (lease.doc["_id"], None if owner is None else owner.id):
            if child_id is None:
                continue
            try:
                await lease.create_child("nodes", "loop", {"_id": child_id, "phase": "Growing"})
            except ConfigError as exc:
                said.append(str(exc))
        if owner is None:
            await lease.create_child("nodes", "leaf", {"phase": "Growing"})
        return await lease.advance("Grown")

    await replica.submit("nodes", {"_id": "root", "phase": "Growing"})
    await replica.run_once(heartbeat=False)
    await replica.run_once(heartbeat=False)
    assert len(said) == 3 and all("is not the child 'loop'" in s for s in said)
    assert {d["_id"]: d.get(OWNER_FIELD, {}).get("id") for d in db["nodes"].find()} == {
        "root": None,
        "nodes/root/leaf": "root",
    }


# -- waiting for children ---------------------------------------------------------------


async def test_a_parent_resumes_once_all_its_children_ended_and_not_before(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {"hold": {"gateways/g1/db"}}
    gateway(replica, box)
    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    parent = doc(db, "gateways", "g1")
    assert parent["phase"] == "Creating" and parent[WAIT_FIELD]["kind"] == "children"
    assert doc(db, "domains", "gateways/g1/domain")["phase"] == "Done"
    await replica.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Creating"  # the database goes on
    box["hold"] = set()
    db["databases"].update_one({}, {"$set": {"lockedUntil": None}})
    await replica.run_once(heartbeat=False)
    # The database's last step woke its parent, claimed in the same tick: Ready, then Live.
    assert doc(db, "gateways", "g1")["phase"] == "Live"
    assert doc(db, "gateways", "g1").get(WAIT_FIELD) is None
    assert sorted(box["ready"]) == [
        ("gateways/g1/db", "Done"),
        ("gateways/g1/domain", "Done"),
    ]


async def test_a_failed_child_sends_the_parent_where_its_wait_says_and_cancels_the_others(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {"fail": {"gateways/g1/domain"}, "hold": {"gateways/g1/db"}}
    gateway(replica, box, on_failure="Broken", cancel_siblings=True)
    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Broken"
    assert doc(db, "domains", "gateways/g1/domain")["phase"] == "Failed"
    assert doc(db, "databases", "gateways/g1/db")["phase"] == replica.settings.cancelled_phase


async def test_a_failed_child_counts_as_ended_when_the_wait_names_no_failure_phase(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {"fail": {"gateways/g1/domain"}}
    gateway(replica, box)
    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Live"


async def test_a_wait_for_any_child_ends_with_the_first(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {"hold": {"gateways/g1/db"}}
    gateway(replica, box, need="any")
    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Live"
    assert doc(db, "databases", "gateways/g1/db")["phase"] == "Provisioning"


async def test_a_wake_lost_with_its_replica_is_made_up_within_one_lock_timeout(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    first = await replicas("pod-1")
    box: dict[str, Any] = {"hold": {"gateways/g1/db"}}
    gateway(first, box)
    await first.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await first.run_once(heartbeat=False)
    # The database ends, written by a replica that died before it woke its parent.
    db["databases"].update_one({}, {"$set": {"phase": "Done"}})
    await first.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Creating"
    clock.advance(first.settings.lock_timeout)
    await first.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Live"


async def test_a_wait_on_children_that_ended_before_it_was_written_ends_at_once(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()

    @replica.phase("gateways", "Creating")
    async def creating(lease: Any) -> Any:
        return await lease.wait_for_children(then="Ready")  # it owns none: all have ended

    @replica.phase("gateways", "Ready")
    async def ready(lease: Any) -> Any:
        return await lease.advance("Live")

    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Live"


async def test_children_no_handler_here_takes_are_never_judged_ended_and_that_is_said(
    replicas: MakeEither, db: Database[Any], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    replica = await replicas()

    @replica.phase("gateways", "Creating")
    async def creating(lease: Any) -> Any:
        await lease.create_child("domains", "domain", {"phase": "Done"})
        return await lease.wait_for_children(then="Ready")

    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    clock.advance(replica.settings.lock_timeout + 1)
    await replica.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Creating"  # "Done" may be anything there
    assert "domains is a collection no handler of this replica takes" in caplog.text


# -- deletion, children first -----------------------------------------------------------


async def test_a_deletion_deletes_the_children_first_and_resumes_after_a_crash(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}
    gateway(replica, box)
    removed: list[str] = []

    @replica.phase("gateways", "Deleting")
    async def deleting(lease: Any) -> Any:
        await lease.move_children("Deleting")
        return await lease.wait_for_children(then="Deleted")

    @replica.phase("gateways", "Deleted")
    async def deleted(lease: Any) -> Any:
        removed.append(lease.doc["_id"])
        return await lease.remove()

    for collection in ("domains", "databases"):

        @replica.phase(collection, "Deleting")
        async def child_deleting(lease: Any) -> Any:
            removed.append(lease.doc["_id"])
            return await lease.remove()

    await replica.submit("gateways", {"_id": "g1", "phase": "Creating"})
    await replica.run_once(heartbeat=False)
    assert doc(db, "gateways", "g1")["phase"] == "Live"
    db["gateways"].update_one({"_id": "g1"}, {"$set": {"phase": "Deleting"}})
    await replica.run_once(heartbeat=False)
    assert removed[-1] == "g1" and sorted(removed[:-1]) == [
        "gateways/g1/db",
        "gateways/g1/domain",
    ]
    assert db["gateways"].count_documents({}) == 0
    assert db["domains"].count_documents({}) + db["databases"].count_documents({}) == 0


# -- signals ----------------------------------------------------------------------------


def certificate(replica: Replica, box: dict[str, Any], **wait: Any) -> None:
    @replica.phase("certificates", "Requesting")
    async def requesting(lease: Any) -> Any:
        return await lease.wait_for("dns-verified", then="Validating", **wait)

    @replica.phase("certificates", "Validating")
    async def validating(lease: Any) -> Any:
        signal = lease.signal("dns-verified")
        box.setdefault("payloads", []).append(None if signal is None else signal.payload)
        return await lease.advance("Issued")


async def test_a_signal_wakes_the_document_waiting_for_it_at_once(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}
    certificate(replica, box)
    await replica.submit("certificates", {"_id": "c1", "phase": "Requesting"})
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")[WAIT_FIELD]["name"] == "dns-verified"
    delivered = await replica.signal("certificates", "c1", "dns-verified", {"txt": "abc"})
    assert delivered.woke
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == "Issued"
    assert box["payloads"] == [{"txt": "abc"}]


async def test_a_signal_sent_before_the_wait_is_found_by_it(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}
    certificate(replica, box)
    db["certificates"].insert_one({"_id": "c1", "phase": "New"})
    delivered = await replica.signal("certificates", "c1", "dns-verified", 7)
    assert not delivered.woke
    db["certificates"].update_one({"_id": "c1"}, {"$set": {"phase": "Requesting"}})
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == "Issued"
    assert box["payloads"] == [7]


async def test_a_later_wait_for_the_same_name_waits_for_a_new_signal(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}
    certificate(replica, box)

    @replica.phase("certificates", "Issued")
    async def issued(lease: Any) -> Any:
        return await lease.wait_for("dns-verified", then="Renewed")

    await replica.submit("certificates", {"_id": "c1", "phase": "Requesting"})
    await replica.signal("certificates", "c1", "dns-verified", 1)
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == "Issued"  # waits again, for a new one
    await replica.signal("certificates", "c1", "dns-verified", 2)
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == "Renewed"


async def test_a_wait_past_its_timeout_goes_where_it_says(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    replica = await replicas()
    certificate(replica, {}, timeout=60, on_timeout="Expired")
    await replica.submit("certificates", {"_id": "c1", "phase": "Requesting"})
    await replica.run_once(heartbeat=False)
    clock.advance(30)
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == "Requesting"
    clock.advance(31)
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == "Expired"


async def test_a_signal_keeps_the_inbox_bounded_and_counts_what_it_dropped(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    db["certificates"].insert_one({"_id": "c1", "phase": "New"})
    for n in range(MAX_SIGNALS + 5):
        await replica.signal("certificates", "c1", "ping", n)
    stored = doc(db, "certificates", "c1")
    assert [s["payload"] for s in stored[SIGNALS_FIELD]] == list(range(5, MAX_SIGNALS + 5))
    assert stored[SENT_FIELD] == MAX_SIGNALS + 5


async def test_a_signal_never_disturbs_a_running_steps_lease(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}

    @replica.phase("certificates", "Requesting")
    async def requesting(lease: Any) -> Any:
        box["signal"] = await replica.signal("certificates", "c1", "dns-verified", "early")
        return await lease.wait_for("dns-verified", then="Validating")

    @replica.phase("certificates", "Validating")
    async def validating(lease: Any) -> Any:
        box["payload"] = lease.signal("dns-verified").payload
        return await lease.advance("Issued")

    await replica.submit("certificates", {"_id": "c1", "phase": "Requesting"})
    await replica.run_once(heartbeat=False)
    assert not box["signal"].woke  # it was held: the wait written next found the signal
    assert doc(db, "certificates", "c1")["phase"] == "Issued"
    assert box["payload"] == "early"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("c1", "", None), ConfigError),
        (("c1", "x" * 201, None), ConfigError),
        (("c1", "ping", {"$bad": 1}), ConfigError),
        (("missing", "ping", None), OperatorError),
    ],
)
async def test_a_bad_signal_is_refused_in_one_line(
    replicas: MakeEither, db: Database[Any], args: tuple[Any, ...], error: type[Exception]
) -> None:
    replica = await replicas()
    db["certificates"].insert_one({"_id": "c1", "phase": "New"})
    with pytest.raises(error) as caught:
        await replica.signal("certificates", *args)
    assert "\n" not in str(caught.value)
    assert doc(db, "certificates", "c1") == {"_id": "c1", "phase": "New"}


async def test_a_signal_to_an_inbox_holding_garbage_is_refused_naming_the_document(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    db["certificates"].insert_one({"_id": "c1", "phase": "New", SIGNALS_FIELD: "junk"})
    with pytest.raises(StoreError) as caught:
        await replica.signal("certificates", "c1", "ping")
    assert str(caught.value).startswith("write to certificates/c1 failed")
    assert "\n" not in str(caught.value)
    assert doc(db, "certificates", "c1")[SIGNALS_FIELD] == "junk"


async def test_a_bad_wait_is_the_handlers_error_and_writes_nothing(
    replicas: MakeEither, db: Database[Any]
) -> None:
    replica = await replicas()
    said: list[str] = []

    @replica.phase("certificates", "Requesting")
    async def requesting(lease: Any) -> Any:
        for bad in ({"then": ""}, {"then": "X", "timeout": -1}, {"then": "X", "timeout": "1h"}):
            try:
                await lease.wait_for("dns", **bad)
            except ConfigError as exc:
                said.append(str(exc))
        return await lease.advance("Done")

    await replica.submit("certificates", {"_id": "c1", "phase": "Requesting"})
    await replica.run_once(heartbeat=False)
    assert len(said) == 3
    assert doc(db, "certificates", "c1")["phase"] == "Done"


async def test_an_operators_cancel_ends_a_wait(replicas: MakeEither, db: Database[Any]) -> None:
    replica = await replicas()
    certificate(replica, {})
    await replica.submit("certificates", {"_id": "c1", "phase": "Requesting"})
    await replica.run_once(heartbeat=False)
    await replica.heartbeat()  # the replica's record: the operators' view of its handlers
    seen = doc(db, "certificates", "c1")
    Operations(db).cancel("certificates", seen, why="the customer left")
    cancelled = doc(db, "certificates", "c1")
    assert cancelled["phase"] == replica.settings.cancelled_phase
    assert WAIT_FIELD not in cancelled
    await replica.signal("certificates", "c1", "dns-verified")
    await replica.run_once(heartbeat=False)
    assert doc(db, "certificates", "c1")["phase"] == replica.settings.cancelled_phase
