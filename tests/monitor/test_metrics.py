"""Metrics read from Redis at scrape time, and the monitor's /metrics endpoint."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.control import Mode, set_mode
from shared.metrics import QUEUE_WAIT_SECONDS, build_registry, render, serve
from shared.policy import Policy
from shared.queue import TicketQueue
from tests.fake_clock import FakeClock
from tests.monitor.conftest import MonitorFactory
from tests.monitor.support import fill


def test_collector_reports_queue_alarm_mode_outcomes_and_workers(
    make_monitor: MonitorFactory, redis_client: Redis, policy: Policy, queue_name: str, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    fill(monitor.queue, 40, "complaint")
    fill(monitor.queue, 15, "archive_query")
    [claimed] = monitor.queue.claim("w1", 1)
    monitor.queue.finish(claimed.ticket.id, claimed.token, "done", result="ok")
    redis_client.hset(
        monitor.keys.worker("node1-gpu0"),
        mapping={
            "gpu": "0",
            "batch_limit": 12,
            "kv_usage": 0.4,
            "gpu_free_bytes": 2_000,
            "gpu_total_bytes": 8_000,
        },
    )
    redis_client.zadd(
        monitor.keys.workers, {"node1-gpu0": fake_clock.at + 30, "gone-gpu1": fake_clock.at - 1}
    )
    set_mode(redis_client, monitor.keys, Mode.CRITICAL_ONLY, actor="test")
    monitor.tick()

    registry = build_registry(redis_client, policy, queue_name, include_process=False)

    def value(name: str, labels: dict[str, str] | None = None) -> float | None:
        return registry.get_sample_value(name, {"queue": queue_name, **(labels or {})})

    assert value("tidegate_redis_up") == 1
    assert value("tidegate_queue_depth", {"type": "complaint"}) == 39
    assert value("tidegate_queue_depth", {"type": "archive_query"}) == 15
    assert value("tidegate_queue_depth_all_types") == 54
    assert value("tidegate_inflight") == 0
    assert value("tidegate_alarm_level") == 2
    assert value("tidegate_mode", {"mode": "critical-only"}) == 1
    assert value("tidegate_mode", {"mode": "normal"}) == 0
    assert value("tidegate_desired_workers") == int(
        redis_client.hget(monitor.keys.monitor_state, "desired_workers")
    )
    assert value("tidegate_tickets_submitted_total", {"type": "complaint"}) == 40
    assert value("tidegate_tickets_total", {"type": "complaint", "outcome": "submitted"}) is None
    assert value("tidegate_tickets_total", {"type": "complaint", "outcome": "done"}) == 1
    assert value("tidegate_tickets_total", {"type": "loan_approval", "outcome": "expired"}) == 0
    assert value("tidegate_workers_alive") == 1
    labels = {"worker": "node1-gpu0", "gpu": "0"}
    assert value("tidegate_batch_limit", labels) == 12
    assert value("tidegate_kv_cache_usage_ratio", labels) == 0.4
    assert value("tidegate_gpu_free_bytes", labels) == 2_000
    assert value("tidegate_gpu_total_bytes", labels) == 8_000
    assert value("tidegate_oldest_wait_seconds", {"type": "complaint"}) is not None


def test_collector_survives_an_unreachable_redis(policy: Policy) -> None:
    dead = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    registry = build_registry(dead, policy, "nowhere", include_process=False)
    assert registry.get_sample_value("tidegate_redis_up", {"queue": "nowhere"}) == 0
    assert registry.get_sample_value("tidegate_queue_depth_all_types", {"queue": "nowhere"}) is None


def test_metrics_endpoint_serves_redis_state_and_process_histograms(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    QUEUE_WAIT_SECONDS.labels(type="loan_approval").observe(0.3)
    registry = build_registry(redis_client, policy, queue_name)
    server, thread = serve(registry, 0, addr="127.0.0.1")
    try:
        body = requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).text
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert f'tidegate_queue_depth_all_types{{queue="{queue_name}"}} 0.0' in body
    assert 'tidegate_queue_wait_seconds_bucket{le="0.5",type="loan_approval"}' in body
    text, content_type = render(registry)
    assert content_type.startswith("text/plain") and b"tidegate_alarm_level" in text


def test_one_registry_reports_each_queue_under_its_own_label(
    redis_client: Redis, policy: Policy, queue_name: str, second_queue: str
) -> None:
    fill(TicketQueue(redis_client, policy, queue_name), 3, "complaint")
    fill(TicketQueue(redis_client, policy, second_queue), 5, "complaint")
    registry = build_registry(redis_client, policy, [queue_name, second_queue], include_process=False)
    body = render(registry)[0].decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    depth = {s.labels["queue"]: s.value for s in families["tidegate_queue_depth_all_types"].samples}
    assert depth == {queue_name: 3, second_queue: 5}
    assert {s.labels["queue"] for s in families["tidegate_redis_up"].samples} == {queue_name, second_queue}
    assert body.count("# TYPE tidegate_queue_depth gauge") == 1, "one family per name, a series per queue"
    for family in families.values():
        if family.name.startswith("tidegate_") and family.name != "tidegate_build_info":
            assert all("queue" in s.labels for s in family.samples), family.name
