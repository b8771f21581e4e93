"""OpenTelemetry traces end to end: one ticket through the real API, Redis, a real worker and the
simulator yields one trace of linked spans, its context stored on the ticket. Spans go to the SDK's
in-memory exporter; nothing is exported over the network."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ops.lab.sim.process import SimulatorProcess
from shared import tracing
from shared.models import TicketStatus
from tests.producer.api.openai.conftest import Gateway
from tests.waiting import wait_until

COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice.", "max_tokens": 8}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "tidegate-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)
    provider.shutdown()


@pytest.fixture
def gateway(spans: InMemorySpanExporter, gateway: Gateway) -> Gateway:
    """The API built while tracing is on (it adds its request spans then)."""
    return gateway


def _named(exporter: InMemorySpanExporter, ticket_id: str) -> dict[str, ReadableSpan]:
    """The spans of one ticket's trace by name, once the worker's span has ended."""

    def found() -> dict[str, ReadableSpan] | None:
        finished = exporter.get_finished_spans()
        ticket_spans = [s for s in finished if (s.attributes or {}).get("tidegate.ticket_id") == ticket_id]
        if not any(s.name == "tidegate.ticket" for s in ticket_spans):
            return None
        trace_id = ticket_spans[0].context.trace_id
        return {s.name: s for s in finished if s.context.trace_id == trace_id}

    named: dict[str, ReadableSpan] = wait_until(found, 20, "the worker's span of the ticket")
    return named


def _parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _submit(gateway: Gateway, headers: dict[str, str]) -> str:
    key = gateway.key()
    response = requests.post(
        gateway.base_url + "/v1/tickets",
        json=COMPLAINT,
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    ticket_id: str = response.json()["id"]
    wait_until(
        lambda: (t := gateway.queue.get(ticket_id)) is not None and t.status is TicketStatus.DONE,
        20,
        "the ticket to be done",
    )
    return ticket_id


def test_a_ticket_is_one_trace_from_the_callers_span_to_vllm(
    gateway: Gateway, backend: SimulatorProcess, spans: InMemorySpanExporter
) -> None:
    caller_tracer = TracerProvider().get_tracer("branch-system")  # the branch's own, not exported
    with caller_tracer.start_as_current_span("branch.submit") as caller:
        headers: dict[str, Any] = {}
        TraceContextTextMapPropagator().inject(headers)
    ticket_id = _submit(gateway, headers)
    named = _named(spans, ticket_id)

    server, enqueue = named["POST /v1/tickets"], named["tidegate.enqueue"]
    consumer, vllm = named["tidegate.ticket"], named["vllm.completion"]
    trace_id = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in named.values()} == {trace_id}
    assert _parent_of(server) == caller.get_span_context().span_id  # the caller's traceparent continued
    assert _parent_of(enqueue) == server.context.span_id
    assert _parent_of(consumer) == enqueue.context.span_id  # across Redis, through the ticket
    assert _parent_of(vllm) == consumer.context.span_id
    assert [server.kind, enqueue.kind, consumer.kind, vllm.kind] == [
        SpanKind.SERVER,
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
        SpanKind.CLIENT,
    ]
    assert server.attributes is not None and server.attributes["http.response.status_code"] == 202
    assert consumer.attributes is not None and consumer.attributes["tidegate.type"] == "complaint"
    stored = gateway.queue.get(ticket_id)
    assert stored is not None and stored.traceparent is not None
    version, stored_trace, stored_span, _flags = stored.traceparent.split("-")
    assert (version, int(stored_trace, 16), int(stored_span, 16)) == ("00", trace_id, enqueue.context.span_id)


def test_without_a_caller_trace_the_api_request_is_the_root(
    gateway: Gateway, backend: SimulatorProcess, spans: InMemorySpanExporter
) -> None:
    ticket_id = _submit(gateway, {})
    named = _named(spans, ticket_id)
    server = named["POST /v1/tickets"]
    assert server.parent is None
    assert _parent_of(named["tidegate.ticket"]) == named["tidegate.enqueue"].context.span_id
