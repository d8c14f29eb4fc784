"""What an operator sees of trees and events, everywhere a document is shown: its parent and
children (each with its phase and whether it ended), what it waits for (with its
children's counts), its inbox of signals; through ``Operations.tree``, the page, the JSON
API, ``orchestrator find`` (``--owner``) and ``orchestrator history``. A stored field
holding garbage shows as such, never as a 500 or a traceback."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pymongo.database import Database

from orchestrator import Lease, Orchestrator
from orchestrator.cli import connecting
from orchestrator.core.trees import (
    MAX_SIGNALS,
    OWNER_FIELD,
    OWNS_FIELD,
    SENT_FIELD,
    SIGNALS_FIELD,
    TAKEN_FIELD,
    WAIT_FIELD,
)
from orchestrator.operations import Operations
from orchestrator.operations.tree_report import Counted, Judge, Waiting
from tests.cli_kit import URI, assert_one_line_error, publish, run
from tests.conftest import MakeReplica
from tests.operator_page import mounted, read

SECRET_URI = "mongodb://ops:hunter2@db.internal/"


@dataclass
class Scene:
    """g1 made a domain (Done: ended) and a database (held: going on) and waits for both;
    g2 waits for the signal dns-verified, with a deadline, and holds two other signals,
    one carrying a password in its payload."""

    db: Database[Any]
    orch: Orchestrator
    operations: Operations


@pytest.fixture
def scene(db: Database[Any], make: MakeReplica) -> Scene:
    orch = make("pod-1")

    @orch.phase("gateways", "Creating")
    def creating(lease: Lease[Any]) -> Any:
        lease.create_child("domains", "domain", {"phase": "Provisioning"})
        lease.create_child("databases", "db", {"phase": "Provisioning"})
        return lease.wait_for_children(then="Ready")

    @orch.phase("gateways", "Verifying")
    def verifying(lease: Lease[Any]) -> Any:
        return lease.wait_for("dns-verified", then="Validating", timeout=3600)

    @orch.phase("domains", "Provisioning")
    def domain(lease: Lease[Any]) -> Any:
        return lease.advance("Done")

    @orch.phase("databases", "Provisioning")
    def database(lease: Lease[Any]) -> Any:
        return lease.relock(wait=600)

    orch.submit("gateways", {"_id": "g1", "phase": "Creating"})
    orch.submit("gateways", {"_id": "g2", "phase": "Verifying"})
    orch.signal("gateways", "g2", "quota-raised", {"uri": SECRET_URI})
    orch.signal("gateways", "g2", "note", "x" * 500)
    for _ in range(3):
        orch.run_once()
    publish(db, orch)
    assert db.gateways.find_one({"_id": "g1"})[WAIT_FIELD]["kind"] == "children"
    return Scene(db, orch, Operations(db))


def tree_of(scene: Scene, collection: str, doc_id: Any) -> Any:
    return scene.operations.tree(collection, scene.operations.document(collection, doc_id))


# -- the operations' read ------------------------------------------------------------------


def test_a_parent_reads_its_children_with_their_phases_and_the_count_its_wait_has(
    scene: Scene,
) -> None:
    tree = tree_of(scene, "gateways", "g1")
    assert tree.parent is None and not tree.parent_unreadable
    assert tree.owns == ["domains", "databases"]
    shown = {(c.collection, c.id, c.name, c.phase, c.ended) for c in tree.children}
    assert shown == {
        ("domains", "gateways/g1/domain", "domain", "Done", True),
        ("databases", "gateways/g1/db", "db", "Provisioning", False),
    }
    assert (tree.counted.total, tree.counted.ended, tree.counted.failed) == (2, 1, 0)
    words = tree.waiting.words()
    assert words.startswith("waiting for children (all; 1 of 2 ended) since 20")
    assert words.endswith("then → Ready")


def test_a_child_reads_its_parent_and_the_name_its_step_gave_it(scene: Scene) -> None:
    tree = tree_of(scene, "domains", "gateways/g1/domain")
    assert tree.parent is not None
    assert (tree.parent.collection, tree.parent.id, tree.parent.name) == (
        "gateways",
        "g1",
        "domain",
    )
    assert tree.parent.ref == '"g1"'
    assert tree.children == [] and tree.waiting is None


def test_a_signal_wait_reads_its_name_deadline_and_next_phase_and_the_inbox_its_counts(
    scene: Scene,
) -> None:
    for n in range(MAX_SIGNALS):
        scene.orch.signal("gateways", "g2", "ping", n)
    tree = tree_of(scene, "gateways", "g2")
    words = tree.waiting.words()
    assert words.startswith("waiting for signal 'dns-verified' since 20")
    assert ", until 20" in words and "then → Validating" in words
    inbox = tree.inbox
    assert (inbox.sent, len(inbox.signals), inbox.dropped) == (MAX_SIGNALS + 2, MAX_SIGNALS, 2)
    assert inbox.signals[0].payload == str(MAX_SIGNALS - 1)  # the latest first
    assert "2 dropped" in inbox.words()


def test_a_signal_payload_is_shown_redacted_and_shortened(scene: Scene) -> None:
    inbox = tree_of(scene, "gateways", "g2").inbox
    by_name = {s.name: s for s in inbox.signals}
    assert "hunter2" not in by_name["quota-raised"].payload
    assert "ops:***@db.internal" in by_name["quota-raised"].payload
    assert len(by_name["note"].payload) <= 120 and by_name["note"].payload.endswith("…")


def test_a_signal_a_wait_took_is_marked_taken(scene: Scene) -> None:
    scene.orch.signal("gateways", "g2", "dns-verified")
    scene.orch.run_once()
    doc = scene.db.gateways.find_one({"_id": "g2"})
    assert doc["phase"] == "Validating"
    inbox = tree_of(scene, "gateways", "g2").inbox
    [taken] = [s for s in inbox.signals if s.taken]
    assert taken.name == "dns-verified" and inbox.taken == [taken.id]


@pytest.mark.pure
def test_with_no_live_replica_handling_the_children_whether_they_ended_is_not_said() -> None:
    counted = Counted.of([("domains", "Provisioning", 3)], Judge([]))
    assert (counted.total, counted.ended) == (3, None)
    assert "ended not known" in counted.words()


@pytest.mark.pure
@pytest.mark.parametrize(
    "stored",
    [5, "children", {"kind": "zzz"}, {"kind": "signal", "then": "X"}, {"kind": "children"}],
)
def test_a_wait_that_is_no_wait_reads_as_unreadable(stored: Any) -> None:
    waiting = Waiting.of({WAIT_FIELD: stored})
    assert waiting is not None and waiting.wait is None
    assert waiting.words().startswith("unreadable wait: ")
    assert waiting.to_dict()["unreadable"]


# -- garbage in every stored field ---------------------------------------------------------

GARBAGE: list[dict[str, Any]] = [
    {OWNER_FIELD: "x", OWNS_FIELD: "domains", WAIT_FIELD: 5},
    {OWNER_FIELD: {"collection": 1}, OWNS_FIELD: [1, None, "domains"], WAIT_FIELD: {"kind": 3}},
    {SIGNALS_FIELD: "junk", SENT_FIELD: "many", TAKEN_FIELD: 7},
    {SIGNALS_FIELD: [1, {"name": 3}, {"name": "ok", "at": "yesterday"}], SENT_FIELD: True},
    {WAIT_FIELD: {"kind": "children", "then": "Ready", "since": "now", "need": -1}},
    {OWNER_FIELD: {"collection": "gateways", "id": {"$weird": [1]}, "name": "n"}},
]


@pytest.fixture(params=range(len(GARBAGE)), ids=lambda n: f"garbage{n}")
def garbage(request: pytest.FixtureRequest, scene: Scene) -> dict[str, Any]:
    fields: dict[str, Any] = GARBAGE[request.param]
    scene.db.gateways.insert_one({"_id": "junk", "phase": "Creating", **fields})
    return fields


def test_garbage_in_a_stored_tree_field_is_shown_not_raised(
    scene: Scene,
    garbage: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tree = tree_of(scene, "gateways", "junk")
    json.dumps(tree.to_dict())  # serialisable, whatever was stored
    if OWNER_FIELD in garbage and tree.parent is None:
        assert tree.parent_unreadable
    if WAIT_FIELD in garbage:
        assert tree.waiting is not None and "unreadable wait" in tree.waiting.words()
    with mounted(scene.db) as page:
        shown = read(page.get("/ops/document", params={"c": "gateways", "id": "junk"}))
        if WAIT_FIELD in garbage:
            assert "unreadable wait" in shown.text_of("wait")
        api = page.get("/ops/api/document", params={"c": "gateways", "id": "junk"})
        assert api.status_code == 200, api.text
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: scene.db)
    for line in ("history junk -c gateways", "history junk -c gateways --json", "find -c gateways"):
        code, out, err = run([*shlex.split(line), "--uri", URI], capsys)
        assert code == 0, err
        assert "Traceback" not in out + err


# -- the page and its JSON API --------------------------------------------------------------


@pytest.fixture
def page(scene: Scene) -> Iterator[TestClient]:
    with mounted(scene.db) as client:
        yield client


def test_the_page_of_a_parent_says_what_it_waits_for_and_lists_its_children(
    scene: Scene, page: TestClient
) -> None:
    shown = read(page.get("/ops/document", params={"c": "gateways", "id": "g1"}))
    assert "waiting for children (all; 1 of 2 ended)" in shown.text_of("wait")
    assert "then → Ready" in shown.text_of("wait")
    assert "waiting for children (all)" in shown.text_of("lease-note")
    assert sorted(shown.rows("children")) == [
        ["databases", "gateways/g1/db", "db", "Provisioning", "going on"],
        ["domains", "gateways/g1/domain", "domain", "Done", "ended"],
    ]
    child = read(page.get(shown.links["gateways/g1/domain"].removeprefix("http://testserver")))
    assert "child domain of gateways / g1" in child.text_of("parent")
    parent = read(page.get(child.links["gateways / g1"]))
    assert parent.text_of("wait") == shown.text_of("wait")


def test_the_page_lists_the_inbox_latest_first_with_what_was_dropped(
    scene: Scene, page: TestClient
) -> None:
    for n in range(MAX_SIGNALS):
        scene.orch.signal("gateways", "g2", "ping", n)
    shown = read(page.get("/ops/document", params={"c": "gateways", "id": "g2"}))
    assert "waiting for signal 'dns-verified'" in shown.text_of("wait")
    assert f"{MAX_SIGNALS + 2} signals sent, {MAX_SIGNALS} kept, 2 dropped" in shown.text_of(
        "inbox-count"
    )
    rows = shown.rows("signals")
    assert len(rows) == MAX_SIGNALS
    assert rows[0][1:] == ["ping", str(MAX_SIGNALS - 1), "no"]
    assert "hunter2" not in shown.text


def test_the_json_api_gives_a_documents_tree(scene: Scene, page: TestClient) -> None:
    body = page.get("/ops/api/document", params={"c": "gateways", "id": "g1"}).json()
    tree = body["tree"]
    assert tree["waiting"]["kind"] == "children" and tree["waiting"]["then"] == "Ready"
    assert tree["waiting"]["children"]["total"] == 2
    assert tree["waiting"]["children"]["ended"] == 1
    assert {c["id"]: c["ended"] for c in tree["children"]} == {
        "gateways/g1/domain": True,
        "gateways/g1/db": False,
    }
    child = page.get("/ops/api/document", params={"c": "domains", "id": "gateways/g1/domain"})
    assert child.json()["tree"]["parent"] == {
        "collection": "gateways",
        "id": "g1",
        "ref": '"g1"',
        "name": "domain",
    }
    assert child.json()["row"]["owner"] == "gateways/g1"
    g2 = page.get("/ops/api/document", params={"c": "gateways", "id": "g2"}).json()["tree"]
    assert g2["inbox"]["sent"] == 2 and "hunter2" not in json.dumps(g2)


# -- the command line ------------------------------------------------------------------------


@pytest.fixture
def connected(scene: Scene, monkeypatch: pytest.MonkeyPatch) -> Scene:
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: scene.db)
    monkeypatch.setenv("COLUMNS", "100")
    return scene


def command(line: str) -> list[str]:
    return [*shlex.split(line), "--uri", URI]


def test_find_lists_a_parents_children_and_names_each_ones_parent(
    connected: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(command("find -c domains --owner gateways/g1"), capsys)
    assert code == 0, err
    assert "gateways/g1/domain" in out and "child of gateways/g1" in out
    assert "owner=gateways/g1" in out and "orchestrator_owner" in out
    code, out, err = run(command("find -c domains --owner gateways/g2 --json"), capsys)
    assert code == 0, err
    assert json.loads(out)["documents"] == []
    code, out, err = run(command("find -c databases --json"), capsys)
    assert [d["owner"] for d in json.loads(out)["documents"]] == ["gateways/g1"]


def test_find_says_what_each_document_waits_for(
    connected: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(command("find -c gateways"), capsys)
    assert code == 0, err
    assert "waiting for children (all)" in out
    assert "waiting for signal 'dns-verified'" in out
    code, out, _ = run(command("find -c gateways --json"), capsys)
    waits = {d["id"]: d["wait"] for d in json.loads(out)["documents"]}
    assert waits["g1"].startswith("waiting for children (all) since")


def test_find_refuses_a_bad_owner_in_one_line(
    connected: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(command("find -c domains --owner g1"), capsys)
    assert_one_line_error(code, err, "COLLECTION/ID")
    code, _, err = run(command("find -c domains --owner gateways/nope"), capsys)
    assert_one_line_error(code, err, "no document 'nope'")
    code, _, err = run(command("find -c gateways --owner gateways/g1"), capsys)
    assert_one_line_error(code, err, "orchestrator_owner")  # no child was made there


def test_history_names_the_parent_lists_the_children_and_the_inbox(
    connected: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(command("history g1 -c gateways"), capsys)
    assert code == 0, err
    assert "waiting for children (all; 1 of 2 ended)" in out
    assert "children (2 in domains, databases; 1 ended):" in out
    assert "  domains/gateways/g1/domain  Done  ended" in out
    assert "  databases/gateways/g1/db  Provisioning  going on" in out
    code, out, err = run(command("history gateways/g1/db -c databases"), capsys)
    assert code == 0, err
    assert "parent: gateways/g1 (its child 'db')" in out
    code, out, err = run(command("history g2 -c gateways"), capsys)
    assert "signals: 2 signals sent, 2 kept; latest first:" in out
    assert "hunter2" not in out and "quota-raised" in out
    code, out, _ = run(command("history g1 -c gateways --json"), capsys)
    assert json.loads(out)["tree"]["children_counted"]["ended"] == 1


def test_a_steps_progress_is_shown_on_the_page_and_by_find(
    connected: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    progress = {"fraction": 0.4, "note": "copying, password=hunter2", "phase": "Provisioning"}
    connected.db.databases.update_one({}, {"$set": {"orchestratorProgress": progress}})
    connected.db.domains.update_one(
        {}, {"$set": {"orchestratorProgress": {**progress, "fraction": 1.0, "note": None}}}
    )
    code, out, err = run(command("find -c databases"), capsys)
    assert code == 0, err
    assert "progress 40%: copying" in out and "hunter2" not in out
    code, out, _ = run(command("find -c domains --json"), capsys)
    [row] = json.loads(out)["documents"]
    assert row["progress"] == "progress 100% (in Provisioning, since left)"
    with mounted(connected.db) as client:
        shown = read(client.get("/ops/document", params={"c": "databases", "id": "gateways/g1/db"}))
    assert shown.text_of("progress").startswith("progress 40%: copying")
    for garbage in ({"fraction": "most"}, {"fraction": float("nan")}, 7):
        connected.db.databases.update_one({}, {"$set": {"orchestratorProgress": garbage}})
        code, out, _ = run(command("find -c databases --json"), capsys)
        assert code == 0 and json.loads(out)["documents"][0]["progress"] is None
