"""The worker's metrics, fed from its lifecycle hooks (claimed, answered, vLLM error).

Latency histograms and error counters are the ones `shared/metrics.py` defines for every
process. The per-worker gauges (batch limit, GPU memory, KV usage, in-flight) are read from the
worker's live state when scraped, under the same names the monitor exports from the registry,
so dashboards can take `max by (worker, gpu)` over either source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.metrics import (
    LATENCY_SECONDS,
    QUEUE_WAIT_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
    VLLM_ERRORS,
    build_registry,
)
from shared.models import Ticket


def observe_claim(ticket: Ticket) -> None:
    if ticket.queue_wait_seconds is not None:
        QUEUE_WAIT_SECONDS.labels(type=ticket.type).observe(max(ticket.queue_wait_seconds, 0.0))


def observe_answer(ticket: Ticket, first_token_at: float | None, finished_at: float) -> None:
    if first_token_at is not None:
        TIME_TO_FIRST_TOKEN_SECONDS.labels(type=ticket.type).observe(
            max(first_token_at - ticket.created_at, 0.0)
        )
    LATENCY_SECONDS.labels(type=ticket.type).observe(max(finished_at - ticket.created_at, 0.0))


def count_vllm_error(worker_id: str, kind: str) -> None:
    VLLM_ERRORS.labels(worker=worker_id, kind=kind).inc()


@dataclass(frozen=True)
class GaugeSnapshot:
    batch_limit: int
    inflight: int
    kv_usage: float | None
    gpu_free_bytes: int | None
    gpu_total_bytes: int | None
    concurrency_limit: int | None = None
    """The adaptive throttle's ceiling on the batch beside critical tickets; None while not in force."""


class WorkerGauges(Collector):
    """This worker's own gauges, read from `snapshot()` at scrape time."""

    def __init__(self, worker_id: str, gpu: int, snapshot: Callable[[], GaugeSnapshot]) -> None:
        self.labels = [worker_id, str(gpu)]
        self.snapshot = snapshot

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        state = self.snapshot()
        specs: tuple[tuple[str, str, float | None], ...] = (
            ("tidegate_batch_limit", "In-flight batch limit the worker's sizer allows.", state.batch_limit),
            ("tidegate_worker_inflight", "Tickets the worker is running.", state.inflight),
            (
                "tidegate_concurrency_limit",
                "In-flight limit the adaptive throttle allows beside critical tickets, while in force.",
                state.concurrency_limit,
            ),
            ("tidegate_kv_cache_usage_ratio", "Fraction of vLLM's KV cache in use (0..1).", state.kv_usage),
            ("tidegate_gpu_free_bytes", "Free GPU memory the worker reports.", state.gpu_free_bytes),
            ("tidegate_gpu_total_bytes", "Total GPU memory the worker reports.", state.gpu_total_bytes),
        )
        for name, documentation, value in specs:
            family = GaugeMetricFamily(name, documentation, labels=["worker", "gpu"])
            if value is not None:
                family.add_metric(self.labels, value)
            yield family


def worker_registry(gauges: WorkerGauges) -> CollectorRegistry:
    """What a worker's /metrics serves: its own gauges and this process's histograms and counters."""
    registry = build_registry(include_process=True)
    registry.register(gauges)
    return registry
