"""One OpenTelemetry span per step, on both engines: its attributes, its status, and the
handler's own spans as its children."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator.monitoring.tracing import TracingListener
from tests.conftest import MakeEither

pytestmark = pytest.mark.anyio


async def test_each_step_is_a_span_with_its_outcome(replicas: MakeEither) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = provider.get_tracer("app")
    replica = await replicas(
        "pod-1", listeners=[TracingListener(tracer_provider=provider)], max_attempts=1
    )

    @replica.phase("jobs", "Running")
    async def run(lease: Any) -> Any:
        with app.start_as_current_span("call the SDK"):
            return await lease.advance("Done")

    @replica.phase("jobs", "Flaky")
    async def flaky(lease: Any) -> Any:
        raise ValueError("the SDK said no")

    await replica.submit("jobs", {"_id": "ok", "phase": "Running"})
    await replica.submit("jobs", {"_id": "bad", "phase": "Flaky"})
    await replica.run_once()

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "orchestrator.step jobs Running",
        "orchestrator.step jobs Flaky",
        "call the SDK",
    }
    ok, bad = spans["orchestrator.step jobs Running"], spans["orchestrator.step jobs Flaky"]
    assert dict(ok.attributes or {}) | {"orchestrator.claim_latency": 0} == {
        "orchestrator.replica": "pod-1",
        "orchestrator.collection": "jobs",
        "orchestrator.phase": "Running",
        "orchestrator.document_id": "ok",
        "orchestrator.handler": replica.orch.handlers[0].name,
        "orchestrator.outcome": "advanced",
        "orchestrator.recorded": True,
        "orchestrator.claim_latency": 0,
    }
    assert ok.status.status_code is trace.StatusCode.OK
    assert ok.parent is None, "a step is the root of its trace"
    child = spans["call the SDK"]
    assert child.parent is not None and child.parent.span_id == ok.context.span_id

    assert bad.status.status_code is trace.StatusCode.ERROR
    assert (bad.attributes or {})["orchestrator.outcome"] == "failed"
    assert (bad.attributes or {})["orchestrator.recorded"] is True  # its failure is on the doc
    assert [(e.name, dict(e.attributes or {})["exception.type"]) for e in bad.events] == [
        ("attempt failed", "ValueError")
    ]
