"""Every tidegate metric, defined once; processes import what they observe and serve a registry.

Two kinds of figures, two sources:
- State whose truth lives in Redis (depth, in-flight, alarm level, mode, tickets by outcome, worker
  registry) is read at scrape time by `RedisStateCollector`, so the monitor, every API process and
  any replica report the same numbers and nothing has to be kept in sync. Because several
  processes export the same figure, queries take `max()` across them (never `sum()`): the alert
  rules, the KEDA trigger and the dashboard all do.
- Observations only one process sees (queue wait, time to first token, latency, vLLM errors) are
  ordinary prometheus-client objects in that process. With several uvicorn workers set
  PROMETHEUS_MULTIPROC_DIR and `build_registry` aggregates them with the multiprocess collector.
Every figure read from Redis carries a `queue` label (a monitor or API may serve several queues),
so queries fold exporters with `max by (queue)`.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import threading
from collections.abc import Iterable, Iterator, Sequence
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared import clock
from shared.breaker_store import BreakerStore, BreakerView
from shared.class_counts import class_counts
from shared.control import Mode, read_control_state
from shared.keys import QueueKeys
from shared.live_workers import WorkerView, read_live_workers
from shared.policy import Policy
from shared.queue import TicketQueue
from shared.rollout_report import rollout_metric_families

log = logging.getLogger(__name__)

OUTCOMES = ("done", "failed", "expired", "cancelled", "rejected")
"""Final outcomes, always exported (zero until seen) so dashboards and rate() see every series from the
start. Arrivals are a counter of their own (`tidegate_tickets_submitted_total`), so summing outcomes
counts each ticket once."""

SUBMITTED = "submitted"
"""The arrivals field of the counts hash (`<type>:submitted`)."""

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# ---- observed in the process that sees them (workers) --------------------------------------------
QUEUE_WAIT_SECONDS = Histogram(
    "tidegate_queue_wait_seconds",
    "Seconds a ticket waited in the queue before a worker claimed it.",
    ["type"],
    buckets=LATENCY_BUCKETS,
)
TIME_TO_FIRST_TOKEN_SECONDS = Histogram(
    "tidegate_time_to_first_token_seconds",
    "Seconds from submission to the first generated token.",
    ["type"],
    buckets=LATENCY_BUCKETS,
)
E2E_TIME_TO_FIRST_TOKEN_SECONDS = Histogram(
    "tidegate_e2e_time_to_first_token_seconds",
    "Seconds from a streamed OpenAI-style call's arrival at the API to its first token sent to the caller.",
    ["type"],
    buckets=(0.01, 0.025, *LATENCY_BUCKETS),
)
LATENCY_SECONDS = Histogram(
    "tidegate_latency_seconds",
    "Seconds from submission to the final answer.",
    ["type"],
    buckets=LATENCY_BUCKETS,
)
ROLLOUT_SHADOW = Counter(
    "tidegate_rollout_shadow",
    "Shadow calls to a rollout's candidate by outcome: recorded, failed, or skipped (level, breaker, busy).",
    ["outcome"],
)
VLLM_ERRORS = Counter(
    "tidegate_vllm_errors",
    "Failed calls to vLLM by kind (timeout, connection, http_5xx, http_4xx, oom, ...).",
    ["worker", "kind"],
)

PREEMPTIONS = Counter(
    "tidegate_preemptions",
    "Running tickets a worker put back in the queue (no attempt used) to start a waiting critical one.",
    ["worker", "type"],
)


# ---- read from Redis at scrape time ----------------------------------------------------------------
class RedisStateCollector(Collector):
    """Queue, alarm, mode, outcome and worker-registry figures of each queue, read when scraped.

    Each queue's families are read on their own (on a Cluster each queue may be on another node,
    so one unreachable queue reads `tidegate_redis_up{queue} 0` while the others still report),
    labelled with the queue, and merged into one family per name.
    """

    def __init__(self, client: redis.Redis, policy: Policy, queue_names: str | Sequence[str]) -> None:
        self.redis = client
        self.policy = policy
        names = [queue_names] if isinstance(queue_names, str) else list(queue_names)
        self.queues = [_QueueState(client, policy, name) for name in names]

    def describe(self) -> Iterable[Metric]:
        # Nothing to describe up front: registering must not touch Redis.
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "tidegate_redis_up", "1 when the last scrape could read Redis.", labels=["queue"]
        )
        merged: dict[str, Metric] = {}
        for queue in self.queues:
            try:
                families = queue.families()
            except redis.RedisError as exc:
                log.warning("metrics scrape could not read queue %s in Redis: %s", queue.name, exc)
                up.add_metric([queue.name], 0)
                continue
            up.add_metric([queue.name], 1)
            for family in families:
                _merge(merged, family, queue.name)
        yield up
        yield from merged.values()


def _merge(merged: dict[str, Metric], family: Metric, queue_name: str) -> None:
    """Add `family`'s samples, each labelled `queue=queue_name`, to the family of its name."""
    target = merged.setdefault(
        family.name, Metric(family.name, family.documentation, family.type, family.unit)
    )
    target.samples += [s._replace(labels={**s.labels, "queue": queue_name}) for s in family.samples]


class _QueueState:
    """One queue's figures in Redis."""

    def __init__(self, client: redis.Redis, policy: Policy, queue_name: str) -> None:
        self.name = queue_name
        self.redis = client
        self.policy = policy
        self.queue = TicketQueue(client, policy, queue_name)
        self.keys = QueueKeys(queue_name)

    def families(self) -> list[Metric]:
        stats = self.queue.stats()
        state, _ = read_control_state(self.redis, self.keys, self.policy.alarms)
        workers = read_live_workers(self.redis, self.keys, clock.now())
        out: list[Metric] = []

        depth = GaugeMetricFamily("tidegate_queue_depth", "Queued tickets by type.", labels=["type"])
        oldest = GaugeMetricFamily(
            "tidegate_oldest_wait_seconds", "Age of the oldest queued ticket by type.", labels=["type"]
        )
        for ticket_type in self.policy.type_names:
            depth.add_metric([ticket_type], stats.depth_by_type.get(ticket_type, 0))
            oldest.add_metric([ticket_type], stats.oldest_age_by_type.get(ticket_type, 0.0))
        out += [depth, oldest]
        out.append(_gauge("tidegate_queue_depth_all_types", "Queued tickets, all types.", stats.depth))
        out.append(_gauge("tidegate_inflight", "Tickets leased by workers right now.", stats.inflight))
        out.append(
            _gauge(
                "tidegate_alarm_level", "Depth alarm: 0 green, 1 yellow, 2 orange, 3 red.", int(state.level)
            )
        )
        mode = GaugeMetricFamily("tidegate_mode", "Operator mode (1 = the current one).", labels=["mode"])
        for candidate in Mode:
            mode.add_metric([candidate.value], 1 if candidate is state.mode else 0)
        out.append(mode)
        out.append(
            _gauge(
                "tidegate_desired_workers",
                "Workers the monitor asks for (scale-out signal).",
                state.desired_workers or 0,
            )
        )
        out.append(
            _gauge("tidegate_drain_rate", "Tickets leaving the queue per second.", state.drain_rate or 0.0)
        )
        out.append(
            _gauge(
                "tidegate_memory_guard",
                "1 while the Redis memory guard sheds non-critical intake.",
                1 if state.memory_guard else 0,
            )
        )
        out.append(
            _gauge(
                "tidegate_redis_memory_used_bytes",
                "Redis used_memory as the monitor last read it.",
                state.redis_used_memory or 0,
            )
        )
        out.append(
            _gauge(
                "tidegate_redis_memory_budget_bytes",
                "The memory guard's budget: the policy's, else Redis's maxmemory (0: none).",
                state.redis_memory_budget or 0,
            )
        )
        out += self._tickets(stats.counts)
        out.append(_gauge("tidegate_workers_alive", "Workers with a live heartbeat.", len(workers)))
        out += _worker_families(workers)
        out += _breaker_families(BreakerStore(self.redis, self.keys, self.policy.breaker).views())
        out += rollout_metric_families(self.redis, self.keys)
        return out

    def _tickets(self, counts: dict[str, int]) -> list[Metric]:
        family = CounterMetricFamily(
            "tidegate_tickets",
            "Tickets that reached a final outcome, by type and outcome (from Redis).",
            labels=["type", "outcome"],
        )
        arrivals = CounterMetricFamily(
            "tidegate_tickets_submitted",
            "Tickets submitted (admitted or shed), by type (from Redis).",
            labels=["type"],
        )
        seen = {(t, o): 0 for t in self.policy.type_names for o in (*OUTCOMES, SUBMITTED)}
        for field, value in counts.items():
            ticket_type, _, outcome = field.rpartition(":")
            if ticket_type and outcome in (*OUTCOMES, SUBMITTED):
                seen[(ticket_type, outcome)] = value
        for (ticket_type, outcome), value in sorted(seen.items()):
            if outcome == SUBMITTED:
                arrivals.add_metric([ticket_type], value)
            else:
                family.add_metric([ticket_type, outcome], value)
        return [family, arrivals, *self._class_counts(counts)]

    def _class_counts(self, counts: dict[str, int]) -> list[Metric]:
        shed = CounterMetricFamily(
            "tidegate_tickets_shed",
            "Tickets refused at submission, by type and shed code (from Redis).",
            labels=["type", "code"],
        )
        expired = CounterMetricFamily(
            "tidegate_tickets_expired_before_start",
            "Tickets a worker ended unstarted as their deadline could no longer be met (from Redis).",
            labels=["type"],
        )
        for ticket_type, figures in sorted(class_counts(counts, self.policy.type_names).items()):
            for code, value in sorted(figures.refused.items()):
                shed.add_metric([ticket_type, code], value)
            expired.add_metric([ticket_type], figures.expired_before_start)
        return [shed, expired]


def _breaker_families(views: list[BreakerView]) -> list[Metric]:
    level = GaugeMetricFamily(
        "tidegate_breaker_level",
        "Circuit breaker per inference endpoint: 0 closed, 1 instant (open), 2 sustained, 3 deep.",
        labels=["endpoint", "role"],
    )
    mismatch = GaugeMetricFamily(
        "tidegate_fallback_version_mismatch",
        "1 for a fallback whose model version differs from the primary's (it is never used).",
        labels=["endpoint"],
    )
    for view in views:
        summary = view.as_dict()
        level.add_metric([view.endpoint, summary["role"]], summary["level_value"])
        if summary["role"] == "fallback":
            mismatch.add_metric([view.endpoint], 1 if summary["fallback"] == "mismatched" else 0)
    return [level, mismatch]


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _worker_families(workers: list[WorkerView]) -> list[Metric]:
    specs = (
        ("tidegate_batch_limit", "In-flight batch limit the worker's sizer allows.", "batch_limit"),
        ("tidegate_gpu_free_bytes", "Free GPU memory the worker reports.", "gpu_free_bytes"),
        ("tidegate_gpu_total_bytes", "Total GPU memory the worker reports.", "gpu_total_bytes"),
        ("tidegate_kv_cache_usage_ratio", "Fraction of vLLM's KV cache in use (0..1).", "kv_usage"),
        ("tidegate_worker_inflight", "Tickets the worker is running.", "inflight"),
        (
            "tidegate_concurrency_limit",
            "In-flight limit the adaptive throttle allows beside critical tickets, while in force.",
            "concurrency_limit",
        ),
    )
    out: list[Metric] = []
    for name, documentation, attr in specs:
        family = GaugeMetricFamily(name, documentation, labels=["worker", "gpu"])
        for worker in workers:
            value = getattr(worker, attr)
            if value is not None:
                family.add_metric([worker.worker_id, worker.gpu], value)
        out.append(family)
    return out


# ---- registries and serving --------------------------------------------------------------------------
class _ProcessMetrics(Collector):
    """This process's own observations (the default registry: histograms, counters, process stats)."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


class BuildInfo(Collector):
    """`tidegate_build_info{version, python}` = 1, so a dashboard can tell which release each process runs."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "tidegate_build_info",
            "The tidegate release this process runs (always 1).",
            labels=["version", "python"],
        )
        family.add_metric([tidegate_version(), platform.python_version()], 1)
        yield family


def tidegate_version() -> str:
    try:
        return importlib.metadata.version("tidegate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_registry(
    client: redis.Redis | None = None,
    policy: Policy | None = None,
    queue_name: str | Sequence[str] = "default",
    *,
    include_process: bool = True,
) -> CollectorRegistry:
    """A registry for one /metrics endpoint: Redis state of each queue named (when a client is
    given) and local metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BuildInfo())
    if client is not None and policy is not None:
        registry.register(RedisStateCollector(client, policy, queue_name))
    if include_process:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        else:
            registry.register(_ProcessMetrics())
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The exposition text and its content type, for an HTTP handler (e.g. the API's /metrics)."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve(
    registry: CollectorRegistry, port: int, addr: str = "0.0.0.0"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve /metrics on a daemon thread; port 0 picks a free port (read it from server.server_port)."""
    return start_http_server(port, addr=addr, registry=registry)
