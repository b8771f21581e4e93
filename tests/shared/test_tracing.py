"""Tracing is off unless the standard OTEL_* variables ask for it, and off it changes nothing."""

from __future__ import annotations

import pytest

from shared import tracing
from shared.models import TicketRequest
from shared.policy import Policy
from shared.queue import TicketQueue


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "api"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_wanted_only_when_an_exporter_is_configured(environ: dict[str, str], expected: bool) -> None:
    assert tracing.wanted(environ) is expected


def test_unconfigured_it_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*tracing.ENDPOINT_VARIABLES, "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.configure_tracing("tidegate-test") is False
    assert not tracing.enabled()


def test_off_spans_are_none_and_tickets_carry_no_context(ticket_queue: TicketQueue, policy: Policy) -> None:
    assert not tracing.enabled()
    with tracing.span("anything", parent="00-" + "1" * 32 + "-" + "2" * 16 + "-01") as span:
        assert span is None
        assert tracing.current_traceparent() is None
        headers: dict[str, str] = {}
        tracing.inject(headers)
        assert headers == {}
    request = TicketRequest.model_validate(
        {"type": "complaint", "branch_id": "0412", "prompt": "x"}, context={"policy": policy}
    )
    result = ticket_queue.enqueue(request)
    stored = ticket_queue.get(result.ticket_id)
    assert stored is not None and stored.traceparent is None
