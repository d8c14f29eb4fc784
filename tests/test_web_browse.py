"""The page's document browser, read as HTML as a browser would: every count of the
overview opens its list, lists page by keyset and say which index served them, a
document is found by its business key, its lease badge knows the failed phase and the
``failedBy`` mark, and its history reads as a timeline.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from fractions import Fraction
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from bson import Binary
from bson.binary import STANDARD
from bson.codec_options import CodecOptions, TypeDecoder, TypeRegistry
from fastapi.testclient import TestClient
from pymongo.database import Database

from orchestrator.operations import Filter, Operations
from orchestrator.testing import FakeClock, memory_database
from tests.operator_page import Page, mounted, read, seed, seed_invoices, seed_refunds


@pytest.fixture
def page(db: Database[Any]) -> Iterator[TestClient]:
    with mounted(db) as client:
        yield client


def documents_of(shown: Page) -> list[str]:
    """The ids a list page shows, in its order."""
    return [row[0] for row in shown.rows("documents")] if "documents" in shown.tables else []


def test_every_count_of_the_overview_opens_the_documents_it_counts(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed_invoices(seed(db, clock))
    overview = read(page.get("/ops/"))
    counted = overview.tables["counts"][1:]
    links = overview.row_links["counts"][1:]
    assert len(counted) == len(links) == 7  # 3 + 2 phases, and a total per collection
    for cells, row_links in zip(counted, links, strict=True):
        # A row's links: its phase (or collection), then each count, in the columns' order.
        numbers = [int(n) for n in cells[2:]]
        for number, link in zip(numbers, row_links[1:], strict=True):
            listed = read(page.get(link))
            assert len(documents_of(listed)) == number, (cells, link)
    failed = read(page.get("/ops/documents?c=invoices&phase=Failed&state=failed"))
    assert [row[1] for row in failed.rows("documents")] == [
        "invoice=INV-1005",
        "invoice=INV-1004",
        "invoice=INV-1003",
    ]  # the latest error first, each with its business key beside its id
    assert all(row[3].startswith("failed") for row in failed.rows("documents"))


def test_the_page_shows_the_given_up_and_the_still_retrying_apart(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    """Failed (a handler gave up) and retrying (the library tries again) have columns,
    filters and labels of their own (before: one failed count and filter holding both,
    whose Retry all reset the attempts of the ones still being retried)."""
    seeded = seed(db, clock)
    given_up = seed_invoices(seeded)[2:5]
    retrying = seed_refunds(seeded)
    overview = read(page.get("/ops/"))
    header, *rows = overview.tables["counts"]
    assert header[-2:] == ["retrying", "failed"]
    counts = {(row[0], row[1]): row[-2:] for row in rows}
    assert counts[("invoices", "Refunding")] == ["2", "0"]
    assert counts[("invoices", "Failed")] == ["0", "3"]
    assert overview.links["All retrying documents of invoices (2)"] == (
        "/ops/documents?c=invoices&state=retrying"
    )
    listed = {}
    for state in ("retrying", "failed"):
        response = page.get(f"/ops/documents?c=invoices&state={state}")
        assert f"<option selected>{state}</option>" in response.text  # the filter's choice
        shown = read(response)
        listed[state] = documents_of(shown)
        labels = {row[3] for row in shown.rows("documents")}
        assert labels == ({"failed"} if state == "failed" else {"waiting retrying"}), labels
    assert sorted(listed["retrying"]) == sorted(retrying)
    assert sorted(listed["failed"]) == sorted(given_up)


def test_the_latest_errors_show_the_business_key_beside_the_id(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    ids = seed_invoices(seed(db, clock))
    rows = read(page.get("/ops/")).rows("errors")
    invoices = [row[1:3] for row in rows if row[0] == "invoices"]
    assert sorted(invoices) == [[ids[n], f"invoice=INV-100{n + 1}"] for n in (2, 3, 4)]
    overview = read(page.get("/ops/"))
    assert overview.links["All failed documents of invoices (3)"] == (
        "/ops/documents?c=invoices&state=failed"
    )


def test_a_list_pages_by_keyset_and_says_which_index_served_it(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed_invoices(seed(db, clock))
    expected = [row.id for row in Operations(db).browse(Filter("gateways"), limit=100).rows]
    seen: list[str] = []
    target: str | None = "/ops/documents?c=gateways&limit=3"
    while target is not None:
        shown = read(page.get(target))
        seen += documents_of(shown)
        assert (
            "orchestrator_claim_until (phase, claimPriority desc, lockedUntil, updatedAt, _id)"
            in shown.text_of("served")
        )
        target = shown.links.get("Next page →")
        if target is not None:
            assert parse_qs(urlsplit(target).query)["limit"] == ["3"]
    assert seen == expected and len(seen) == 7
    by_key = read(page.get("/ops/documents", params={"c": "invoices", "key": "INV-1004"}))
    assert [row[1] for row in by_key.rows("documents")] == ["invoice=INV-1004"]
    assert "the index on (invoice)" in by_key.text_of("served")
    by_field = read(page.get("/ops/documents", params={"c": "invoices", "key": "invoice=INV-1"}))
    assert documents_of(by_field) == []
    errors = read(page.get("/ops/documents", params={"c": "invoices", "error": "TimeoutError"}))
    assert len(documents_of(errors)) == 3
    assert "orchestrator_errors" in errors.text_of("served")


def test_a_list_refuses_a_filter_it_cannot_serve_and_keeps_the_form(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed_invoices(seed(db, clock))
    cases = [
        ({"c": "invoices", "key": "region=eu"}, 422, "no index of 'invoices' starts with 'region'"),
        ({"c": "gateways", "key": "gw-1"}, 400, "no live replica declares a one-field unique"),
        ({"c": "invoices", "state": "gone"}, 400, "unknown lease state 'gone'"),
        ({"c": "invoices", "limit": "0"}, 400, "a page holds 1 to 500"),
        ({"c": "invoices", "after": "x"}, 400, "malformed page cursor"),
        ({"c": "nope"}, 404, "no collection 'nope'"),
    ]
    for params, status, needle in cases:
        shown = read(page.get("/ops/documents", params=params), status)
        assert needle in shown.text, (params, shown.text)
        if status != 404 and "limit" not in params and "state" not in params:
            # Refused by the filter's plan, not its form: the form stays, to change it.
            assert any(form[1] == "/ops/documents" for form in shown.forms), params
    chooser = read(page.get("/ops/documents"))
    assert [form[1] for form in chooser.forms] == ["/ops/documents"]


def test_a_document_is_found_by_its_business_key(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    ids = seed_invoices(seed(db, clock))
    shown = read(page.get("/ops/document", params={"c": "invoices", "id": "INV-1003"}))
    assert shown.text_of("key") == "invoice=INV-1003"
    assert ids[2] in shown.text_of("ref")  # its ObjectId, exactly
    read(page.get("/ops/document", params={"c": "invoices", "id": "INV-9999"}), 404)


def test_a_documents_history_reads_as_a_timeline_latest_first(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seeded = seed(db, clock)
    stuck = read(page.get("/ops/document", params={"c": "gateways", "id": "gw-stuck"}))
    assert "No history" in stuck.text_of("history")
    seeded.orch.run_once()  # takes pod-9's expired lease over, and runs the step
    taken = read(page.get("/ops/document", params={"c": "gateways", "id": "gw-stuck"}))
    assert taken.text_of("history").startswith(f"{seeded.orch.clock.now():%Y-%m-%d %H:%M:%S} UTC")
    assert "advanced: pod-1 ran Provisioning for 0 s → Ready" in taken.text_of("history")
    assert "took over from pod-9" in taken.text_of("history")

    target, fields = confirm_form(page, "retry", "gw-broken")
    fields["reason"] = "CA certificate renewed"
    read(page.post(target, data=fields))
    broken = read(page.get("/ops/document", params={"c": "gateways", "id": "gw-broken"}))
    history = broken.text_of("history")
    retried, failed = history.index("retry by web testclient"), history.index("failed: pod-1")
    assert retried < failed  # the latest first
    assert "Failed → Provisioning" in history
    assert "why: “CA certificate renewed”" in history
    assert "RuntimeError: certificate authority unreachable" in history
    assert "Traceback (most recent call last)" in history  # inside its <details>
    assert (
        "<details><summary>traceback</summary><pre>Traceback"
        in page.get("/ops/document", params={"c": "gateways", "id": "gw-broken"}).text
    )


def confirm_form(page: TestClient, action: str, doc_id: str) -> tuple[str, dict[str, str]]:
    shown = read(page.get("/ops/confirm", params={"action": action, "c": "gateways", "id": doc_id}))
    [(_, target, fields)] = [form for form in shown.forms if form[0] == "post"]
    return target, fields


def test_lease_badges_say_what_the_lease_fields_alone_do_not(
    db: Database[Any], clock: FakeClock, page: TestClient
) -> None:
    seed(db, clock)
    db.gateways.insert_one({"_id": "gw-orphan", "region": "eu"})
    db.gateways.insert_one({"_id": "gw-new", "phase": "Provisioning"})
    expected = {
        "gw-held": ("leased", "held by pod-2's live lease until"),
        "gw-stuck": ("overdue", "pod-9's lease ran out unreleased"),
        "gw-waiting": ("waiting", "or a later start set at submit, until"),
        "gw-new": ("free", "a handler of its phase may claim it now"),
        "gw-1": ("free", "no live replica handles phase Ready: it rests there"),
        "gw-broken": ("failed", "provision gave up; it stays here until retried"),
        "gw-orphan": ("no phase", "it has no phase"),
    }
    for doc_id, (badge, note) in expected.items():
        shown = read(page.get("/ops/document", params={"c": "gateways", "id": doc_id}))
        assert shown.text_of("lease-state") == badge, doc_id
        assert note in shown.text_of("lease-note"), (doc_id, shown.text_of("lease-note"))
        offered = {name for name in ("Unlock…", "Retry…", "Cancel…") if name in shown.links}
        # Unlock only where a lease or a wait is there to drop.
        assert ("Unlock…" in offered) == (badge in ("leased", "overdue", "waiting")), doc_id
        moving = badge in ("leased", "overdue", "waiting") or doc_id == "gw-new"
        assert (
            'http-equiv="refresh"'
            in page.get("/ops/document", params={"c": "gateways", "id": doc_id}).text
        ) == moving, doc_id
    # A mark left where the handler does not leave documents (the application moved the
    # document on) keeps nothing from claiming it: not shown as failed.
    db.gateways.update_one({"_id": "gw-broken"}, {"$set": {"phase": "Provisioning"}})
    moved = read(page.get("/ops/document", params={"c": "gateways", "id": "gw-broken"}))
    assert moved.text_of("lease-state") == "free"


def test_lists_of_uuid_ids_page_on_and_an_unplaced_value_is_a_400() -> None:
    """A client decoding UUIDs (``uuidRepresentation="standard"``): the page and the API
    follow ``next`` past the first page (before: a 500). A sort value of a type BSON's
    order does not place (a custom codec's) refuses the cursor in one line, a 400."""
    standard = CodecOptions(uuid_representation=STANDARD)
    db = memory_database(codec_options=standard)
    db.jobs.insert_many(
        [{"_id": Binary.from_uuid(uuid.UUID(int=n)), "phase": "A"} for n in range(5)]
    )
    with mounted(db) as page:
        listed = page.get("/ops/api/documents?c=jobs&limit=2").json()
        seen = [row["id"] for row in listed["documents"]]
        while listed["next"]:
            shown = read(page.get(f"/ops/documents?c=jobs&limit=2&after={listed['next']}"))
            listed = page.get(f"/ops/api/documents?c=jobs&limit=2&after={listed['next']}").json()
            assert documents_of(shown) == [row["id"] for row in listed["documents"]]
            seen += documents_of(shown)
    assert seen == [str(uuid.UUID(int=n)) for n in range(5)]
    custom = standard.with_options(type_registry=TypeRegistry([AsFraction()]))
    odd = memory_database(codec_options=custom)
    odd.jobs.insert_many([{"_id": Binary(bytes([n]), 128), "phase": "A"} for n in range(3)])
    with mounted(odd) as page:
        refused = page.get("/ops/api/documents?c=jobs&limit=1")
        assert refused.status_code == 400
        assert "_id is a Fraction, a value BSON's sort order" in refused.json()["error"]
        assert page.get("/ops/documents?c=jobs&limit=1").status_code == 400


class AsFraction(TypeDecoder):
    """A codec of the application's: binary data of a user-defined subtype (128) read as
    a ``Fraction``."""

    bson_type = Binary

    def transform_bson(self, value: Any) -> Any:
        return Fraction(value[0], 7) if value.subtype == 128 else value
