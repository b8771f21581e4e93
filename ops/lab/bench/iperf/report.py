"""What inference-perf wrote: its summary of the run and its record of each request.

Its clock is the client's: a request starts when its load worker sends it and its first token is
the first streamed chunk that reaches it (`time.perf_counter`, CLOCK_MONOTONIC on Linux); its
percentiles are numpy's (linear between ranks). The summary's keys are those of inference-perf 0.7.0
(`summary_lifecycle_metrics.json`, `per_request_lifecycle_metrics.json`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary_lifecycle_metrics.json"
PER_REQUEST_FILE = "per_request_lifecycle_metrics.json"
CHUNK_ID_PREFIX = "cmpl-"
"""tidegate names a completion after its ticket: `cmpl-<ticket id>`."""


class ReportError(RuntimeError):
    """inference-perf's report is missing or lacks a figure the comparison needs."""


@dataclass(frozen=True)
class ClientSummary:
    """inference-perf's figures for the run (seconds)."""

    sent: int
    answered: int
    failed: int
    ttft_p50: float | None
    ttft_p99: float | None
    latency_p50: float | None
    latency_p99: float | None
    output_tokens_per_s: float | None
    requests_per_s: float | None
    good: int | None
    """Answered within the goodput constraints, when the config set any."""
    seconds: float | None
    send_lag_p50: float | None
    send_lag_p99: float | None
    """How late its load worker sent requests against their Poisson times: a busy client shows here."""


@dataclass(frozen=True)
class ClientRequest:
    """One request as the client saw it (its monotonic clock, seconds)."""

    ticket_id: str | None
    start: float
    first_token: float | None
    end: float
    ok: bool


def _at(doc: Mapping[str, Any], *path: str) -> Any:
    node: Any = doc
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _number(doc: Mapping[str, Any], *path: str) -> float | None:
    value = _at(doc, *path)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _count(doc: Mapping[str, Any], *path: str) -> int:
    value = _number(doc, *path)
    if value is None:
        raise ReportError(f"inference-perf's summary has no {'.'.join(path)}")
    return int(value)


def parse_summary(doc: Mapping[str, Any]) -> ClientSummary:
    """The figures of `summary_lifecycle_metrics.json`."""
    latency = ("successes", "latency")
    good = _number(doc, "successes", "goodput_metrics", "good_requests")
    return ClientSummary(
        sent=_count(doc, "load_summary", "count"),
        answered=_count(doc, "successes", "count"),
        failed=_count(doc, "failures", "count"),
        ttft_p50=_number(doc, *latency, "time_to_first_token", "median"),
        ttft_p99=_number(doc, *latency, "time_to_first_token", "p99"),
        latency_p50=_number(doc, *latency, "request_latency", "median"),
        latency_p99=_number(doc, *latency, "request_latency", "p99"),
        output_tokens_per_s=_number(doc, "successes", "throughput", "output_tokens_per_sec"),
        requests_per_s=_number(doc, "successes", "throughput", "requests_per_sec"),
        good=None if good is None else int(good),
        seconds=_number(doc, "benchmark_time_seconds"),
        send_lag_p50=_number(doc, "load_summary", "schedule_delay", "median"),
        send_lag_p99=_number(doc, "load_summary", "schedule_delay", "p99"),
    )


def _ticket_id(chunks: Any) -> str | None:
    """The ticket id from the first streamed chunk that names its completion."""
    if not isinstance(chunks, list):
        return None
    for raw in chunks:
        try:
            chunk = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            continue
        name = chunk.get("id") if isinstance(chunk, dict) else None
        if isinstance(name, str) and name.startswith(CHUNK_ID_PREFIX):
            return name[len(CHUNK_ID_PREFIX) :]
    return None


def parse_requests(doc: Sequence[Mapping[str, Any]]) -> list[ClientRequest]:
    """Each request of `per_request_lifecycle_metrics.json`, with the ticket its answer names."""
    out: list[ClientRequest] = []
    for index, record in enumerate(doc):
        start, end = _number(record, "start_time"), _number(record, "end_time")
        if start is None or end is None:
            raise ReportError(f"inference-perf's request {index} has no start_time or end_time")
        times = _at(record, "info", "response_metrics", "output_token_times")
        first = float(times[0]) if isinstance(times, list) and times else None
        chunks = _at(record, "info", "response_metrics", "response_chunks")
        out.append(ClientRequest(_ticket_id(chunks), start, first, end, record.get("error") is None))
    return out


def read_report(folder: Path) -> tuple[ClientSummary, list[ClientRequest]]:
    """The summary and the requests inference-perf wrote into `folder`."""
    try:
        summary = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
        requests = json.loads((folder / PER_REQUEST_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"inference-perf's report in {folder} cannot be read: {exc}") from exc
    if not isinstance(summary, dict) or not isinstance(requests, list):
        raise ReportError(f"inference-perf's report in {folder} is not shaped as 0.7.0 writes it")
    return parse_summary(summary), parse_requests(requests)
