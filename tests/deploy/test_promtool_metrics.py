"""`promtool check metrics` passes on a scrape of each process's /metrics: the API (with HTTP
request metrics), the monitor (queue state read from Redis) and a worker (its own gauges), each with
figures in it rather than empty families."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from producer.producer import Producer
from shared.metrics import build_registry, serve
from tests.producer.api.conftest import Api, api, api_settings, branch_key
from worker.registry import WorkerRegistry
from worker.telemetry import GaugeSnapshot, WorkerGauges, observe_claim, worker_registry

__all__ = ["api", "api_settings", "branch_key"]  # the API fixtures, imported so pytest finds them

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus; ops/test.sh does)"
)


def promtool_check(exposition: str) -> None:
    assert PROMTOOL is not None
    out = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"promtool check metrics:\n{out.stdout}{out.stderr}"


def families(exposition: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(exposition)}


@pytest.fixture
def busy_queue(producer: Producer, redis_client: Redis) -> Producer:
    """A queue with tickets of every type and a live worker, so every family has samples."""
    for ticket_type in producer.policy.type_names:
        producer.submit({"type": ticket_type, "branch_id": "0412", "prompt": "hello"})
    registry = WorkerRegistry(redis_client, producer.queue.keys, "node-a-gpu0", heartbeat_seconds=20)
    registry.heartbeat(
        {"gpu": 0, "inflight": 1, "batch_limit": 8, "kv_usage": 0.5, "gpu_free_bytes": 1 << 30}
    )
    return producer


def test_api_metrics_pass_promtool(api: Api, branch_key: str, busy_queue: Producer) -> None:
    with api.session(branch_key) as branch:
        branch.get(api.url("/v1/queues"), timeout=5)
        branch.get(api.url("/v1/tickets/nonexistent"), timeout=5)
    body = requests.get(api.url("/metrics"), timeout=5).text
    promtool_check(body)
    assert {
        "tidegate_http_requests",
        "tidegate_http_request_duration_seconds",
        "tidegate_http_answer_seconds",
        "tidegate_build_info",
    } <= families(body)
    assert 'handler="/v1/tickets/{ticket_id}",method="GET",status="404"' in body


def test_monitor_metrics_pass_promtool(redis_client: Redis, busy_queue: Producer, queue_name: str) -> None:
    server, _ = serve(build_registry(redis_client, busy_queue.policy, queue_name), 0, addr="127.0.0.1")
    try:
        body = requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).text
    finally:
        server.shutdown()
        server.server_close()
    promtool_check(body)
    assert {"tidegate_queue_depth_all_types", "tidegate_tickets", "tidegate_tickets_submitted"} <= families(
        body
    )
    assert f'tidegate_kv_cache_usage_ratio{{gpu="0",queue="{queue_name}",worker="node-a-gpu0"}} 0.5' in body


def test_worker_metrics_pass_promtool(busy_queue: Producer) -> None:
    (claimed,) = busy_queue.queue.claim("w-test", 1)
    observe_claim(claimed.ticket)  # so the histograms have samples too
    gauges = WorkerGauges("node-a-gpu0", 0, lambda: GaugeSnapshot(8, 1, 0.5, 1 << 30, 2 << 30))
    server, _ = serve(worker_registry(gauges), 0, addr="127.0.0.1")
    try:
        body = requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).text
    finally:
        server.shutdown()
        server.server_close()
    promtool_check(body)
    assert {"tidegate_kv_cache_usage_ratio", "tidegate_batch_limit", "tidegate_build_info"} <= families(body)
