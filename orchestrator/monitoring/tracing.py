"""OpenTelemetry traces: one per workflow, a span per step, from a replica's events.

At submit (``SubmittingEvent``) the trace context is stored on the document
(``orchestratorTrace``: W3C ``traceparent`` and ``tracestate``): the submitting code's
active span's (a FastAPI request's, say), or else that of a short ``orchestrator.submit
<collection>`` span, started and ended there, the workflow's root. Each step's span starts
when a document is claimed, as a child of that stored context, on whichever replica
claims it and however long after, and ends with the step's outcome: a document's steps
are one trace. A document with no stored context (submitted before this, or by a replica
without this listener or without an SDK), or with one that does not parse, has each step
as the root of its own trace.

A step's span is the current span while it runs (in the worker's thread or task, and in
the thread of a plain ``def`` handler of the async engine, which runs in a copy of the
step's context), so the spans a handler makes, or its instrumented clients make, are its
children. A step that fails, loses its lease or times out ends with an error status.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token
from typing import Any

from orchestrator.core.distribution import install_hint

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ModuleNotFoundError as exc:  # pragma: no cover - the tracing extra is missing
    raise ModuleNotFoundError(
        "orchestrator.monitoring.tracing needs opentelemetry-api, which the 'tracing' extra "
        f"installs: {install_hint('tracing')}",
        name="opentelemetry",
    ) from exc

from orchestrator.core.events import (
    AttemptFailedEvent,
    LeaseLostEvent,
    Listener,
    StepClaimedEvent,
    StepFinishedEvent,
    SubmittingEvent,
)

__all__ = ["TracingListener"]

_CURRENT: ContextVar[tuple[int, Token[otel_context.Context]] | None] = ContextVar(
    "orchestrator_step_span", default=None
)
"""(step number, context token) of the span this worker attached, to detach it where it
was attached: a time-out ends a step's span from the heartbeat instead."""


class TracingListener(Listener):
    """Register it on every replica, and on the process that submits:
    ``Orchestrator(db, listeners=[TracingListener()])``.

    ``tracer_provider``: the provider to take the tracer from (the global one unless
    given: the application configures its SDK and exporter as usual). ``propagator``:
    how the context is written on a document and read back (W3C Trace Context unless
    given; every replica must read what the submitting one writes).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("orchestrator", tracer_provider=tracer_provider)
        self._propagator = propagator or TraceContextTextMapPropagator()
        self._spans: dict[tuple[str, int], trace.Span] = {}
        self._lock = threading.Lock()

    def submitting(self, event: SubmittingEvent) -> None:
        """Store the submitting code's active span's context, else a submit span's."""
        context = otel_context.get_current()
        if not trace.get_current_span(context).get_span_context().is_valid:
            span = self._tracer.start_span(
                f"orchestrator.submit {event.collection}",
                context=otel_context.Context(),
                kind=trace.SpanKind.PRODUCER,
                attributes={
                    "orchestrator.replica": event.replica,
                    "orchestrator.collection": event.collection,
                    "orchestrator.phase": event.phase,
                    **(
                        {"orchestrator.document_id": str(event.document_id)}
                        if event.document_id is not None
                        else {}
                    ),
                },
            )
            span.end()
            context = trace.set_span_in_context(span)
        self._propagator.inject(event.carrier, context=context)

    def step_claimed(self, event: StepClaimedEvent) -> None:
        span = self._tracer.start_span(
            f"orchestrator.step {event.collection} {event.phase or ''}".rstrip(),
            context=self._parent(event),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "orchestrator.replica": event.replica,
                "orchestrator.collection": event.collection,
                "orchestrator.phase": event.phase or "",
                "orchestrator.document_id": str(event.document_id),
                "orchestrator.handler": event.handler,
                **(
                    {"orchestrator.claim_latency": event.latency}
                    if event.latency is not None
                    else {}
                ),
            },
        )
        with self._lock:
            self._spans[(event.replica, event.step)] = span
        token = otel_context.attach(trace.set_span_in_context(span))
        _CURRENT.set((event.step, token))

    def _parent(self, event: StepClaimedEvent) -> otel_context.Context:
        """The context stored on the document at submit; an empty one (the step's span is
        a root) when there is none or it does not parse. Never the worker's own context:
        a step is not part of whatever ran before it there."""
        empty = otel_context.Context()
        if not event.carrier:
            return empty
        try:
            return self._propagator.extract(event.carrier, context=empty)
        except Exception:  # a propagator given by the application may raise on garbage
            return empty

    def step_finished(self, event: StepFinishedEvent) -> None:
        with self._lock:
            span = self._spans.pop((event.replica, event.step), None)
        current = _CURRENT.get()
        if current is not None and current[0] == event.step:
            _CURRENT.set(None)
            otel_context.detach(current[1])
        if span is None:
            return
        span.set_attribute("orchestrator.outcome", event.outcome.value)
        # Whether the document says what became of the step, or its lease was left to
        # expire (or was taken): where an operator looks next.
        span.set_attribute("orchestrator.recorded", event.outcome.is_recorded)
        if event.wait is not None:
            span.set_attribute("orchestrator.wait", event.wait)
        if event.outcome.is_failure:
            span.set_status(trace.Status(trace.StatusCode.ERROR, event.outcome.value))
        else:
            span.set_status(trace.Status(trace.StatusCode.OK))
        span.end()

    def attempt_failed(self, event: AttemptFailedEvent) -> None:
        self._annotate(
            "attempt failed",
            {
                "exception.type": event.error_type,
                "exception.message": event.message,
                "orchestrator.outcome": event.outcome.value,
            },
        )

    def lease_lost(self, event: LeaseLostEvent) -> None:
        self._annotate("lease lost", {"orchestrator.reason": event.reason})

    @staticmethod
    def _annotate(name: str, attributes: dict[str, Any]) -> None:
        """An event on the current step's span (in the step's own thread or task)."""
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(name, attributes)
