"""An API server that embeds the orchestrator: run as many replicas as you like.

Each replica serves requests and, in the background, runs the gateway workflow's steps;
the leases decide which replica runs which step. Requests only record what users want
(a new gateway, a desired state); the handlers do the work.

    python -m examples.api_server --port 8000            # MONGODB_URI, else in-memory
    python -m examples.api_server --memory --port 8000   # its own in-memory store
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pymongo import MongoClient
from pymongo.database import Database

from examples.gateway import build
from orchestrator import StoreError
from orchestrator.core.redact import redact
from orchestrator.testing import memory_database
from orchestrator.tools.status import collect

logger = logging.getLogger("examples.api_server")

NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
HOST = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$"


class GatewayIn(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    name: str = Field(pattern=NAME)
    custom_domain: str | None = Field(None, alias="customDomain", pattern=HOST)


class GatewayOut(BaseModel):
    name: str
    state: str | None
    phase: str
    attempts: int
    relocks: int
    last_error: dict[str, Any] | None = Field(None, serialization_alias="lastError")
    custom_domain: str | None = Field(None, serialization_alias="customDomain")
    provisioned: list[str]
    removed: list[str]
    last_replica: str | None = Field(None, serialization_alias="lastReplica")
    archived: bool


def _view(doc: dict[str, Any]) -> dict[str, Any]:
    error = doc.get("lastError")
    if isinstance(error, dict) and error.get("at") is not None:
        error = {**error, "at": str(error["at"])}
    view = GatewayOut(
        name=doc["name"],
        state=doc.get("state"),
        phase=doc.get("phase", "?"),
        attempts=doc.get("attempts", 0),
        relocks=doc.get("relocks", 0),
        last_error=error if isinstance(error, dict) else None,
        custom_domain=doc.get("customDomain"),
        provisioned=doc.get("provisioned", []),
        removed=doc.get("removed", []),
        last_replica=doc.get("lockedBy"),
        archived="archivedAt" in doc,
    )
    return view.model_dump(by_alias=True)


def database_from_env() -> Database[dict[str, Any]]:
    """``MONGODB_URI`` (its database, else "platform"); without it, an in-memory store."""
    uri = os.environ.get("MONGODB_URI")
    if not uri:
        logger.warning("MONGODB_URI is not set: in-memory store, shared with no other replica")
        return memory_database("platform")
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    logger.info("database %s", redact(uri))
    return client.get_default_database("platform")


def create_app(db: Database[dict[str, Any]] | None = None, **settings: Any) -> FastAPI:
    """The app of one replica. ``settings`` go to the workflow's ``build``: orchestrator
    settings (``tick``, ``lock_timeout``, ``clock`` ...), ``cert_delay`` and ``faults``."""
    workflow = build(db if db is not None else database_from_env(), **settings)
    orch, platform = workflow.orch, workflow.platform

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        orch.start()
        try:
            yield
        finally:
            orch.stop(timeout=10)

    app = FastAPI(title="gateways", lifespan=lifespan)
    app.state.workflow = workflow

    @app.exception_handler(StoreError)
    async def store_unavailable(request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": f"database unavailable: {exc}"}, status_code=503)

    @app.get("/healthz")
    def health() -> dict[str, str]:
        return {"status": "ok", "replica": orch.replica_id}

    @app.post("/gateways", status_code=202)
    def create_gateway(body: GatewayIn) -> dict[str, Any]:
        doc = platform.create_gateway(body.name, body.custom_domain)
        if doc.get("state") == "Deleted":
            raise HTTPException(409, f"gateway {body.name} is being deleted")
        if doc.get("customDomain") != body.custom_domain:
            raise HTTPException(409, f"gateway {body.name} exists with another custom domain")
        return _view(doc)

    @app.delete("/gateways/{name}", status_code=202)
    def delete_gateway(name: str) -> dict[str, Any]:
        platform.set_state(name, "Deleted")
        doc = platform.gateway(name)
        if doc is None:
            raise HTTPException(404, f"no gateway {name}")
        return _view(doc)

    @app.get("/gateways/{name}")
    def read_gateway(name: str) -> dict[str, Any]:
        doc = platform.gateway(name)
        if doc is None:
            raise HTTPException(404, f"no gateway {name}")
        return _view(doc)

    @app.get("/phases")
    def phases() -> dict[str, Any]:
        status = collect(platform.db, errors=0)
        return {"replica": orch.replica_id, "phases": status.counts()}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn  # noqa: PLC0415  (only the server needs it)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--memory", action="store_true", help="ignore MONGODB_URI")
    parser.add_argument("--tick", type=float, default=1.0)
    parser.add_argument("--lock-timeout", type=float, default=30.0)
    parser.add_argument("--cert-delay", type=float, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # a line per tick otherwise
    app = create_app(
        memory_database("platform") if args.memory else None,
        tick=args.tick,
        lock_timeout=args.lock_timeout,
        cert_delay=args.cert_delay,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
