"""The API server as replicas: several apps on one database, and real server processes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from examples.api_server import LOGGERS, configure_logging, create_app
from orchestrator.core.names import REPLICAS_COLLECTION
from orchestrator.testing import FakeClock
from tests.worker_process import read_until

ROOT = Path(__file__).resolve().parent.parent

Replicas = list[tuple[FastAPI, httpx.AsyncClient]]


@pytest.fixture(autouse=True)
def logger_levels() -> Iterator[None]:
    """The app's lifespan sets its loggers' levels (``configure_logging``): put them back,
    so no other test runs with them."""
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(lg.level, list(lg.handlers)) for lg in loggers]
    yield
    for lg, (level, handlers) in zip(loggers, saved, strict=True):
        lg.setLevel(level)
        lg.handlers[:] = handlers


def test_logging_is_configured_once_and_only_where_the_application_did_not() -> None:
    """As under uvicorn (no handler on the root logger), the orchestrator's logger gets one
    handler at INFO however many apps start; where the root logger has a handler (the
    application configured logging), no handler is added, so no line shows twice."""
    root, library = logging.getLogger(), logging.getLogger("orchestrator")
    saved = list(root.handlers)
    try:
        root.handlers[:] = []
        library.handlers[:] = []
        library.setLevel(logging.NOTSET)
        configure_logging()
        configure_logging()  # a second app in the process
        assert len(library.handlers) == 1
        assert library.level == logging.INFO

        root.handlers[:] = [logging.NullHandler()]
        library.handlers[:] = []
        library.setLevel(logging.WARNING)  # the application's choice
        configure_logging()
        assert library.handlers == []
        assert library.level == logging.WARNING
    finally:
        root.handlers[:] = saved


def replica_app(adb: AsyncDatabase[Any], clock: FakeClock, replica_id: str) -> FastAPI:
    return create_app(
        adb,
        replica_id=replica_id,
        clock=clock,
        tick=1.0,
        lock_timeout=30,
        clock_refresh=1e6,
        cert_delay=5.0,
    )


async def serve(stack: AsyncExitStack, app: FastAPI) -> httpx.AsyncClient:
    """The app's lifespan entered (its orchestrator started on this test's loop), and a
    client that calls it in process."""
    await stack.enter_async_context(app.router.lifespan_context(app))
    transport = httpx.ASGITransport(app=app)
    return await stack.enter_async_context(
        httpx.AsyncClient(transport=transport, base_url="http://api")
    )


@pytest.fixture
async def apps(adb: AsyncDatabase[Any], clock: FakeClock) -> AsyncIterator[Replicas]:
    """Three replicas of the app sharing ``adb``; their lifespans start the orchestrators."""
    async with AsyncExitStack() as stack:
        made = []
        for n in range(3):
            app = replica_app(adb, clock, f"api-{n}")
            made.append((app, await serve(stack, app)))
        yield made


async def drive(apps: Replicas, clock: FakeClock, done: Any) -> None:
    for _ in range(200):
        if await done():
            return
        for app, _client in apps:
            await app.state.workflow.orch.run_once()
        clock.advance(1.0)
    raise AssertionError("not done after 200 ticks")


@pytest.mark.anyio
async def test_replicas_serve_one_gateway_through_its_whole_life(
    apps: Replicas, clock: FakeClock
) -> None:
    (_, first), (_, second), (_, third) = apps
    created = await first.post(
        "/gateways", json={"name": "shop", "customDomain": "shop.example.com"}
    )
    assert created.status_code == 202
    assert created.json()["phase"] == "Creating"

    async def created_now() -> bool:
        return bool((await second.get("/gateways/shop")).json()["phase"] == "Created")

    await drive(apps, clock, created_now)
    view = (await third.get("/gateways/shop")).json()
    assert view["state"] == "Running"
    assert view["attempts"] == 0
    assert view["lastError"] is None
    assert view["lastReplica"] in {"api-0", "api-1", "api-2"}
    phases = (await second.get("/phases")).json()["phases"]
    assert phases["gateways"] == {"Created": 1}
    assert phases["runtimeDomains"] == {"Created": 1}

    deleting = await third.delete("/gateways/shop")
    assert deleting.status_code == 202
    assert deleting.json()["state"] == "Deleted"

    async def archived() -> bool:
        return bool((await first.get("/gateways/shop")).json()["archived"])

    await drive(apps, clock, archived)
    gone = (await second.get("/gateways/shop")).json()
    assert gone["phase"] == "Deleted"
    assert gone["children"] == CREATE_ORDER
    assert (await third.delete("/gateways/shop")).status_code == 202  # twice is harmless
    assert "gateways" not in (await second.get("/phases")).json()["phases"]
    assert await apps[0][0].state.workflow.platform.repeats() == 0


@pytest.mark.anyio
async def test_concurrent_creates_of_one_name_on_three_replicas_make_one_gateway(
    apps: Replicas, db: Database[Any]
) -> None:
    responses = await asyncio.gather(
        *(client.post("/gateways", json={"name": "shop"}) for _, client in apps)
    )
    assert [r.status_code for r in responses] == [202, 202, 202]
    assert {r.json()["name"] for r in responses} == {"shop"}
    assert db.gateways.count_documents({"name": "shop"}) == 1


@pytest.mark.anyio
async def test_bad_requests_get_clear_answers(apps: Replicas) -> None:
    _, client = apps[0]
    assert (await client.post("/gateways", json={"name": "Not A Name"})).status_code == 422
    bad_domain = {"name": "a", "customDomain": "x"}
    assert (await client.post("/gateways", json=bad_domain)).status_code == 422
    assert (await client.post("/gateways", json={"name": "a", "extra": 1})).status_code == 422
    assert (await client.get("/gateways/nope")).status_code == 404
    assert (await client.delete("/gateways/nope")).status_code == 404
    # A custom domain waits for its certificate (cert_delay on a clock that stands still),
    # so the background replicas cannot finish the deletion before the last request.
    mine = {"name": "a", "customDomain": "a.example.com"}
    assert (await client.post("/gateways", json=mine)).status_code == 202
    clash = await client.post("/gateways", json={"name": "a", "customDomain": "b.example.com"})
    assert clash.status_code == 409
    await client.delete("/gateways/a")
    assert (await client.post("/gateways", json=mine)).status_code == 409  # being deleted


@pytest.mark.anyio
async def test_the_lifespan_stops_the_orchestrator(
    adb: AsyncDatabase[Any], db: Database[Any], clock: FakeClock
) -> None:
    app = replica_app(adb, clock, "api-0")
    async with AsyncExitStack() as stack:
        client = await serve(stack, app)
        assert (await client.get("/healthz")).json() == {"status": "ok", "replica": "api-0"}
    # Stopped: no longer listed as a live replica, and its timer is gone; a tick run by
    # hand still runs (as on a replica never started).
    assert db[REPLICAS_COLLECTION].count_documents({"_id": "api-0"}) == 0
    await app.state.workflow.platform.create_gateway("shop")
    assert (await app.state.workflow.orch.run_once()).get("claimed", 0) >= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CREATE_ORDER = ["runtimeDomains", "databases", "stages", "cloudFunctions", "cronTriggers"]


@contextmanager
def server_process(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``python ARGS`` from the repository, on the in-memory store (no MONGODB_URI), its
    stderr with its stdout; killed on the way out if the test left it running."""
    env = {k: v for k, v in os.environ.items() if k != "MONGODB_URI"}
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def create_then_delete(port: int, body: dict[str, Any], server: subprocess.Popen[str]) -> str:
    """Create a gateway over HTTP and ask for its deletion at once (it is deleted once
    Created); return the server's output up to the log line of its archiving, the last
    side effect of its life."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        created = http.post("/gateways", json=body)
        assert created.status_code == 202, created.text
        assert created.json()["phase"] == "Creating"
        assert http.delete(f"/gateways/{body['name']}").status_code == 202
        output = "".join(read_until(server, ":archive done by"))
        view = http.get(f"/gateways/{body['name']}").json()
    assert view["archived"] is True
    assert view["phase"] == "Deleted"
    assert view["children"] == CREATE_ORDER
    return output


def stop(server: subprocess.Popen[str]) -> str:
    """SIGTERM, as a deployment stops a pod; the rest of the server's output."""
    server.send_signal(signal.SIGTERM)
    rest, _ = server.communicate(timeout=30)  # a bound on a hang, not a measured time
    # uvicorn shuts down gracefully, then re-raises SIGTERM as its exit status.
    assert server.returncode in {0, -signal.SIGTERM}, rest[-2000:]
    return rest


STOPPED = "orchestrator stopped: 0 unstarted lease(s) handed back, 0 step(s) still running"


def test_uvicorn_runs_the_module_level_app_with_the_orchestrators_log_lines() -> None:
    """``uvicorn orchestrator.demo.api_server:app``, the form FastAPI users type, on the
    packaged path an installed ``api`` extra runs: the app made at import opens its
    database when it starts (here, no MONGODB_URI: in memory), the orchestrator's INFO
    lines appear beside uvicorn's, each once."""
    port = _free_port()
    with server_process(
        "-m", "uvicorn", "orchestrator.demo.api_server:app", "--port", str(port)
    ) as server:
        startup = "".join(read_until(server, "Uvicorn running on"))
        progress = create_then_delete(port, {"name": "shop"}, server)
        rest = stop(server)
    output = startup + progress + rest
    assert "MONGODB_URI is not set: in-memory store" in startup
    assert output.count("INFO orchestrator: orchestrator started") == 1, output
    assert output.count(f"INFO orchestrator: {STOPPED}") == 1, output
    assert "/cronTriggers-1:create done by" in progress  # the workflow's own lines
    assert "Application shutdown complete" in rest
    assert "Traceback" not in output


def test_a_server_started_by_its_main_provisions_and_deletes_over_http() -> None:
    port = _free_port()
    argv = ["--memory", "--port", str(port), "--tick", "0.05", "--lock-timeout", "2"]
    with server_process("-m", "examples.api_server", *argv, "--cert-delay", "0.3") as server:
        startup = "".join(read_until(server, "Uvicorn running on"))
        body = {"name": "shop", "customDomain": "shop.dev.io"}
        progress = create_then_delete(port, body, server)
        rest = stop(server)
    output = startup + progress + rest
    assert "certificate requested for shop.dev.io" in progress
    assert output.count(STOPPED) == 1, output
    assert "Traceback" not in output
