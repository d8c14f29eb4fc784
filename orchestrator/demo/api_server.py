"""An API server that embeds the orchestrator: run as many replicas as you like.

Each replica serves requests and, in the background, runs the gateway workflow's steps;
the leases decide which replica runs which step. Requests only record what users want
(a new gateway, a desired state); the handlers do the work.

It is async throughout: one ``AsyncMongoClient`` serves the requests and the
``AsyncOrchestrator``, which runs on the app's event loop, started and stopped in the
lifespan; requests ``await`` the workflow's own calls.

It ships in the package, as the workflow does, so that the ``api`` extra (FastAPI and
uvicorn) runs it wherever the package is installed; ``examples/api_server.py`` is its
name in a clone:

    uvicorn orchestrator.demo.api_server:app --port 8000          # MONGODB_URI, else in-memory
    python -m orchestrator.demo.api_server --memory --port 8000   # its own in-memory store
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

# Before FastAPI's import: a missing extra is named, with the command that installs it.
from orchestrator.demo import _api_requires  # noqa: F401

# isort: split
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from orchestrator import DEFAULT_DATABASE, AsyncOperations, StoreError, redact
from orchestrator.core.trees import owns_of
from orchestrator.demo.workflows import Platform, Workflow, build
from orchestrator.testing import async_memory_database

logger = logging.getLogger(__name__)

NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
HOST = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOGGERS = ("orchestrator",)
"""The library's logger; this server's own and its workflow's are under it."""


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
    children: list[str]
    """The collections its children are in (none until its first step made them)."""
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
        children=owns_of(doc),
        last_replica=doc.get("lockedBy"),
        archived="archivedAt" in doc,
    )
    return view.model_dump(by_alias=True)


def configure_logging() -> None:
    """The orchestrator's lines at INFO beside the server's own.

    uvicorn configures only its own loggers, so without this the orchestrator's INFO
    lines (started, stopped, the workflow's side effects) go nowhere. Where the
    application already configured logging (a handler on the root logger, or on one of
    ``LOGGERS``), its choice stands and no handler is added: a line is never printed
    twice, however many apps a process starts. A level already set is kept too.
    """
    for name in LOGGERS:
        named = logging.getLogger(name)
        if named.level == logging.NOTSET:
            named.setLevel(logging.INFO)
        if named.handlers or logging.getLogger().handlers:
            continue
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        named.addHandler(handler)


def database_from_env() -> tuple[AsyncDatabase[dict[str, Any]], AsyncMongoClient[Any] | None]:
    """``MONGODB_URI``'s database (else ``DEFAULT_DATABASE``) and the client to close at
    shutdown; without it, an in-memory store (and no client). Read when the app starts,
    on its event loop, which the async client then belongs to."""
    uri = os.environ.get("MONGODB_URI")
    if not uri:
        logger.warning("MONGODB_URI is not set: in-memory store, shared with no other replica")
        return async_memory_database(), None
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    logger.info("database %s", redact(uri))
    return client.get_default_database(DEFAULT_DATABASE), client


def _workflow(request: Request) -> Workflow:
    workflow: Workflow = request.app.state.workflow
    return workflow


WorkflowDep = Annotated[Workflow, Depends(_workflow)]


def create_app(db: AsyncDatabase[dict[str, Any]] | None = None, **settings: Any) -> FastAPI:
    """The app of one replica, on ``db`` (by default ``MONGODB_URI``'s, opened when the app
    starts). ``settings`` go to the workflow's ``build``: orchestrator settings (``tick``,
    ``lock_timeout``, ``clock`` ...), ``cert_delay`` and ``faults``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging()
        client = None
        database = db
        if database is None:
            database, client = database_from_env()
        workflow = build(database, **settings)
        app.state.workflow = workflow
        try:
            await workflow.orch.start()
            try:
                yield
            finally:
                await workflow.orch.stop(timeout=10)
        finally:
            if client is not None:
                await client.close()

    app = FastAPI(title="gateways", lifespan=lifespan)

    @app.exception_handler(StoreError)
    async def store_unavailable(request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": f"database unavailable: {exc}"}, status_code=503)

    @app.get("/healthz")
    async def health(workflow: WorkflowDep) -> dict[str, str]:
        return {"status": "ok", "replica": workflow.orch.replica_id}

    @app.post("/gateways", status_code=202)
    async def create_gateway(body: GatewayIn, workflow: WorkflowDep) -> dict[str, Any]:
        doc = await workflow.platform.create_gateway(body.name, body.custom_domain)
        if doc.get("state") == "Deleted":
            raise HTTPException(409, f"gateway {body.name} is being deleted")
        if doc.get("customDomain") != body.custom_domain:
            raise HTTPException(409, f"gateway {body.name} exists with another custom domain")
        return _view(doc)

    @app.delete("/gateways/{name}", status_code=202)
    async def delete_gateway(name: str, workflow: WorkflowDep) -> dict[str, Any]:
        await workflow.platform.set_state(name, "Deleted")
        return await _existing(workflow.platform, name)

    @app.get("/gateways/{name}")
    async def read_gateway(name: str, workflow: WorkflowDep) -> dict[str, Any]:
        return await _existing(workflow.platform, name)

    @app.get("/phases")
    async def phases(workflow: WorkflowDep) -> dict[str, Any]:
        status = await AsyncOperations(workflow.platform.db).status(errors=0)
        return {"replica": workflow.orch.replica_id, "phases": status.counts()}

    return app


async def _existing(platform: Platform, name: str) -> dict[str, Any]:
    doc = await platform.gateway(name)
    if doc is None:
        raise HTTPException(404, f"no gateway {name}")
    return _view(doc)


app = create_app()
"""For ``uvicorn orchestrator.demo.api_server:app``: nothing is opened until the app starts."""


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
    server_app = create_app(
        async_memory_database() if args.memory else None,
        tick=args.tick,
        lock_timeout=args.lock_timeout,
        cert_delay=args.cert_delay,
    )
    uvicorn.run(server_app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
