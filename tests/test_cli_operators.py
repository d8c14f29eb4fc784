"""The operators' commands, as an operator types them at an 80-column terminal: find
(by filter and business key, page by page), history, retry, unlock and cancel of one
document or of a filter's (dry run, confirmation, --yes), pause and resume, audit, and
status. Every refusal is one line and exit status 2."""

from __future__ import annotations

import io
import json
import shlex
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import pytest
from pymongo.database import Database

from orchestrator import Lease, LeaseLost, Orchestrator
from orchestrator.cli import acting, connecting
from orchestrator.core.audit import takeover_record
from orchestrator.core.clock import bson_time
from orchestrator.core.history import HISTORY_FIELD
from orchestrator.core.names import AUDIT_COLLECTION, PAUSES_COLLECTION
from orchestrator.core.trees import SIGNALS_FIELD
from orchestrator.testing import FakeClock
from tests.cli_kit import URI, assert_one_line_error, publish, run
from tests.conftest import MakeEither, MakeReplica
from tests.engines import Replica, hold, wait
from tests.test_operator_trees import BACKUP, DB, DOMAIN, grown


@pytest.fixture
def connected(db: Database[Any], monkeypatch: pytest.MonkeyPatch) -> Database[Any]:
    """``--uri`` resolves to the test database, read at 80 columns."""
    monkeypatch.setattr(connecting, "connect", lambda uri, database, timeout: db)
    monkeypatch.setenv("COLUMNS", "80")
    return db


@dataclass
class Invoices:
    """Six invoices charged by replica pod-1: the four over 100 failed (the bank said
    no) and wait in Failed; ``bank`` says whether the bank answers now."""

    db: Database[Any]
    orch: Orchestrator
    bank: dict[str, bool]

    def ids(self, **query: Any) -> list[str]:
        return sorted(str(d["_id"]) for d in self.db.invoices.find(query))

    def by_number(self, number: str) -> dict[str, Any]:
        doc = self.db.invoices.find_one({"number": number})
        assert doc is not None
        return doc

    def drain(self) -> None:
        for _ in range(5):
            self.orch.run_once()


@pytest.fixture
def invoices(connected: Database[Any], make: MakeReplica) -> Invoices:
    orch = make("pod-1", max_attempts=1)
    bank = {"up": False}

    @orch.phase("invoices", "Charging", to="Paid")
    def charge(lease: Lease[Any]) -> Any:
        if lease.doc["amount"] > 100 and not bank["up"]:
            raise RuntimeError(f"card declined for {lease.doc['number']}")
        return lease.advance("Paid")

    for i in range(6):
        orch.submit(
            "invoices",
            {"number": f"INV-100{i}", "amount": 50 + 30 * i, "phase": "Charging"},
            unique="number",
        )
    scene = Invoices(connected, orch, bank)
    scene.drain()
    assert connected.invoices.count_documents({"phase": "Failed"}) == 4
    publish(connected, orch)
    return scene


@pytest.fixture
def charges(connected: Database[Any], make: MakeReplica) -> Invoices:
    """Four invoices charged by replica pod-1: the handler gave up on two (their card was
    reported stolen: ``fail()``), which wait in Failed; the other two failed an attempt
    (the bank did not answer) and are retried after their backoff, in Charging."""
    orch = make("pod-1", max_attempts=3)
    bank = {"up": False}

    @orch.phase("invoices", "Charging", to="Paid")
    def charge(lease: Lease[Any]) -> Any:
        if bank["up"]:
            return lease.advance("Paid")
        if lease.doc["stolen"]:
            return lease.fail("the card was reported stolen")
        raise RuntimeError("the bank did not answer")

    for i in range(4):
        doc = {"number": f"INV-200{i}", "stolen": i < 2, "phase": "Charging"}
        orch.submit("invoices", doc, unique="number")
    orch.run_once()  # the clock stands still: the retries wait out their backoff
    publish(connected, orch)
    return Invoices(connected, orch, bank)


def command(line: str) -> list[str]:
    return [*shlex.split(line), "--uri", URI]


# -- find ------------------------------------------------------------------------------------


def test_find_by_business_key_shows_the_whole_id_at_80_columns(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = invoices.by_number("INV-1003")
    for line in ("find -c invoices --key INV-1003", "find -c invoices number=INV-1003"):
        code, out, err = run(command(line), capsys)
        assert code == 0, err
        assert str(doc["_id"]) in out  # 24 characters, whole, on one line
        assert "number=INV-1003" in out
        assert "RuntimeError: card declined for" in out
        assert "1 match" in out
        assert "served by: the index on (number)" in out
        assert max(len(line) for line in out.splitlines()) <= 80


def test_find_pages_through_a_filter_with_the_command_it_prints(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = invoices.ids(phase="Failed")
    code, out, _ = run(
        command("find -c invoices --state failed --error RuntimeError --limit 3"), capsys
    )
    assert code == 0
    assert "4 matching, 3 shown" in out
    assert "orchestrator_errors" in out
    [next_line] = [line for line in out.splitlines() if line.startswith("next page: ")]
    words = shlex.split(next_line.removeprefix("next page: "))
    assert words[:2] == ["orchestrator", "find"]
    assert words[-2] == "--after"
    first = [i for i in failed if i in out]
    code, out, _ = run([*words[1:], "--uri", URI], capsys)
    assert code == 0
    second = [i for i in failed if i in out]
    assert "next page" not in out
    assert sorted(first + second) == failed and len(first) == 3


def test_find_as_json_is_the_page(invoices: Invoices, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(command("find -c invoices --phase Failed --limit 2 --json"), capsys)
    assert code == 0
    page = json.loads(out)
    assert len(page["documents"]) == 2 and page["next"]
    row = page["documents"][0]
    assert row["key"].startswith("number=INV-10")
    assert row["failed_by"] == invoices.orch.handlers[0].name
    assert row["state"] == "free" and row["error_type"] == "RuntimeError"


def test_status_and_find_name_the_given_up_and_the_still_retrying_apart(
    charges: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    """Failed is what a handler gave up on, retrying what the library tries again: counted
    in columns of their own and found by --state each (before: one failed count of both,
    and --state failed listed the two still being retried too)."""
    given_up, retrying = charges.ids(phase="Failed"), charges.ids(phase="Charging")
    code, out, _ = run(command("status -c invoices --json"), capsys)
    assert code == 0
    counts = {r["phase"]: (r["retrying"], r["failed"]) for r in json.loads(out)["phases"]}
    assert counts == {"Charging": (2, 0), "Failed": (0, 2)}
    code, out, _ = run(command("status -c invoices"), capsys)
    assert code == 0
    [header] = [line for line in out.splitlines() if line.startswith("collection")]
    assert header.split()[-2:] == ["retrying", "failed"]
    assert "invoices    Charging          2           0        0        2         2       0" in out
    assert "given up in invoices (all: orchestrator find -c invoices --state failed)" in out
    assert "retrying in invoices (all: orchestrator find -c invoices --state retrying)" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    for state, listed, left_out in (
        ("failed", given_up, retrying),
        ("retrying", retrying, given_up),
    ):
        code, out, _ = run(command(f"find -c invoices --state {state}"), capsys)
        assert code == 0
        assert f"(state={state}): 2 matching, 2 shown" in out
        assert all(i in out for i in listed) and not any(i in out for i in left_out)


def test_a_bulk_retry_of_the_failed_leaves_the_still_retrying_alone(
    charges: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    """``retry --state failed`` resets the attempts of what its handler gave up on only
    (before: also of the documents still being retried, each back to attempt 0)."""
    charges.bank["up"] = True
    code, out, _ = run(command("retry -c invoices --state failed --yes --why fixed"), capsys)
    assert code == 0
    assert "retried 2 documents of invoices (state=failed)" in out
    assert charges.ids(phase="Charging", attempts=0) == sorted(
        str(charges.by_number(n)["_id"]) for n in ("INV-2000", "INV-2001")
    )
    for number in ("INV-2002", "INV-2003"):
        left = charges.by_number(number)
        assert (left["phase"], left["attempts"]) == ("Charging", 1)
        assert left["lastError"]["message"] == "the bank did not answer"


def test_find_in_a_narrow_terminal_prints_each_id_whole_on_its_line(
    invoices: Invoices, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    code, out, _ = run(command("find -c invoices --state failed"), capsys)
    assert code == 0
    lines = out.splitlines()
    for doc_id in invoices.ids(phase="Failed"):
        assert doc_id in lines


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("find -c invoices bogus=1", ["no index of 'invoices' starts with 'bogus'", "(number)"]),
        ("find -c invoices INV-1003", ["is no FIELD=VALUE", "--key VALUE"]),
        ("find -c invoices --state stuck", ["--state", "stuck"]),
        ("find -c invoices --after garbage", ["malformed page cursor"]),
        ("find -c invoicez", ["unknown collection 'invoicez'"]),
        ("find -c invoices --limit 501", ["--limit"]),
    ],
)
def test_find_refuses_in_one_line(
    line: str, needles: list[str], invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(command(line), capsys)
    assert_one_line_error(code, err, *needles)


# -- history ---------------------------------------------------------------------------------


def test_history_is_a_timeline_of_steps_and_operators_actions(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = invoices.by_number("INV-1003")
    code, out, _ = run(command("retry INV-1003 -c invoices --why 'bank is back'"), capsys)
    assert code == 0, out
    invoices.bank["up"] = True
    invoices.drain()
    code, out, _ = run(command("history INV-1003 -c invoices"), capsys)
    assert code == 0
    assert out.splitlines()[0] == f"invoices/{doc['_id']} (number=INV-1003)"
    assert "now: Paid" in out
    assert "latest first (3 entries" in out  # as the page and the JSON API show it
    steps = [line for line in out.splitlines() if line.startswith("#")]
    assert steps[0].startswith("#3") and steps[2].startswith("#1")
    assert "step by pod-1: advanced, Charging -> Paid" in steps[0]
    assert "(operator): retry, Failed -> Charging" in steps[1]
    assert "step by pod-1: failed, Charging -> Failed" in steps[2]
    assert "RuntimeError: card declined for INV-1003" in out
    assert "why: bank is back" in out
    assert "Traceback" not in out

    code, out, _ = run(command("history INV-1003 -c invoices --traceback"), capsys)
    assert "Traceback (most recent call last)" in out
    assert "raise RuntimeError" in out

    code, out, _ = run(
        command(f'history --id-json \'{{"$oid": "{doc["_id"]}"}}\' -c invoices --json'),
        capsys,
    )
    timeline = json.loads(out)
    assert timeline["order"] == "latest first"
    assert [e["what"] for e in timeline["entries"]] == ["advanced", "retry", "failed"]
    assert "Traceback" in timeline["entries"][2]["traceback"]
    assert timeline["document"]["key"] == "number=INV-1003"


def test_history_of_a_document_without_one_says_so(
    connected: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    connected.jobs.insert_many([{"_id": "j", "phase": "Queued"}, {"_id": "k", HISTORY_FIELD: 7}])
    for doc_id in ("j", "k"):
        code, out, _ = run(command(f"history {doc_id} -c jobs"), capsys)
        assert code == 0
        assert "no history recorded" in out


# -- retry, unlock, cancel ---------------------------------------------------------------------


def test_bulk_retry_dry_run_then_for_real(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = invoices.ids(phase="Failed")
    before = list(invoices.db.invoices.find())
    filters = "retry -c invoices --state failed --error RuntimeError"
    code, out, _ = run(command(f"{filters} --dry-run"), capsys)
    assert code == 0
    assert "would retry 4 documents of invoices (state=failed, error=RuntimeError)" in out
    assert "Failed -> Charging: 4" in out
    assert all(doc_id in out for doc_id in failed)
    assert list(invoices.db.invoices.find()) == before

    code, out, err = run(command(filters), capsys)  # no terminal to confirm on
    assert_one_line_error(code, err, "needs --yes", "--dry-run")
    assert list(invoices.db.invoices.find()) == before

    code, out, _ = run(command(f"{filters} --yes --why 'bank is back'"), capsys)
    assert code == 0
    assert "retried 4 documents" in out and "attempts reset, claimable now" in out
    assert "why: bank is back" in out
    assert invoices.ids(phase="Charging", attempts=0) == failed
    invoices.bank["up"] = True
    invoices.drain()
    assert invoices.ids(phase="Paid") == invoices.ids()
    [entry] = invoices.db[AUDIT_COLLECTION].find({"action": "retry"})
    assert (entry["count"], entry["why"], entry["scope"]["state"]) == (4, "bank is back", "failed")


def test_a_bulk_action_on_a_terminal_asks_first(
    invoices: Invoices, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acting, "interactive", lambda: True)
    before = list(invoices.db.invoices.find())
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    code, out, _ = run(command("retry -c invoices --from Failed"), capsys)
    assert code == 1
    assert "would retry 4 documents" in out and "retry 4 documents now? [y/N]" in out
    assert "nothing was changed" in out
    assert list(invoices.db.invoices.find()) == before
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, _ = run(command("retry -c invoices --from Failed"), capsys)
    assert code == 0
    assert invoices.db.invoices.count_documents({"phase": "Charging"}) == 4


def test_a_retried_document_can_be_retried_again(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(2):
        code, out, _ = run(command("retry INV-1004 -c invoices"), capsys)
        assert code == 0, out
        assert "-> Charging, attempts reset" in out
    assert invoices.by_number("INV-1004")["phase"] == "Charging"


def test_a_retry_to_a_phase_no_live_replica_handles_is_refused_unless_forced(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    for line in (
        "retry INV-1003 -c invoices --phase Chargng",
        "retry -c invoices --from Failed --phase Chargng --dry-run",
    ):
        code, _, err = run(command(line), capsys)
        assert_one_line_error(
            code, err, "no live replica handles phase 'Chargng'", "Charging", "--force"
        )
    assert invoices.by_number("INV-1003")["phase"] == "Failed"
    code, out, _ = run(command("retry INV-1003 -c invoices --phase Chargng --force"), capsys)
    assert code == 0
    assert "Failed -> Chargng" in out
    invoices.db.drop_collection("orchestrator.replicas")
    code, _, err = run(command("retry INV-1004 -c invoices"), capsys)
    assert_one_line_error(code, err, "no replica is live", "--force")


def test_a_bulk_retry_skips_a_live_lease_unless_forced(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    now = invoices.orch.clock.now()
    error = {"type": "RuntimeError", "message": "x", "at": bson_time(now), "phase": "Charging"}
    invoices.db.invoices.insert_one(
        {
            "number": "INV-2000",
            "phase": "Charging",
            "lastError": error,
            "lockToken": "t",
            "lockedBy": "pod-7",
            "lockedUntil": bson_time(now + timedelta(seconds=60)),
        }
    )
    code, out, _ = run(command("retry -c invoices --from Charging --state retrying --yes"), capsys)
    assert code == 0
    assert "retried 0 documents" in out and "1 skipped" in out
    assert "held by a live lease of 'pod-7'" in out
    code, out, _ = run(command("retry -c invoices --key INV-2000 --force --yes"), capsys)
    assert code == 0
    assert "1 live lease(s) taken" in out and "leased (pod-7): taken" in out
    assert "lockToken" not in invoices.by_number("INV-2000")


def test_unlock_of_a_filter_frees_dead_replicas_leases(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    past = bson_time(invoices.orch.clock.now() - timedelta(seconds=60))
    invoices.db.invoices.update_many(
        {"phase": "Paid"}, {"$set": {"lockToken": "dead", "lockedBy": "pod-9", "lockedUntil": past}}
    )
    code, out, _ = run(command("unlock -c invoices --state overdue --dry-run"), capsys)
    assert code == 0
    assert "would unlock 2 documents of invoices (state=overdue): in Paid: 2" in out
    code, out, _ = run(
        command("unlock -c invoices --state overdue --yes --why 'pod-9 died'"), capsys
    )
    assert code == 0
    assert "unlocked 2 documents" in out and "claimable now" in out
    assert invoices.db.invoices.count_documents({"lockToken": "dead"}) == 0


@pytest.mark.anyio
async def test_cancel_of_a_running_step_fences_it_like_an_outside_writer(
    replicas: MakeEither,
    connected: Database[Any],
    clock: FakeClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    replica = await replicas("pod-2")
    box = hold(replica)
    publish(connected, replica.orch)
    await replica.submit("jobs", {"_id": "job-1", "phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(replica.run_once)
        assert await wait(box["claimed"])
        code, out, _ = await anyio.to_thread.run_sync(
            run, command("cancel job-1 -c jobs --why 'not wanted'"), capsys
        )
        assert code == 0, out
        assert "cancelled jobs/job-1: Running -> Cancelled, released, attempts reset" in out
        assert "replica 'pod-2' was running a step on it, whose next write raises LeaseLost" in out
        box["go"].set()
    assert isinstance(box["lost"], LeaseLost)
    doc = connected.jobs.find_one({"_id": "job-1"})
    assert doc["phase"] == "Cancelled" and "lockToken" not in doc
    [entry] = [e for e in doc[HISTORY_FIELD] if e["kind"] == "operator"]
    assert (entry["action"], entry["why"], entry["to"]) == ("cancel", "not wanted", "Cancelled")


def test_cancel_to_a_phase_of_ones_own_is_checked_like_a_retry(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(command("cancel INV-1003 -c invoices --to Refunding"), capsys)
    assert_one_line_error(code, err, "no live replica handles phase 'Refunding'", "--force")
    doc = invoices.by_number("INV-1003")
    code, out, _ = run(command("cancel INV-1003 -c invoices --dry-run"), capsys)
    assert code == 0
    assert f"would cancel 1 document of invoices (_id={doc['_id']}): Failed -> Cancelled" in out
    assert invoices.by_number("INV-1003") == doc
    code, out, _ = run(command("cancel -c invoices --phase Failed --dry-run"), capsys)
    assert code == 0
    assert "would cancel 4 documents of invoices (phase=Failed): Failed -> Cancelled: 4" in out
    code, out, _ = run(command("cancel INV-1003 -c invoices --to Refunding --force"), capsys)
    assert code == 0
    assert invoices.by_number("INV-1003")["phase"] == "Refunding"


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("retry -c invoices", ["give its ID, or --id-json", "--from"]),
        ("cancel -c invoices", ["give its ID, or --id-json", "--phase"]),
        ("retry INV-1001 INV-1002 -c invoices", ["one ID at a time"]),
        ("unlock INV-1001 -c invoices --state failed", ["an ID or filters, not both"]),
        ("unlock -c invoices --key INV-9999 --yes", []),
        ("retry INV-9999 -c invoices", ["no document 'INV-9999'"]),
        ("unlock -c invoices amount=170 --yes", ["no index of 'invoices' starts with 'amount'"]),
    ],
)
def test_actions_refuse_in_one_line(
    line: str, needles: list[str], invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(command(line), capsys)
    if needles:
        assert_one_line_error(code, err, *needles)
    else:  # selects nothing: done, nothing changed
        assert code == 0, err
        assert "unlocked 0 documents" in out


# -- signals and a cancel's cascade -------------------------------------------------------------


def certificates(replica: Replica, box: dict[str, Any]) -> None:
    @replica.phase("certificates", "Requesting")
    async def requesting(lease: Any) -> Any:
        return await lease.wait_for("dns-verified", then="Validating")

    @replica.phase("certificates", "Validating")
    async def validating(lease: Any) -> Any:
        box["payload"] = lease.signal("dns-verified").payload
        return await lease.advance("Issued")


@pytest.mark.anyio
async def test_signal_wakes_a_waiting_document_for_the_replicas_next_tick(
    replicas: MakeEither, connected: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    replica = await replicas()
    box: dict[str, Any] = {}
    certificates(replica, box)
    await replica.submit(
        "certificates", {"phase": "Requesting", "domain": "a.example"}, unique="domain"
    )
    await replica.run_once(heartbeat=False)
    publish(connected, replica.orch)
    line = "signal certificates a.example dns-verified --payload '{\"txt\": 1}' --why checked"
    code, out, err = run(command(line), capsys)
    assert code == 0, err
    stored = connected.certificates.find_one({"domain": "a.example"})
    name = f"certificates/{stored['_id']} (domain=a.example)"
    assert f"signal 'dns-verified' sent to {name}: it was waiting for it, and is due now" in out
    assert "recorded: by " in out and "why: checked" in out
    await replica.run_once(heartbeat=False)
    assert connected.certificates.find_one({"domain": "a.example"})["phase"] == "Issued"
    assert box["payload"] == {"txt": 1}
    [entry] = list(connected[AUDIT_COLLECTION].find({"action": "signal"}))
    assert entry["scope"]["key"] == "domain=a.example" and entry["why"] == "checked"


def test_signal_to_a_document_not_waiting_keeps_it_for_a_later_wait(
    connected: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    connected.certificates.insert_one({"_id": 42, "phase": "New"})
    line = "signal -c certificates --id-json '{\"$numberInt\": \"42\"}' ping --why 'just so'"
    code, out, err = run(command(line), capsys)
    assert code == 0, err
    assert (
        "signal 'ping' sent to certificates/42: it was not waiting for it; kept in its inbox" in out
    )
    assert [s["name"] for s in connected.certificates.find_one({"_id": 42})[SIGNALS_FIELD]] == [
        "ping"
    ]


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("signal certificates c1 ping", ["--why"]),
        ("signal certificates c1 --why x", ["give COLLECTION ID NAME", "2 argument(s)"]),
        ("signal -c certificates c1 ping extra --why x", ["give ID NAME"]),
        ("signal certificates c1 ping --payload '{oops' --why x", ["--payload", "not JSON"]),
        ("signal certificates nope ping --why x", ["no document 'nope'"]),
        ("signal certificatez c1 ping --why x", ["unknown collection 'certificatez'"]),
        ("signal certificates c1 '' --why x", ["a signal's name is a non-empty string"]),
        (
            "signal certificates c1 ping --payload '{\"$set\": 1}' --why x",
            ["field payload.$set is not allowed"],
        ),
    ],
)
def test_signal_refuses_in_one_line_and_sends_nothing(
    line: str, needles: list[str], connected: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    connected.certificates.insert_one({"_id": "c1", "phase": "New"})
    code, _, err = run(command(line), capsys)
    assert_one_line_error(code, err, *needles)
    assert connected.certificates.find_one({"_id": "c1"}) == {"_id": "c1", "phase": "New"}
    assert connected[AUDIT_COLLECTION].count_documents({}) == 0


@pytest.mark.anyio
async def test_cancel_reaches_what_the_document_owns_unless_abandoned(
    replicas: MakeEither, connected: Database[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    await grown(replicas, connected, {})
    code, out, err = run(command("cancel g1 -c gateways --children abandon --why x"), capsys)
    assert code == 0, err
    assert "the documents it owns, if any, are left as they are (--children abandon)" in out
    assert connected.backups.find_one({"_id": BACKUP})["phase"] == "Copying"
    connected.gateways.update_one({"_id": "g1"}, {"$set": {"phase": "Creating"}})
    code, out, err = run(command("cancel g1 -c gateways --why 'customer left'"), capsys)
    assert code == 0, err
    assert "cancelled gateways/g1: Creating -> Cancelled" in out
    assert "also cancelled, as owned by what was cancelled:" in out
    assert f"  databases/{DB} (owned by gateways/g1), was Provisioning" in out
    assert f"  backups/{BACKUP} (owned by databases/{DB}), was Copying" in out
    assert f"left as they are (done with, or moving on each try):\n  domains/{DOMAIN}" in out
    assert connected.backups.find_one({"_id": BACKUP})["phase"] == "Cancelled"
    code, _, err = run(command("cancel g1 -c gateways --children orphan"), capsys)
    assert_one_line_error(code, err, "--children", "'orphan' is not one of 'cancel', 'abandon'")


# -- pause, resume, audit, status --------------------------------------------------------------


def test_pause_and_resume_a_phase(invoices: Invoices, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        command("pause -c invoices --phase Charging --why 'bank maintenance'"), capsys
    )
    assert code == 0
    assert "paused invoices, phase Charging" in out and "why: bank maintenance" in out
    assert "within one heartbeat interval (5s on the live replicas)" in out
    code, out, _ = run(command("pause -c invoices --phase Charging --why again"), capsys)
    assert code == 0 and "was paused already" in out

    code, out, _ = run(command("status -c invoices"), capsys)
    assert "invoices, phase Charging: by " in out and "why: bank maintenance" in out
    assert "honoured by: no live replica yet; not yet by: pod-1" in out
    invoices.orch.heartbeat()  # reads the pauses, as every replica does at its heartbeat
    publish(invoices.db, invoices.orch, paused=("invoices, phase Charging",))
    code, out, _ = run(command("status -c invoices"), capsys)
    assert "honoured by: pod-1" in out

    invoices.bank["up"] = True
    code, _, _ = run(command("retry -c invoices --from Failed --yes"), capsys)
    invoices.drain()
    assert invoices.db.invoices.count_documents({"phase": "Charging"}) == 4  # none claimed

    code, out, _ = run(
        command("resume -c invoices --phase Charging --why 'maintenance over'"), capsys
    )
    assert code == 0 and "resumed invoices, phase Charging" in out
    invoices.orch.heartbeat()
    invoices.drain()
    assert invoices.db.invoices.count_documents({"phase": "Paid"}) == 6
    code, _, err = run(command("resume -c invoices --phase Charging"), capsys)
    assert_one_line_error(code, err, "is not paused", "the pauses in force: none")


def test_pause_refuses_in_one_line_what_no_live_replica_has_unless_forced(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(command("pause -c invoices --phase Charging"), capsys)
    assert_one_line_error(code, err, "--why")
    code, _, err = run(command("pause -c invoicez --why x"), capsys)
    assert_one_line_error(code, err, "unknown collection 'invoicez'")
    code, _, err = run(command("pause -c invoices --phase '$bad' --why x"), capsys)
    assert_one_line_error(code, err, "a pause's phase must be a name")
    code, _, err = run(command("pause -c invoices --phase Chargin --why x"), capsys)
    assert_one_line_error(
        code,
        err,
        "no handler takes phase 'Chargin' of 'invoices' (on any live replica); "
        "they have: Charging; --force pauses it all the same",
    )
    code, _, err = run(command("pause -c invoices --handler nope:charge --why x"), capsys)
    assert_one_line_error(code, err, "no handler 'nope:charge' runs on 'invoices'", "--force")
    assert invoices.orch.handlers[0].name in err
    assert invoices.db[PAUSES_COLLECTION].count_documents({}) == 0
    code, out, err = run(command("pause -c invoices --handler nope:charge --why x --force"), capsys)
    assert code == 0 and "paused invoices, handler nope:charge" in out and not err
    assert invoices.db[PAUSES_COLLECTION].count_documents({}) == 1


def test_audit_lists_every_action_latest_first(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    run(command("retry INV-1003 -c invoices --why 'one'"), capsys)
    run(command("pause -c invoices --why 'two'"), capsys)
    run(command("retry -c invoices --from Failed --yes --why 'three'"), capsys)
    code, out, _ = run(command("audit"), capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "audit trail, latest first (times UTC):"
    assert "retry invoices (phase=Failed): 3 documents" in lines[1]
    assert lines[2] == "    why: three"
    assert "pause invoices" in lines[3]
    doc_id = str(invoices.by_number("INV-1003")["_id"])
    assert f"retry invoices -> Charging: 1 document ({doc_id} number=INV-1003)" in lines[5]
    code, out, _ = run(command("audit --limit 1 --json"), capsys)
    [entry] = json.loads(out)
    assert (entry["action"], entry["count"], entry["why"]) == ("retry", 3, "three")
    assert sorted(entry["keys"]) == ["number=INV-1002", "number=INV-1004", "number=INV-1005"]


def test_audit_names_documents_by_business_key_and_is_searched_by_it(
    invoices: Invoices, capsys: pytest.CaptureFixture[str]
) -> None:
    run(command("retry INV-1003 -c invoices --why 'one'"), capsys)
    run(command("cancel INV-1004 -c invoices --why 'two'"), capsys)
    run(command("retry -c invoices --from Failed --yes --why 'three'"), capsys)
    for typed in ("INV-1005", "number=INV-1005"):
        code, out, err = run(command(f"audit --key {typed}"), capsys)
        assert code == 0, err
        [_, found, why] = out.splitlines()
        assert "retry invoices (phase=Failed): 2 documents" in found
        assert "number=INV-1005" in found and why == "    why: three"
    code, out, _ = run(command("audit --key INV-1004 --json"), capsys)
    [entry] = json.loads(out)
    assert (entry["action"], entry["keys"]) == ("cancel", ["number=INV-1004"])
    code, out, _ = run(command("audit --key INV-1003"), capsys)
    assert [line.split(": ", 1)[1].split(" ", 1)[0] for line in out.splitlines()[1::2]] == ["retry"]
    code, out, _ = run(command("audit --key INV-9999"), capsys)
    assert (code, out.strip()) == (0, "no entry names INV-9999")


def test_status_at_80_columns_shows_whole_ids_keys_and_take_overs(
    invoices: Invoices, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = invoices.by_number("INV-1003")
    invoices.db[AUDIT_COLLECTION].insert_one(
        takeover_record(
            at=invoices.orch.clock.now(),
            by="pod-1",
            taken_from="pod-9",
            collection="invoices",
            document=json.dumps({"$oid": str(doc["_id"])}),
            phase="Charging",
        )
    )
    code, out, _ = run(command("status -c invoices"), capsys)
    assert code == 0
    for doc_id in invoices.ids(phase="Failed"):
        assert doc_id in out
    assert "number=INV-1003" in out
    assert "gave up" in out
    assert f"invoices/{doc['_id']} (Charging): pod-1 took it over from pod-9" in out
    code, out, _ = run(command("status -c invoices --json"), capsys)
    assert json.loads(out)["takeovers"][0]["taken_from"] == "pod-9"
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(command("status -c invoices"), capsys)
    assert f"{invoices.orch.handlers[0].name} gave up" in out  # module:function


def test_status_at_80_columns_shows_a_long_replica_id_whole(
    connected: Database[Any], make: MakeReplica, capsys: pytest.CaptureFixture[str]
) -> None:
    long_id = "billing-worker-7f9c4d5b8-x2k8p-4242-a1b2c3d4"  # host-pid-random, as made
    orch = make(long_id)

    @orch.phase("jobs", "A", to="B")
    def step(lease: Lease[Any]) -> Any:
        return lease.advance("B")

    orch.submit("jobs", {"phase": "A"})
    publish(connected, orch)
    code, out, _ = run(command("status -c jobs"), capsys)
    assert code == 0
    assert long_id in out
    assert max(len(line) for line in out.splitlines()) <= 80
    # Too wide for a table in 80: a block per replica, no value or name cut mid-word.
    flat = " ".join(out.split())
    assert "engine: threaded" in flat and "concurrency: 4" in flat and "tick: 1s" in flat
