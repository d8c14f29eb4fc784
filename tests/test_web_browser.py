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

from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.testing.memory import MemoryDatabase
from orchestrator.web import operator_app
from orchestrator.web.serve import listen, url_of
from tests.conftest import MONGODB_URI
from tests.operator_page import seed

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
            app = Starlette(routes=[Mount("/ops", operator_app(page_db, refresh=refresh))])
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
        expect(failed.nth(6)).to_have_text("1")  # failed
        provisioning = counts.locator("tr[data-phase='Provisioning'] td")
        expect(provisioning.nth(3)).to_have_text("1")  # leased now (pod-2)
        expect(provisioning.nth(4)).to_have_text("1")  # overdue (pod-9 died)
        expect(provisioning.nth(5)).to_have_text("1")  # waiting out a relock
        expect(counts.locator("tr[data-phase='Ready'] td").nth(2)).to_have_text("3")
        expect(page.locator("#errors")).to_contain_text("certificate authority unreachable")
        # The live replicas, the step each runs, and the setting they disagree on.
        expect(page.locator("#replicas tbody tr")).to_have_count(3)
        expect(page.locator("#replicas tr[data-replica='pod-2']")).to_contain_text("gw-held")
        expect(page.get_by_role("alert")).to_have_text(
            "replicas disagree on lock_timeout: 30s (pod-1, pod-2); 300s (pod-3)"
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
        page.get_by_role("button", name="Retry", exact=True).click()
        expect(page.get_by_role("status")).to_contain_text("Retried")
        expect(phase).to_have_text("Provisioning")
        expect(page.locator("#lease [data-field='attempts']")).to_have_text("0")

        # 4. The outage is over; a replica runs the step (and takes over pod-9's overdue
        # lease). The page, refreshing itself, shows the document moved on.
        seeded.outage["on"] = False
        assert seeded.orch.run_once().get("advanced") == 2
        expect(phase).to_have_text("Ready")
        page.get_by_role("link", name="← all collections").click()
        expect(counts.locator("tr[data-phase='Ready'] td").nth(2)).to_have_text("5")
        expect(counts.locator("tr[data-phase='Failed']")).to_have_count(0)
        page.close()
