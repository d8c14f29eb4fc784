"""The operator's page in a real browser, used as a person would use it.

Debian's ``chromium`` (``/usr/bin/chromium``, installed by ``.ci/run``) driven by
Playwright for Python; Playwright's own browser download is never used. The page is
served by uvicorn in a thread, mounted at ``/ops`` as an application mounts it, over the
in-memory database (and a real server when ``MONGODB_URI`` is set). A replica runs in
the test's thread on the fake clock; the test waits on what the page shows, never sleeps.

Screenshots for the docs are taken by this test when asked:
``ORCHESTRATOR_SCREENSHOTS=docs/ uv run pytest tests/test_web_browser.py``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright
from pymongo import AsyncMongoClient, MongoClient
from pymongo.database import Database
from starlette.applications import Starlette
from starlette.routing import Mount

from orchestrator import Orchestrator
from orchestrator.operations import Action, Filter, LeaseState, Operations
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.memory import MemoryDatabase
from orchestrator.web import operator_app
from orchestrator.web.serve import listen, url_of
from tests.conftest import MONGODB_URI
from tests.operator_page import seed, seed_invoices

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = os.environ.get("ORCHESTRATOR_SCREENSHOTS")

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"Debian's chromium is not installed ({CHROMIUM}): apt-get install -y chromium "
    "(.ci/run installs it)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield launched
        launched.close()


@pytest.fixture(
    params=[
        "memory",
        pytest.param(
            "mongodb",
            marks=[
                pytest.mark.mongodb,
                pytest.mark.skipif(not MONGODB_URI, reason="MONGODB_URI is not set"),
            ],
        ),
    ]
)
def database(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[Database[Any]]:
    if request.param == "memory":
        yield memory_database(clock=clock)
        return
    client: MongoClient[Any] = MongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
    name = f"orchestrator_test_web_{os.getpid()}"
    try:
        yield client[name]
    finally:
        client.drop_database(name)
        client.close()


@contextmanager
def served(db: Database[Any], refresh: float) -> Iterator[str]:
    """The page mounted at /ops, served by uvicorn on a thread of its own (its own event
    loop, where the async client lives); its URL. The socket listens before the thread
    starts, so the browser's first request waits in its backlog rather than failing."""
    sock = listen("127.0.0.1", 0)
    url, _ = url_of(sock)
    ready = threading.Event()
    servers: list[uvicorn.Server] = []

    async def serve() -> None:
        client: AsyncMongoClient[Any] | None = None
        if not isinstance(db, MemoryDatabase):
            client = AsyncMongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
            page_db: Any = client[db.name]
        else:
            page_db = async_view(db)
        try:
            app = Starlette(
                routes=[Mount("/ops", operator_app(page_db, refresh=refresh, read_only=False))]
            )
            server = uvicorn.Server(
                uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
            )
            servers.append(server)
            ready.set()
            await server.serve(sockets=[sock])
        finally:
            if client is not None:
                await client.close()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="operator-page")
    thread.start()
    try:
        assert ready.wait(timeout=60), "the page's server thread did not start"
        yield f"{url}ops/"
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(timeout=60)
        sock.close()


def shoot(page: Page, name: str) -> None:
    """A screenshot for the docs, only when ``ORCHESTRATOR_SCREENSHOTS`` names a directory."""
    if SCREENSHOTS:
        page.screenshot(path=str(Path(SCREENSHOTS) / name), full_page=True)


def test_an_operator_sees_the_counts_opens_a_failed_document_retries_it_and_sees_it_move_on(
    browser: Browser, database: Database[Any], clock: FakeClock
) -> None:
    seeded = seed(database, clock)
    expect.set_options(timeout=20_000)  # a shared 2-core machine: generous, never a sleep
    with served(database, refresh=1) as base:
        page = browser.new_page(viewport={"width": 1200, "height": 860})

        # 1. The counts: per collection and phase, as `orchestrator status` reports them.
        page.goto(base)
        counts = page.locator("#counts")
        failed = counts.locator("tr[data-phase='Failed'] td")
        expect(failed.nth(2)).to_have_text("1")  # documents
        expect(failed.nth(6)).to_have_text("0")  # retrying
        expect(failed.nth(7)).to_have_text("1")  # failed (given up on)
        provisioning = counts.locator("tr[data-phase='Provisioning'] td")
        expect(provisioning.nth(3)).to_have_text("1")  # leased now (pod-2)
        expect(provisioning.nth(4)).to_have_text("1")  # overdue (pod-9 died)
        expect(provisioning.nth(5)).to_have_text("1")  # waiting out a relock
        expect(counts.locator("tr[data-phase='Ready'] td").nth(2)).to_have_text("3")
        expect(page.locator("#errors")).to_contain_text("certificate authority unreachable")
        # The live replicas, the step each runs, and the setting they disagree on.
        expect(page.locator("#replicas tbody tr")).to_have_count(4)
        expect(page.locator("#replicas tr[data-replica='pod-2']")).to_contain_text("gw-held")
        expect(page.get_by_role("alert")).to_have_text(
            "replicas disagree on lock_timeout: 30s (pod-1, pod-2, pod-4); 300s (pod-3)"
        )
        shoot(page, "web-overview.png")

        # 2. The failed document, from the latest errors: its lease fields and its error.
        page.locator("#errors").get_by_role("link", name="gw-broken").click()
        heading = page.get_by_role("heading", level=1)
        expect(heading).to_have_text("gateways / gw-broken")
        phase = page.locator("#lease [data-field='phase']")
        expect(phase).to_have_text("Failed")
        expect(page.locator("#lease [data-field='attempts']")).to_have_text("1")
        expect(page.locator("#last-error")).to_contain_text("certificate authority unreachable")
        shoot(page, "web-document.png")

        # 3. Retry, with the confirmation: nothing happens until it is confirmed.
        page.get_by_role("link", name="Retry…").click()
        expect(heading).to_have_text("Retry gateways / gw-broken?")
        expect(page.get_by_label("Send it back to phase")).to_have_value("Provisioning")
        assert database.gateways.find_one({"_id": "gw-broken"})["phase"] == "Failed"
        shoot(page, "web-confirm-retry.png")
        page.get_by_label("Reason").fill("the CA is back")
        page.get_by_role("button", name="Retry", exact=True).click()
        expect(phase).to_have_text("Provisioning")
        expect(page.locator("#lease [data-field='attempts']")).to_have_text("0")
        # Its history says who retried it and why. The "Retried" banner is shown once: the
        # page reloads itself to its URL without done= (tests/test_web.py reads both).
        expect(page.locator("#history li").first).to_contain_text("the CA is back")
        expect(page.get_by_role("status")).to_have_count(0)
        assert "done=" not in page.url

        # 4. The outage is over; a replica runs the step (and takes over pod-9's overdue
        # lease). The page, refreshing itself, shows the document moved on.
        seeded.outage["on"] = False
        assert seeded.orch.run_once().get("advanced") == 2
        expect(phase).to_have_text("Ready")
        page.get_by_role("link", name="← all collections").click()
        expect(counts.locator("tr[data-phase='Ready'] td").nth(2)).to_have_text("5")
        expect(counts.locator("tr[data-phase='Failed']")).to_have_count(0)
        page.close()


def test_an_operator_finds_failed_invoices_by_key_reads_a_history_retries_them_and_pauses(
    browser: Browser, database: Database[Any], clock: FakeClock
) -> None:
    seeded = seed(database, clock)
    seed_invoices(seeded)  # INV-1003, INV-1004 and INV-1005 failed: the bank was down
    expect.set_options(timeout=20_000)
    with served(database, refresh=1) as base:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(base)
        failed = page.locator("#counts tr[data-collection='invoices'][data-phase='Failed']")
        expect(failed.locator("a[data-state='failed']")).to_have_text("3")
        expect(page.locator("#takeovers")).to_contain_text(
            "pod-9's lease on gateways/gw-stuck (Provisioning) taken over by pod-1"
        )
        expect(page.locator("#replicas tr[data-replica='pod-4']")).to_contain_text("stale")
        shoot(page, "web-overview.png")
        find_a_failed_invoice_by_its_key(page)
        read_its_history(page)
        retry_every_failed_invoice(page, database)
        # They move on: a replica charges them now that the bank answers.
        seeded.outage["bank"] = False
        assert seeded.orch.run_once().get("advanced") == 3
        page.get_by_role("link", name="Overview").click()
        paid = page.locator("#counts tr[data-collection='invoices'][data-phase='Paid'] td")
        expect(paid.nth(2)).to_have_text("6")
        expect(failed).to_have_count(0)
        pause_charging_then_resume(page, base, seeded.orch, database)
        page.close()


def find_a_failed_invoice_by_its_key(page: Page) -> None:
    """The failed count opens its list, each row with its id and business key; then
    narrowed to one business key, as typed."""
    page.locator("#counts tr[data-collection='invoices'][data-phase='Failed']").locator(
        "a[data-state='failed']"
    ).click()
    rows = page.locator("#documents tbody tr")
    expect(rows).to_have_count(3)
    for key in ("INV-1003", "INV-1004", "INV-1005"):
        expect(page.locator("#documents")).to_contain_text(f"invoice={key}")
    expect(page.locator("#served")).to_contain_text("orchestrator_errors")
    shoot(page, "web-browse.png")
    page.get_by_placeholder("INV-1003 or FIELD=VALUE").fill("INV-1004")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("invoice=INV-1004")
    expect(rows.first.locator(".state")).to_have_text("failed")
    rows.first.get_by_role("link").first.click()


def read_its_history(page: Page) -> None:
    """Its page: a badge that knows its handler gave up (no "Unlock…" offered as if that
    let it run), and its history, the failed step's traceback opened."""
    expect(page.locator("#key")).to_have_text("invoice=INV-1004")
    expect(page.locator("#lease-state")).to_have_text("failed")
    expect(page.locator("#lease-note")).to_contain_text("gave up; it stays here until retried")
    expect(page.get_by_role("link", name="Unlock…")).to_have_count(0)
    step = page.locator("#history li").first
    expect(step).to_contain_text("failed: pod-1 ran Charging")
    expect(step).to_contain_text("TimeoutError: the bank did not answer for INV-1004")
    step.locator("summary").click()
    expect(step.locator("pre")).to_contain_text("Traceback (most recent call last)")
    shoot(page, "web-history.png")


def retry_every_failed_invoice(page: Page, database: Database[Any]) -> None:
    """Every failed invoice retried, with the confirmation: a dry run, then a reason."""
    page.get_by_role("link", name="invoices, phase Failed").click()
    expect(page.locator("#documents tbody tr")).to_have_count(3)
    page.get_by_role("link", name="Retry all…").click()
    expect(page.locator("#count")).to_contain_text(
        "3 documents would be retried now, each to the phase of its last error"
    )
    expect(page.locator("#would-change tbody tr")).to_have_count(3)
    assert database.invoices.count_documents({"phase": "Failed"}) == 3  # not yet
    page.get_by_label("Reason").fill("the bank is back (INC-42)")
    shoot(page, "web-bulk-confirm.png")
    page.get_by_role("button", name="Retry them").click()
    expect(page.locator("#done")).to_contain_text("Retried 3 documents of invoices")
    assert database.invoices.count_documents({"phase": "Charging"}) == 3


def pause_charging_then_resume(
    page: Page, base: str, orch: Orchestrator, database: Database[Any]
) -> None:
    """The banner says who paused charging, why, and which replicas honour it; nothing
    new is claimed in it until it is resumed."""
    handlers = page.locator("#handlers tr[data-collection='invoices'][data-phase='Charging']")
    handlers.get_by_role("link", name="Pause phase…").click()
    page.get_by_label("Reason").fill("the bank's maintenance window")
    page.get_by_role("button", name="Pause", exact=True).click()
    banner = page.locator("#pauses")
    expect(banner).to_contain_text("invoices, phase Charging")
    expect(banner).to_contain_text("the bank's maintenance window")
    expect(banner).to_contain_text("Honoured by no live replica yet")
    orch.heartbeat()  # pod-1 reads the pauses at its heartbeat, and says so
    expect(banner).to_contain_text("Honoured by pod-1; not yet by pod-2, pod-3, pod-4")
    shoot(page, "web-pause.png")
    orch.submit("invoices", {"invoice": "INV-2001", "phase": "Charging"}, unique="invoice")
    assert orch.run_once().get("advanced") is None
    assert database.invoices.find_one({"invoice": "INV-2001"})["phase"] == "Charging"
    page.goto(f"{base}document?c=invoices&id=INV-2001")  # found by its business key
    expect(page.locator("#lease-state")).to_have_text("paused")
    # Resumed, it is charged at the replica's next heartbeat and tick.
    banner.get_by_role("link", name="Resume…").click()
    page.get_by_label("Reason").fill("maintenance over")
    page.get_by_role("button", name="Resume", exact=True).click()
    expect(banner).to_have_count(0)
    orch.heartbeat()
    assert orch.run_once().get("advanced") == 1
    assert database.invoices.find_one({"invoice": "INV-2001"})["phase"] == "Paid"


def test_the_page_fits_800_pixels_and_follows_a_dark_preference(
    browser: Browser, database: Database[Any], clock: FakeClock
) -> None:
    """Nothing overflows the page at 800 px (wide tables scroll in their own box), and a
    browser that prefers dark gets dark colours, on every kind of page."""
    seeded = seed(database, clock)
    seed_invoices(seeded)
    expect.set_options(timeout=20_000)
    with served(database, refresh=60) as base:
        page = browser.new_page(viewport={"width": 800, "height": 900}, color_scheme="dark")
        for path in (
            "",
            "documents?c=invoices&state=failed",
            "document?c=invoices&id=INV-1003",
            "bulk?action=retry&c=invoices&state=failed",
            "pause?c=invoices&phase=Charging",
            "audit",
        ):
            page.goto(base + path)
            expect(page.locator("main")).to_be_visible()
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 800, (path, width)
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(17, 23, 34)", (path, background)
            if not path:
                shoot(page, "web-dark-800.png")
        page.close()


OVERFLOWING_CELLS = """() => [...document.querySelectorAll("main td, main th")]
    .filter((cell) => cell.getBoundingClientRect().right > window.innerWidth + 1)
    .map((cell) => cell.closest("table").id + ": " + cell.textContent.trim().slice(0, 40))"""


def test_no_table_cell_is_cut_off_at_1280_pixels(
    browser: Browser, database: Database[Any], clock: FakeClock
) -> None:
    """At 1280 px every cell of every table shows whole: long ids, keys, scopes and
    reasons wrap inside their cell rather than run past the window's edge."""
    seeded = seed(database, clock)
    seed_invoices(seeded)
    operations = Operations(database)
    long_why = "the bank's gateway answered 503 for every card in the batch " * 3
    for number in ("INV-1003", "INV-1004"):
        operations.retry("invoices", operations.find("invoices", number), why=long_why)
    operations.bulk(Action.RETRY, Filter("invoices", state=LeaseState.FAILED), why=long_why)
    expect.set_options(timeout=20_000)
    with served(database, refresh=60) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for path in ("", "documents?c=invoices", "documents?c=gateways", "audit"):
            page.goto(base + path)
            expect(page.locator("main")).to_be_visible()
            assert page.evaluate(OVERFLOWING_CELLS) == [], path
        page.close()
