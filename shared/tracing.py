"""Optional OpenTelemetry traces: one trace per ticket, from the API through Redis to the worker and vLLM.

Off unless configured the standard way: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER` (`otlp`, `console`); the other
`OTEL_*` variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, headers, sampler) apply as
the SDK reads them, and `OTEL_SDK_DISABLED=true` keeps it off. It needs the `otel` extra; without
it, or unconfigured, every function here is a no-op, so the core installs and runs without it.

The submitting span's context is stored on the ticket as a W3C `traceparent`, so the worker's span
is its child however long the ticket waited, on whichever node claims it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Literal

log = logging.getLogger(__name__)

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed
    trace = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

Attributes = Mapping[str, str | int | float | bool]
SpanKind = Literal["internal", "server", "client", "producer", "consumer"]
TRACER_NAME = "tidegate"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_provider: Any = None
"""The tracer provider tidegate's spans go to; None while tracing is off."""


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (an exporter or its endpoint named, SDK not disabled)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def configure_tracing(service_name: str) -> bool:
    """Start exporting this process's spans when the environment asks for it; whether it does."""
    if not wanted():
        return False
    if trace is None:
        log.warning("OTEL_* asks for traces but OpenTelemetry is not installed: pip install 'tidegate[otel]'")
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers and timeout from the OTEL_* variables
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    use_provider(provider)
    log.info("tracing on: spans of %s exported with %s", service_name, type(exporter).__name__)
    return True


def use_provider(provider: Any) -> None:
    """Send tidegate's spans to `provider` (None: tracing off). Tests give an SDK provider with an
    in-memory exporter, so no process-wide state outlives them."""
    global _provider
    _provider = provider


def enabled() -> bool:
    return _provider is not None


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: SpanKind = "internal",
    parent: str | None = None,
    attributes: Attributes | None = None,
) -> Iterator[Any]:
    """A span around the block, a child of `parent` (a stored traceparent) when given, else of the
    current span; yields it (None while tracing is off)."""
    if _provider is None or trace is None:
        yield None
        return
    context = _extract({"traceparent": parent}) if parent else None
    tracer = _provider.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        name, context=context, kind=trace.SpanKind[kind.upper()], attributes=dict(attributes or {})
    ) as current:
        yield current


def _extract(carrier: Mapping[str, str]) -> Any:
    assert TraceContextTextMapPropagator is not None
    return TraceContextTextMapPropagator().extract(carrier)


@contextlib.contextmanager
def continued(headers: Mapping[str, str]) -> Iterator[None]:
    """Make an incoming request's `traceparent` the current context for the block."""
    if _provider is None or trace is None or "traceparent" not in headers:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(_extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to outgoing request headers."""
    if _provider is not None and TraceContextTextMapPropagator is not None:
        TraceContextTextMapPropagator().inject(headers)


def current_traceparent() -> str | None:
    """The current span's context as a W3C traceparent, to store on a ticket; None while off."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


def ticket_attributes(ticket: Any) -> dict[str, str | int | float | bool]:
    """The span attributes that name a ticket (anything with id, branch_id and type)."""
    return {
        "tidegate.ticket_id": ticket.id,
        "tidegate.branch_id": ticket.branch_id,
        "tidegate.type": ticket.type,
    }
