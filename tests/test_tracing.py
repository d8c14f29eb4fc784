"""OpenTelemetry traces on both engines: one trace per workflow (its context stored on the
document at submit), a span per step with its outcome, and the handler's own spans as
its children; garbage in the stored context gives a root span, never an error."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pymongo.database import Database

from orchestrator import Operations
from orchestrator.monitoring.tracing import TracingListener
from orchestrator.testing import FakeClock
from tests.conftest import MakeEither
from tests.engines import Replica

pytestmark = pytest.mark.anyio


@pytest.fixture
def exported() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    """An SDK provider whose finished spans land in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, provider
    provider.shutdown()


def tree(spans: Sequence[ReadableSpan]) -> str:
    """Spans as the indented trees of their traces, one line a span: its name, what tells a
    step (replica, outcome) and its ids' first hex digits. A span whose parent was not
    exported (another process's) heads a tree and names that parent."""
    ids = {s.context.span_id for s in spans}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent if parent in ids else None, []).append(span)

    def line(span: ReadableSpan) -> str:
        attributes = dict(span.attributes or {})
        about = " ".join(
            f"{key}={attributes[f'orchestrator.{key}']}"
            for key in ("replica", "outcome")
            if f"orchestrator.{key}" in attributes
        )
        parent = span.parent
        outside = (
            f" (child of {parent.span_id:016x}, not exported)"
            if parent is not None and parent.span_id not in ids
            else ""
        )
        return f"{span.name}  [span {span.context.span_id:016x}]{outside}  {about}".rstrip()

    lines: list[str] = []

    def walk(span: ReadableSpan, prefix: str, last: bool) -> None:
        lines.append(f"{prefix}{'└─ ' if last else '├─ '}{line(span)}")
        kids = children.get(span.context.span_id, [])
        for n, kid in enumerate(kids):
            walk(kid, prefix + ("   " if last else "│  "), n == len(kids) - 1)

    for root in children.get(None, []):
        lines.append(f"trace {root.context.trace_id:032x}")
        walk(root, "", True)
    return "\n".join(lines)


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        named.setdefault(span.name, []).append(span)
    return named


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_each_step_is_a_span_with_its_outcome(
    replicas: MakeEither, exported: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = exported
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

    spans = _by_name(exporter)
    assert {name: len(found) for name, found in spans.items()} == {
        "orchestrator.submit jobs": 2,
        "orchestrator.step jobs Running": 1,
        "orchestrator.step jobs Flaky": 1,
        "call the SDK": 1,
    }
    [ok], [bad] = spans["orchestrator.step jobs Running"], spans["orchestrator.step jobs Flaky"]
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
    submits = {
        dict(s.attributes or {})["orchestrator.document_id"]: s
        for s in spans["orchestrator.submit jobs"]
    }
    assert submits["ok"].parent is None, "a workflow's submit span is its trace's root"
    assert _parent_id(ok) == submits["ok"].context.span_id
    assert ok.context.trace_id == submits["ok"].context.trace_id
    [child] = spans["call the SDK"]
    assert _parent_id(child) == ok.context.span_id

    assert bad.status.status_code is trace.StatusCode.ERROR
    assert _parent_id(bad) == submits["bad"].context.span_id
    assert bad.context.trace_id != ok.context.trace_id, "one trace per document"
    assert (bad.attributes or {})["orchestrator.outcome"] == "failed"
    assert (bad.attributes or {})["orchestrator.recorded"] is True  # its failure is on the doc
    assert [(e.name, dict(e.attributes or {})["exception.type"]) for e in bad.events] == [
        ("attempt failed", "ValueError")
    ]


CERTIFICATE = ("Issuing", "Validating", "Deploying", "Done")
"""A certificate's phases: each of the first three is one step that advances to the next."""


def _certificate_workflow(replica: Replica, app: trace.Tracer, *, one_step: bool) -> None:
    """``replica`` runs every step of a certificate; ``one_step``: one step, then it stops
    claiming (so the next is another replica's, not carried on here)."""
    for phase, to in pairwise(CERTIFICATE):

        @replica.phase("certs", phase)
        async def step(lease: Any, to: str = to) -> Any:
            if one_step:
                replica.request_stop()
            with app.start_as_current_span(f"call the CA ({lease.phase})"):
                return await lease.advance(to)


async def test_a_workflow_run_by_three_replicas_hours_apart_is_one_trace(
    replicas: MakeEither,
    db: Database[Any],
    clock: FakeClock,
    exported: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    exporter, provider = exported
    app = provider.get_tracer("app")
    fleet = [
        await replicas(f"pod-{n}", listeners=[TracingListener(tracer_provider=provider)])
        for n in (1, 2, 3)
    ]
    for replica in fleet:
        _certificate_workflow(replica, app, one_step=True)

    await fleet[0].submit("certs", {"_id": "cert-1", "phase": "Issuing"})
    for replica in fleet:
        clock.advance(3600)  # an hour between steps
        assert (await replica.run_once()).get("advanced") == 1

    spans = exporter.get_finished_spans()
    print("\n" + tree(spans))
    named = _by_name(exporter)
    [submit] = named["orchestrator.submit certs"]
    steps = [named[f"orchestrator.step certs {phase}"][0] for phase in CERTIFICATE[:3]]
    assert len(spans) == 1 + 3 + 3, "the submit, three steps, and the CA call of each"
    assert {s.context.trace_id for s in spans} == {submit.context.trace_id}
    assert submit.parent is None
    assert [_parent_id(s) for s in steps] == [submit.context.span_id] * 3
    assert [dict(s.attributes or {})["orchestrator.replica"] for s in steps] == [
        "pod-1",
        "pod-2",
        "pod-3",
    ]
    assert {dict(s.attributes or {})["orchestrator.outcome"] for s in steps} == {"advanced"}
    for step in steps:
        [call] = [s for s in spans if _parent_id(s) == step.context.span_id]
        assert call.name.startswith("call the CA")
    doc = db.certs.find_one({"_id": "cert-1"})
    assert doc is not None and doc["phase"] == "Done"
    [(key, value)] = doc["orchestratorTrace"].items()  # W3C's, with no tracestate
    assert key == "traceparent"
    assert value.startswith(f"00-{submit.context.trace_id:032x}-{submit.context.span_id:016x}-")


async def test_a_document_submitted_inside_a_span_is_part_of_that_span_s_trace(
    replicas: MakeEither, exported: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = exported
    app = provider.get_tracer("app")
    api = await replicas("api", listeners=[TracingListener(tracer_provider=provider)])
    worker = await replicas("worker", listeners=[TracingListener(tracer_provider=provider)])
    _certificate_workflow(worker, app, one_step=False)

    with app.start_as_current_span("POST /certificates") as request:
        await api.submit("certs", {"_id": "cert-1", "phase": "Issuing"})
    await worker.run_once()

    named = _by_name(exporter)
    print("\n" + tree(exporter.get_finished_spans()))
    assert "orchestrator.submit certs" not in named, "the request's span is the parent"
    steps = [named[f"orchestrator.step certs {phase}"][0] for phase in CERTIFICATE[:3]]
    context = request.get_span_context()
    assert [_parent_id(s) for s in steps] == [context.span_id] * 3
    assert {s.context.trace_id for s in steps} == {context.trace_id}
    assert worker.stats().get("carried") == 2, "the next two steps were carried on, not claimed"


async def test_an_operator_retry_keeps_the_document_s_trace(
    replicas: MakeEither,
    db: Database[Any],
    exported: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    exporter, provider = exported
    replica = await replicas(
        "pod-1", listeners=[TracingListener(tracer_provider=provider)], max_attempts=1
    )
    card = {"declined": True}

    @replica.phase("jobs", "Charging")
    async def charge(lease: Any) -> Any:
        if card["declined"]:
            raise ValueError("card declined")
        return await lease.advance("Done")

    await replica.submit("jobs", {"_id": "j", "phase": "Charging"})
    await replica.run_once()
    ops = Operations(db)
    ops.retry("jobs", ops.document("jobs", "j"), "Charging", any_phase=True)
    card["declined"] = False
    await replica.run_once()

    named = _by_name(exporter)
    [submit] = named["orchestrator.submit jobs"]
    failed, done = named["orchestrator.step jobs Charging"]
    assert [dict(s.attributes or {})["orchestrator.outcome"] for s in (failed, done)] == [
        "failed",
        "advanced",
    ]
    assert [_parent_id(s) for s in (failed, done)] == [submit.context.span_id] * 2
    assert {s.context.trace_id for s in (submit, failed, done)} == {submit.context.trace_id}


VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "stored",
    [
        VALID,
        [VALID],
        42,
        None,
        {"traceparent": 42},
        {"traceparent": None},
        {"traceparent": "00-zz-00f067aa0ba902b7-01"},
        {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"},  # an all-zero trace id
        {"traceparent": VALID + "x" * 1_000_000},
        {"traceparent": "\x00" + VALID},
        {"traceparent": {"nested": VALID}},
        {f"k{n}": "v" for n in range(10_000)},
    ],
    ids=[
        "a-string",
        "a-list",
        "a-number",
        "null",
        "a-number-value",
        "a-null-value",
        "not-hex",
        "zero-trace-id",
        "huge",
        "control-character",
        "nested",
        "ten-thousand-entries",
    ],
)
async def test_a_garbage_stored_context_gives_a_root_span_and_the_step_runs(
    replicas: MakeEither,
    db: Database[Any],
    exported: tuple[InMemorySpanExporter, TracerProvider],
    caplog: pytest.LogCaptureFixture,
    stored: Any,
) -> None:
    exporter, provider = exported
    replica = await replicas("pod-1", listeners=[TracingListener(tracer_provider=provider)])

    @replica.phase("jobs", "Running")
    async def run(lease: Any) -> Any:
        return await lease.advance("Done")

    db.jobs.insert_one({"_id": "j", "phase": "Running", "orchestratorTrace": stored})
    caplog.set_level(logging.ERROR, logger="orchestrator")
    assert (await replica.run_once()).get("advanced") == 1
    [span] = exporter.get_finished_spans()
    assert span.parent is None
    assert dict(span.attributes or {})["orchestrator.outcome"] == "advanced"
    assert "listener_errors" not in replica.stats()
    assert not [r for r in caplog.records if getattr(r, "outcome", None) == "listener-error"]


async def test_a_document_with_no_stored_context_has_each_step_as_a_root(
    replicas: MakeEither,
    db: Database[Any],
    exported: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    """Submitted before tracing, or by a replica without the listener: each step is the
    root of a trace of its own, as before."""
    exporter, provider = exported
    plain = await replicas("plain")
    traced = await replicas("traced", listeners=[TracingListener(tracer_provider=provider)])
    _certificate_workflow(traced, provider.get_tracer("app"), one_step=False)

    await plain.submit("certs", {"_id": "old", "phase": "Issuing"})
    doc = db.certs.find_one({"_id": "old"})
    assert doc is not None and "orchestratorTrace" not in doc, "nothing stored unasked"
    await traced.run_once()
    steps = [s for s in exporter.get_finished_spans() if s.name.startswith("orchestrator.step")]
    assert len(steps) == 3 and all(s.parent is None for s in steps)
    assert len({s.context.trace_id for s in steps}) == 3


async def test_without_an_sdk_nothing_is_stored(replicas: MakeEither, db: Database[Any]) -> None:
    """The API's default provider makes no spans: no context, no field written."""
    replica = await replicas(
        listeners=[TracingListener(tracer_provider=trace.NoOpTracerProvider())]
    )
    await replica.submit("jobs", {"_id": "j", "phase": "Running"})
    doc = db.jobs.find_one({"_id": "j"})
    assert doc is not None and "orchestratorTrace" not in doc
