"""One default database name: every tool, example and document names the same one, so a
worker, the API server, the demo and ``orchestrator status`` find each other's documents."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from pymongo import AsyncMongoClient, MongoClient

from examples import api_server, quickstart
from orchestrator import DEFAULT_DATABASE
from orchestrator.cli import commands
from orchestrator.demo.run import DemoOptions
from orchestrator.demo.workflows import gateway
from orchestrator.testing import async_memory_database, memory_database

ROOT = Path(__file__).resolve().parent.parent
NO_SERVER = "mongodb://127.0.0.1:1/"
"""A URI without a database: the tools' own default applies (no connection is made)."""


@pytest.mark.pure
def test_the_default_is_one_plain_name() -> None:
    assert re.fullmatch(r"[a-z][a-z0-9_]*", DEFAULT_DATABASE)


def test_the_stores_and_the_cli_default_to_it() -> None:
    assert memory_database().name == DEFAULT_DATABASE
    assert async_memory_database().name == DEFAULT_DATABASE
    assert DemoOptions().database == DEFAULT_DATABASE
    defaults = {
        name: {p.name: p for p in command.params}["db"]
        for name, command in commands.main.commands.items()
        if "db" in {p.name for p in command.params}
    }
    operators = {"status", "find", "history", "retry", "unlock", "cancel", "pause", "resume"}
    operators.add("signal")
    operators.add("schedules")
    assert set(defaults) == {"demo", "web", "audit", *operators}
    assert defaults["demo"].default == DEFAULT_DATABASE
    for name in set(defaults) - {"demo"}:  # the URI's database, else the default
        option = defaults[name]
        assert isinstance(option, click.Option)
        assert option.default is None
        assert repr(DEFAULT_DATABASE) in str(option.show_default)


@pytest.mark.anyio
@pytest.mark.parametrize("uri", [None, NO_SERVER])
async def test_the_worker_the_api_server_and_the_quickstart_default_to_it(
    uri: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if uri is None:
        monkeypatch.delenv("MONGODB_URI", raising=False)
    else:
        monkeypatch.setenv("MONGODB_URI", uri)
    worker = gateway.worker()
    db, client = api_server.database_from_env()
    example = quickstart.database()
    try:
        assert worker.db.name == DEFAULT_DATABASE
        assert db.name == DEFAULT_DATABASE
        assert example.name == DEFAULT_DATABASE
        assert (client is None) == (uri is None)
    finally:
        if client is not None:
            await client.close()
        if isinstance(worker.db.client, AsyncMongoClient):
            await worker.db.client.close()
        if isinstance(example.client, MongoClient):
            example.client.close()


def test_the_readme_the_docs_and_docker_compose_name_it() -> None:
    """Every database the README, the docs site's pages and docker compose name, in a URI's
    path or as a client's item (``client["name"]``), is the default."""
    named: list[str] = []
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "_build" not in p.parts]
    pages = [ROOT / "README.md", *docs]
    for path in [*pages, ROOT / "docker-compose.yml"]:
        text = path.read_text()
        named += re.findall(r"mongodb(?:\+srv)?://[^/\s\"']+/([A-Za-z_][\w-]*)", text)
        named += re.findall(r"Client\([^)]*\)\[\"([^\"]+)\"\]", text)
    assert named, "the README names no database: this test would prove nothing"
    assert set(named) == {DEFAULT_DATABASE}
