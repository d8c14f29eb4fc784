"""The Prometheus listener on both engines, the document counts computed on scrape at a
bounded rate, and the extra named when it is missing."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pymongo.database import Database
from rich.console import Console

from orchestrator import ConfigError
from orchestrator.cli import main as cli
from orchestrator.demo import run as demo
from orchestrator.demo.run import DemoOptions
from orchestrator.monitoring.prometheus import PrometheusListener, StatusCollector
from orchestrator.operations import PhaseCount, Status
from orchestrator.testing import FakeClock, async_memory_database
from orchestrator.testing.memory import MemoryDatabase
from tests.conftest import MakeEither
from tests.engines import hold, wait

pytestmark = pytest.mark.anyio


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_steps_failures_and_documents_are_counted(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusListener(registry, status=db, monotonic=clock.monotonic)
    # One step at a time: each step's duration is its own advance of the clock.
    replica = await replicas("pod-1", listeners=[metrics], max_attempts=1, max_concurrency=1)

    @replica.phase("jobs", "Running")
    async def run(lease: Any) -> Any:
        clock.advance(0.5)
        return await lease.advance("Done")

    @replica.phase("jobs", "Flaky")
    async def flaky(lease: Any) -> Any:
        raise ValueError("the SDK said no")

    for n in range(2):
        await replica.submit("jobs", {"_id": f"run-{n}", "phase": "Running"})
    await replica.submit("jobs", {"_id": "flaky", "phase": "Flaky"})
    clock.advance(2)
    counts = await replica.run_once()
    assert counts["advanced"] == 2 and counts["failed"] == 1

    steps = "orchestrator_steps_total"
    assert value(registry, steps, collection="jobs", phase="Running", outcome="advanced") == 2
    assert value(registry, steps, collection="jobs", phase="Flaky", outcome="failed") == 1
    assert value(registry, "orchestrator_leases_held", collection="jobs") == 0
    assert (
        value(
            registry,
            "orchestrator_attempt_failures_total",
            collection="jobs",
            phase="Flaky",
            error="ValueError",
        )
        == 1
    )
    running = {"collection": "jobs", "phase": "Running"}
    assert value(registry, "orchestrator_step_duration_seconds_count", **running) == 2
    assert value(registry, "orchestrator_step_duration_seconds_sum", **running) == 1.0
    assert value(registry, "orchestrator_claim_latency_seconds_count", **running) == 2
    latency = value(registry, "orchestrator_claim_latency_seconds_sum", **running)
    assert latency is not None and 4.0 <= latency <= 5.01  # 2 s, then 2.5 s after a 0.5 s step
    assert value(registry, "orchestrator_clock_offset_seconds", replica="pod-1") is not None

    # Computed on scrape, from the status aggregation.
    assert value(registry, "orchestrator_status_up") == 1
    assert value(registry, "orchestrator_documents", collection="jobs", phase="Done") == 2
    assert value(registry, "orchestrator_documents", collection="jobs", phase="Failed") == 1
    assert value(registry, "orchestrator_documents_failed", collection="jobs", phase="Failed") == 1
    assert value(registry, "orchestrator_documents_leased", collection="jobs", phase="Done") == 0


async def test_documents_retrying_and_given_up_on_are_counted_apart(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    """``orchestrator_documents_retrying``: the latest attempt failed and it is tried
    again; ``orchestrator_documents_failed``: its handler gave up on it (before: one
    ``failed`` gauge counting both, so an alert on it fired for every transient error)."""
    registry = CollectorRegistry()
    metrics = PrometheusListener(registry, status=db, monotonic=clock.monotonic)
    replica = await replicas("pod-1", listeners=[metrics], max_attempts=3)

    @replica.phase("jobs", "Charging")
    async def charge(lease: Any) -> Any:
        if lease.doc["hopeless"]:
            return await lease.fail("no such account")
        raise ValueError("the bank did not answer")

    for n in range(3):
        await replica.submit("jobs", {"_id": f"job-{n}", "phase": "Charging", "hopeless": n == 0})
    await replica.run_once()
    charging = {"collection": "jobs", "phase": "Charging"}
    failed = {"collection": "jobs", "phase": "Failed"}
    assert value(registry, "orchestrator_documents_retrying", **charging) == 2
    assert value(registry, "orchestrator_documents_failed", **charging) == 0
    assert value(registry, "orchestrator_documents_retrying", **failed) == 0
    assert value(registry, "orchestrator_documents_failed", **failed) == 1


async def test_a_running_step_holds_a_lease(replicas: MakeEither) -> None:
    registry = CollectorRegistry()
    replica = await replicas("pod-1", listeners=[PrometheusListener(registry)])
    box = hold(replica)
    await replica.submit("jobs", {"phase": "Running"})
    async with anyio.create_task_group() as group:
        group.start_soon(replica.run_once)
        assert await wait(box["claimed"])
        assert value(registry, "orchestrator_leases_held", collection="jobs") == 1
        box["go"].set()
    assert value(registry, "orchestrator_leases_held", collection="jobs") == 0
    assert value(registry, "orchestrator_claims_total", collection="jobs", phase="Running") == 1


async def test_schedules_fires_are_counted_by_result_with_the_lag_of_each_start(
    replicas: MakeEither, db: Database[Any], clock: FakeClock
) -> None:
    registry = CollectorRegistry()
    replica = await replicas("pod-1", listeners=[PrometheusListener(registry)])
    orch = replica.orch

    @replica.phase("reports", "Make")
    async def make(lease: Any) -> Any:
        return await lease.relock(3600)  # still running: the next fires of "report" skip

    @orch.schedule("report", "reports", every=5)
    def report(fire: Any) -> dict[str, Any]:
        return {"phase": "Make"}

    @orch.schedule("sweep", "reports", every=10, catch_up=25, overlap="allow_all")
    def sweep(fire: Any) -> dict[str, Any]:
        return {"phase": "Swept"}

    await replica.run_once(heartbeat=False)
    for seconds in (6, 6, 100, 3):  # the jump leaves "sweep" fires past its catch-up window
        clock.advance(seconds)
        await replica.run_once(heartbeat=False)

    fires = "orchestrator_schedule_fires_total"
    for schedule in db["orchestrator.schedules"].find():
        name, counts = schedule["_id"], schedule["counts"]
        for result in ("started", "skipped", "missed"):
            counted = value(registry, fires, schedule=name, result=result) or 0
            assert counted == counts.get(result, 0), (name, result)
        runs = list(db.reports.find({"scheduled.name": name}))
        assert value(registry, "orchestrator_schedule_lag_seconds_count", schedule=name) == len(
            runs
        )
        lags = [(r["createdAt"] - r["scheduled"]["fire"]).total_seconds() for r in runs]
        lag = value(registry, "orchestrator_schedule_lag_seconds_sum", schedule=name)
        assert lag == pytest.approx(sum(lags), abs=0.01 * len(runs))
    assert (value(registry, fires, schedule="report", result="skipped") or 0) >= 2
    assert (value(registry, fires, schedule="sweep", result="missed") or 0) >= 5
    assert (value(registry, "orchestrator_schedule_lag_seconds_sum", schedule="sweep") or 0) > 10


def _status(leased: int) -> Status:
    row = PhaseCount("jobs", "Running", 3, leased, 0, 1, 0, 0)
    return Status(at=FakeClock().now(), server_time=True, phases=[row])


def test_documents_are_counted_at_most_once_per_max_age(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    answers: list[Status | Exception] = [_status(1), RuntimeError("unreachable"), _status(2)]

    def fetch() -> Status:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    registry = CollectorRegistry()
    collector = StatusCollector(fetch, max_age=10, monotonic=clock.monotonic)
    registry.register(collector)  # describes itself: no query yet
    assert collector.computations == 0

    leased = {"collection": "jobs", "phase": "Running"}
    for _ in range(5):  # a scrape storm
        generate_latest(registry)
    assert collector.computations == 1
    assert value(registry, "orchestrator_documents_leased", **leased) == 1
    assert value(registry, "orchestrator_documents_waiting", **leased) == 1

    clock.advance(10)
    caplog.set_level(logging.WARNING, logger="orchestrator")
    assert value(registry, "orchestrator_status_up") == 0
    assert value(registry, "orchestrator_documents_leased", **leased) is None, "no stale counts"
    assert "unreachable" in caplog.text
    clock.advance(5)
    generate_latest(registry)
    assert collector.computations == 2, "a failure is not retried before max_age either"

    clock.advance(5)
    assert value(registry, "orchestrator_documents_leased", **leased) == 2
    assert collector.computations == 3


def test_a_status_source_and_max_age_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="not str"):
        StatusCollector("orchestrator")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="status_max_age"):
        StatusCollector(lambda: _status(1), max_age=-1)


def test_an_async_database_is_counted_on_its_own_loop_and_never_blocks_it() -> None:
    db = async_memory_database("metrics")
    with pytest.raises(ConfigError, match="event loop that owns its client"):
        StatusCollector(db)  # no running loop: no client would answer the scrape

    async def main() -> tuple[Any, ...]:
        await db.jobs.insert_one({"phase": "Running"})
        registry = CollectorRegistry()
        registry.register(StatusCollector(db, max_age=0, timeout=30))
        # A scrape from another thread (prometheus_client's server) waits for the count,
        # which runs on this loop meanwhile.
        counted = await asyncio.to_thread(
            value, registry, "orchestrator_documents", collection="jobs", phase="Running"
        )
        await db.jobs.insert_one({"phase": "Running"})
        # A scrape on the loop itself cannot wait for the count it starts: it serves the
        # last counts, marked stale, never a deadlock; the count runs once the loop is free.
        on_loop: dict[str, float | None] = _families(registry)
        on_loop["documents"] = value(registry, "orchestrator_documents", **running)
        after = await asyncio.to_thread(
            value, registry, "orchestrator_documents", collection="jobs", phase="Running"
        )
        return counted, on_loop, after

    running = {"collection": "jobs", "phase": "Running"}
    on_loop = {"up": 1, "stale": 1, "age_seconds": pytest.approx(0, abs=60), "documents": 1}
    assert asyncio.run(main()) == (1, on_loop, 2)


def _families(registry: CollectorRegistry) -> dict[str, float | None]:
    names = ("up", "stale", "age_seconds")
    return {name: value(registry, f"orchestrator_status_{name}") for name in names}


def test_a_slow_count_holds_no_scrape_and_never_piles_up(clock: FakeClock) -> None:
    """A count that does not answer within the scrape's wait: the scrape serves the last
    counts, marked stale with their age, and no second count starts while it runs."""
    answers = [_status(1), _status(2)]
    release, started = threading.Event(), []

    def fetch() -> Status:
        started.append(threading.current_thread().name)
        if len(started) == 2:
            assert release.wait(60), "the test never released the count"
        return answers[len(started) - 1]

    registry = CollectorRegistry()
    collector = StatusCollector(fetch, max_age=10, timeout=30, monotonic=clock.monotonic)
    registry.register(collector)
    leased = {"collection": "jobs", "phase": "Running"}
    assert value(registry, "orchestrator_documents_leased", **leased) == 1
    assert _families(registry) == {"up": 1, "stale": 0, "age_seconds": 0}

    collector.timeout = 0  # the next count hangs: no scrape waits for it
    clock.advance(10)
    for age in (10, 13, 16):  # within max_age of the count in flight: none other is due
        assert value(registry, "orchestrator_documents_leased", **leased) == 1
        assert _families(registry) == {"up": 1, "stale": 1, "age_seconds": age}
        clock.advance(3)
    assert collector.computations == 2, "one count in flight, however many scrapes"
    assert "MainThread" not in started, "counted apart from the scrape"

    release.set()
    collector.timeout = 30  # the count in flight ends now: a scrape takes it in
    assert value(registry, "orchestrator_documents_leased", **leased) == 2
    assert _families(registry) == {"up": 1, "stale": 0, "age_seconds": 9}  # started at 10
    assert collector.computations == 2


async def test_a_databases_count_is_bounded_by_the_scrape_timeout(
    db: Database[Any], adb: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """On a server, the count's database work is cut at ``timeout`` (pymongo's client-side
    timeout): a budget no round trip can meet fails the count, not the scrape."""
    if isinstance(db, MemoryDatabase):
        pytest.skip("the in-memory store has no client-side timeout")
    for source in (db, adb):
        registry = CollectorRegistry()
        collector = StatusCollector(source, timeout=1e-6)
        registry.register(collector)
        await asyncio.to_thread(generate_latest, registry)
        collector.timeout = 30  # wait for the count, cut at its first operation, to end
        assert await asyncio.to_thread(value, registry, "orchestrator_status_up") == 0
        assert collector.computations == 1
    assert "counting documents failed" in caplog.text
    assert "timed out" in caplog.text.lower() or "timeout" in caplog.text.lower()


def test_importing_orchestrator_needs_no_extra_and_the_listeners_name_theirs() -> None:
    script = """
import sys
sys.modules["prometheus_client"] = None
sys.modules["opentelemetry"] = None
import orchestrator, orchestrator.operations
for name in ("prometheus", "tracing"):
    try:
        __import__(f"orchestrator.monitoring.{name}")
    except ModuleNotFoundError as exc:
        print(exc)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert "the 'metrics' extra installs: pip install 'mongo-orchestrator[metrics]'" in out
    assert "the 'tracing' extra installs: pip install 'mongo-orchestrator[tracing]'" in out


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of a /metrics page: {name: {sorted labels: value}}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def _total(samples: dict[tuple[tuple[str, str], ...], float], **labels: str) -> float:
    return sum(v for k, v in samples.items() if set(labels.items()) <= set(k))


def test_the_demo_serves_metrics_that_agree_with_its_report() -> None:
    scraped: list[dict[str, dict[tuple[tuple[str, str], ...], float]]] = []
    output = io.StringIO()
    options = DemoOptions(
        gateways=8, replicas=2, cert_delay=0.2, fail_rate=0.1, seed=5, metrics_port=0
    )
    code = demo.run(
        options,
        Console(file=output, width=300),
        serving=lambda url: scraped.append(_scrape(url)),
    )
    report = output.getvalue()
    assert code == 0, report
    [metrics] = scraped

    def reported(row: str) -> int:
        found = re.search(rf"│ {row}\s+│ (\d+)", report)
        assert found, f"no {row!r} row in the report:\n{report}"
        return int(found.group(1))

    steps = metrics["orchestrator_steps_total"]
    assert _total(steps) == reported("steps") == _total(metrics["orchestrator_claims_total"])
    assert _total(steps, outcome="relocked") == reported("relocks") > 0
    assert _total(steps, outcome="retrying") == reported("retries") > 0
    assert _total(steps, outcome="failed") == 0
    assert _total(metrics["orchestrator_attempt_failures_total"]) == reported("retries")
    assert _total(metrics["orchestrator_leases_held"]) == 0
    assert "orchestrator_leases_lost_total" not in metrics, "no lease lost: no sample yet"

    documents = metrics["orchestrator_documents"]
    final = re.search(r"gateways: (\d+) Created; runtimeDomains: (\d+) Created", report)
    assert final, report
    assert _total(documents, collection="gateways", phase="Created") == int(final.group(1))
    assert _total(documents, collection="runtimeDomains", phase="Created") == int(final.group(2))
    assert _total(documents, phase="Failed") == 0
    assert _total(metrics["orchestrator_documents_leased"]) == 0
    assert _total(metrics["orchestrator_documents_overdue"]) == 0
    assert metrics["orchestrator_status_up"][()] == 1


def test_the_demo_metrics_port_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="not with --processes"):
        DemoOptions(metrics_port=9100, processes=2, uri="mongodb://x").check()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["demo", "--gateways", "1", "--metrics-port", str(port)])
    assert code == 2
    assert f"--metrics-port {port}: cannot listen" in capsys.readouterr().err
