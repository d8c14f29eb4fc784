"""The API server as replicas: several apps on one database, and one real server process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pymongo.database import Database

from examples.api_server import create_app
from orchestrator.testing import FakeClock

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def apps(db: Database[Any], clock: FakeClock) -> Iterator[list[tuple[FastAPI, TestClient]]]:
    """Three replicas of the app sharing ``db``; their lifespans start the orchestrators."""
    with ExitStack() as stack:
        made = []
        for n in range(3):
            app = create_app(
                db,
                replica_id=f"api-{n}",
                clock=clock,
                tick=1.0,
                lock_timeout=30,
                clock_refresh=1e6,
                cert_delay=5.0,
            )
            made.append((app, stack.enter_context(TestClient(app))))
        yield made


def drive(
    apps: list[tuple[FastAPI, TestClient]], clock: FakeClock, done: Callable[[], bool]
) -> None:
    for _ in range(200):
        if done():
            return
        for app, _client in apps:
            app.state.workflow.orch.run_once()
        clock.advance(1.0)
    raise AssertionError("not done after 200 ticks")


def test_replicas_serve_one_gateway_through_its_whole_life(
    apps: list[tuple[FastAPI, TestClient]], clock: FakeClock
) -> None:
    (_, first), (_, second), (_, third) = apps
    created = first.post("/gateways", json={"name": "shop", "customDomain": "shop.example.com"})
    assert created.status_code == 202
    assert created.json()["phase"] == "Creating"

    drive(apps, clock, lambda: second.get("/gateways/shop").json()["phase"] == "Created")
    view = third.get("/gateways/shop").json()
    assert view["state"] == "Running"
    assert view["attempts"] == 0
    assert view["lastError"] is None
    assert view["lastReplica"] in {"api-0", "api-1", "api-2"}
    phases = second.get("/phases").json()["phases"]
    assert phases["gateways"] == {"Created": 1}
    assert phases["runtimeDomains"] == {"Created": 1}

    deleting = third.delete("/gateways/shop")
    assert deleting.status_code == 202
    assert deleting.json()["state"] == "Deleted"
    drive(apps, clock, lambda: first.get("/gateways/shop").json()["archived"])
    gone = second.get("/gateways/shop").json()
    assert gone["phase"] == "Deleted"
    assert gone["removed"][-1] == "databases"
    assert third.delete("/gateways/shop").status_code == 202  # deleting twice is harmless
    assert "gateways" not in second.get("/phases").json()["phases"]
    assert apps[0][0].state.workflow.platform.repeats() == 0


def test_concurrent_creates_of_one_name_on_three_replicas_make_one_gateway(
    apps: list[tuple[FastAPI, TestClient]], db: Database[Any]
) -> None:
    barrier = threading.Barrier(len(apps))
    codes: list[int] = []
    ids: set[str] = set()
    lock = threading.Lock()

    def post(client: TestClient) -> None:
        barrier.wait()
        response = client.post("/gateways", json={"name": "shop"})
        with lock:
            codes.append(response.status_code)
            ids.add(response.json()["name"])

    threads = [threading.Thread(target=post, args=(client,)) for _, client in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [202, 202, 202]
    assert db.gateways.count_documents({"name": "shop"}) == 1


def test_bad_requests_get_clear_answers(apps: list[tuple[FastAPI, TestClient]]) -> None:
    _, client = apps[0]
    assert client.post("/gateways", json={"name": "Not A Name"}).status_code == 422
    assert client.post("/gateways", json={"name": "a", "customDomain": "x"}).status_code == 422
    assert client.post("/gateways", json={"name": "a", "extra": 1}).status_code == 422
    assert client.get("/gateways/nope").status_code == 404
    assert client.delete("/gateways/nope").status_code == 404
    # A custom domain waits for its certificate (cert_delay on a clock that stands still),
    # so the background replicas cannot finish the deletion before the last request.
    mine = {"name": "a", "customDomain": "a.example.com"}
    assert client.post("/gateways", json=mine).status_code == 202
    clash = client.post("/gateways", json={"name": "a", "customDomain": "b.example.com"})
    assert clash.status_code == 409
    client.delete("/gateways/a")
    assert client.post("/gateways", json=mine).status_code == 409  # being deleted


def test_the_lifespan_stops_the_orchestrator(db: Database[Any], clock: FakeClock) -> None:
    app = create_app(db, replica_id="api-0", clock=clock, clock_refresh=1e6)
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok", "replica": "api-0"}
    # Stopped: a tick claims nothing, the gateway waits for a running replica.
    app.state.workflow.platform.create_gateway("shop")
    assert app.state.workflow.orch.run_once().get("claimed", 0) == 0
    assert "provisioned" not in db.gateways.find_one({"name": "shop"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(check: Callable[[], bool], deadline: float, what: str) -> None:
    """Poll ``check`` until it holds or the deadline passes (a bound, not a sleep)."""
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_real_server_process_provisions_and_deletes_over_http() -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "MONGODB_URI"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.api_server",
            "--memory",
            "--port",
            str(port),
            "--tick",
            "0.05",
            "--lock-timeout",
            "2",
            "--cert-delay",
            "0.3",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=5) as http:
            deadline = time.monotonic() + 30
            _until(lambda: http.get("/healthz").status_code == 200, deadline, "the server")
            created = http.post("/gateways", json={"name": "shop", "customDomain": "shop.dev.io"})
            assert created.status_code == 202

            _until(
                lambda: http.get("/gateways/shop").json()["phase"] == "Created",
                deadline,
                "Created",
            )
            assert http.delete("/gateways/shop").status_code == 202
            _until(lambda: http.get("/gateways/shop").json()["archived"], deadline, "archived")
            view = http.get("/gateways/shop").json()
            assert view["phase"] == "Deleted"
            assert view["removed"] == [
                "cronTriggers",
                "cloudFunctions",
                "stages",
                "runtimeDomains",
                "databases",
            ]
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=15)
    # uvicorn shuts down gracefully, then re-raises SIGTERM as its exit status.
    assert server.returncode in {0, -signal.SIGTERM}, output.decode()[-2000:]
    assert b"Application shutdown complete" in output
    assert b"orchestrator stopped: 0 unstarted lease(s) handed back, 0 step(s)" in output
