"""The status report computed at most once per period for every reader of a process: the
cache on its own (async and sync), the operator's page reading through it, and an
application that mounts the page and serves metrics computing one aggregation per period
for both; and the metrics saying what is paused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from orchestrator import ConfigError
from orchestrator.monitoring.prometheus import PrometheusListener, StatusCollector
from orchestrator.operations import (
    AsyncOperations,
    AsyncStatusCache,
    Operations,
    Scope,
    Status,
    StatusCache,
)
from orchestrator.testing import FakeClock, async_view, memory_database
from orchestrator.web import operator_app
from tests.operator_page import read, seed


class Counting(AsyncOperations):
    """Operations that count their status reports, and fail the next one when told."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports = 0
        self.fail_next = False

    async def status(self, collections: Any = None, *, errors: int = 5) -> Status:
        self.reports += 1
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the database went away")
        await asyncio.sleep(0)  # readers arriving meanwhile wait for this one
        return await super().status(collections, errors=errors)


def test_a_report_is_computed_once_per_period_for_every_reader(clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    db.gateways.insert_one({"_id": "gw-1", "phase": "Ready"})
    operations = Counting(async_view(db))
    cache = AsyncStatusCache(operations, max_age=5, errors=3, monotonic=clock.monotonic)

    async def main() -> None:
        burst = await asyncio.gather(*(cache.status() for _ in range(5)))
        assert operations.reports == cache.computations == 1
        assert all(status is burst[0] for status in burst)
        clock.advance(4.9)
        assert await cache.status() is burst[0]
        clock.advance(0.1)
        assert await cache.status() is not burst[0]
        assert cache.computations == 2
        cache.invalidate()  # an action changed what it says
        await cache.status()
        assert cache.computations == 3
        operations.fail_next = True
        cache.invalidate()
        with pytest.raises(RuntimeError, match="went away"):
            await cache.status()
        await cache.status()  # a failure is not kept: the next reader tries again
        assert operations.reports == 5 and cache.computations == 4

    asyncio.run(main())


def test_the_sync_cache_is_the_same(clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    db.gateways.insert_one({"_id": "gw-1", "phase": "Ready"})
    cache = StatusCache(Operations(db), max_age=5, monotonic=clock.monotonic)
    first = cache.status()
    assert cache.status() is first and cache.computations == 1
    clock.advance(5)
    assert cache.status().counts() == {"gateways": {"Ready": 1}}
    assert cache.computations == 2


@pytest.mark.parametrize("options", [{"max_age": -1}, {"max_age": float("inf")}, {"errors": -1}])
def test_a_cache_checks_its_settings(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        StatusCache(Operations(memory_database()), **options)


def test_the_page_reads_the_report_through_its_cache(clock: FakeClock) -> None:
    """Every page, tab and API call within a period costs one aggregation; an action on
    the page makes the next read compute it anew, so the page shows what it did."""
    db = memory_database(clock=clock)
    seed(db, clock)
    operations = Counting(async_view(db))
    cache = AsyncStatusCache(operations, max_age=5, monotonic=clock.monotonic)
    app = FastAPI()
    app.mount("/ops", operator_app(async_view(db), status=cache, read_only=False))
    with TestClient(app) as page:
        for url in (
            "/ops/",
            "/ops/",
            "/ops/documents?c=gateways",
            "/ops/document?c=gateways&id=gw-1",
            "/ops/api/status",
        ):
            assert page.get(url).status_code == 200, url
        assert operations.reports == 1
        shown = read(page.get("/ops/confirm?action=unlock&c=gateways&id=gw-held"))
        [(_, target, fields)] = [form for form in shown.forms if form[0] == "post"]
        read(page.post(target, data=fields))  # then the document's page, read anew
        assert operations.reports == 2
        clock.advance(5)
        page.get("/ops/")
        assert operations.reports == 3


def test_the_page_and_the_metrics_share_one_aggregation_per_period(clock: FakeClock) -> None:
    """An application that mounts the page and serves metrics gives both the same cache:
    scrapes and page views within a period compute the report once."""
    db = memory_database(clock=clock)
    seed(db, clock)
    operations = Counting(async_view(db))
    cache = AsyncStatusCache(operations, max_age=5, monotonic=clock.monotonic)
    app = FastAPI()
    app.mount("/ops", operator_app(async_view(db), status=cache))
    registry = CollectorRegistry()

    async def listen() -> PrometheusListener:  # on the loop that owns the client
        return PrometheusListener(registry, status=cache, status_max_age=0, status_timeout=30)

    with TestClient(app) as page:
        page.portal.call(listen)
        labels = {"collection": "gateways", "phase": "Provisioning"}
        assert registry.get_sample_value("orchestrator_documents", labels) == 3
        assert page.get("/ops/").status_code == 200
        assert registry.get_sample_value("orchestrator_documents_leased", labels) == 1
        assert operations.reports == 1
        clock.advance(5)
        registry.get_sample_value("orchestrator_documents", labels)
        page.get("/ops/")
        assert operations.reports == 2


def test_a_cache_names_its_own_collections() -> None:
    cache = StatusCache(Operations(memory_database()), collections=["jobs"])
    with pytest.raises(ConfigError, match="give the collections to the cache"):
        StatusCollector(cache, collections=["other"])


def test_the_metrics_say_what_is_paused(clock: FakeClock) -> None:
    db = memory_database(clock=clock)
    db.gateways.insert_one({"_id": "gw-1", "phase": "Ready"})
    operations = Operations(db)
    operations.pause(Scope("gateways", "Provisioning"), force=True, by="ops", why="CA maintenance")
    operations.pause(Scope("invoices", handler="billing:charge"), force=True, by="ops")
    registry = CollectorRegistry()
    cache = StatusCache(operations, max_age=0)
    registry.register(StatusCollector(cache, max_age=0, timeout=30))
    paused = {
        (
            sample.labels["collection"],
            sample.labels["phase"],
            sample.labels["handler"],
        ): sample.value
        for family in registry.collect()
        if family.name == "orchestrator_paused"
        for sample in family.samples
    }
    assert paused == {
        ("gateways", "Provisioning", ""): 1.0,
        ("invoices", "", "billing:charge"): 1.0,
    }
    operations.resume(Scope("gateways", "Provisioning"))
    assert (
        registry.get_sample_value(
            "orchestrator_paused",
            {"collection": "gateways", "phase": "Provisioning", "handler": ""},
        )
        is None
    )
