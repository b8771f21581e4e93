"""The batch limit follows the simulated GPU's free memory and vLLM's KV usage, within [1, 32]."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import cast

import requests
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.keys import QueueKeys
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker, sim_metric

GIB = 1024**3


def record(history: list[int], limit: int) -> int:
    history.append(limit)
    return limit


def pressure(sim: SimulatorProcess, extra_bytes: int) -> int:
    """Let "another process" hold `extra_bytes` on GPU 0; returns the GPU's free bytes."""
    response = requests.post(
        f"{sim.base_url}/sim/gpus/0/pressure", json={"extra_used_bytes": extra_bytes}, timeout=5
    )
    response.raise_for_status()
    return int(response.json()["free_bytes"])


def test_limit_follows_free_gpu_memory(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    redis_client: Redis,
    queue_name: str,
) -> None:
    sim = simulator()
    running = start_worker(sim.base_url)
    worker = running.worker
    per_ticket = worker.sizer.per_ticket_tokens() * worker.config.model_spec.kv_bytes_per_token
    free = int(requests.get(f"{sim.base_url}/sim/gpus", timeout=5).json()[0]["free_bytes"])
    expected = min(int(free * 0.85 // per_ticket), 32)
    assert 1 < expected < 32, "the profile should make memory the binding limit"
    wait_until(lambda: worker.sizer.limit == expected, 5, f"limit {expected} from {free} free bytes")

    squeezed = pressure(sim, free - 3 * per_ticket)
    wait_until(
        lambda: worker.sizer.limit == int(squeezed * 0.85 // per_ticket),
        5,
        "the limit to fall with free memory",
    )
    assert worker.sizer.limit == 2

    assert pressure(sim, free) == 0  # nothing left: the floor holds
    wait_until(lambda: worker.sizer.limit == 1, 5, "the limit to reach its floor of 1")

    history: list[int] = []
    pressure(sim, 0)
    wait_until(
        lambda: record(history, worker.sizer.limit) == expected,
        10,
        "the limit to recover",
    )
    assert max(history) <= expected

    # The registry shows what the worker decided, for the monitor and dashboards.
    keys = QueueKeys(queue_name)
    wait_until(
        lambda: redis_client.hget(keys.worker(worker.config.worker_id), "batch_limit") == str(expected),
        5,
        "the heartbeat to publish the limit",
    )
    published = cast("dict[str, str]", redis_client.hgetall(keys.worker(worker.config.worker_id)))
    assert int(published["gpu_free_bytes"]) > 0 and int(published["gpu_total_bytes"]) == 80 * GIB
    assert float(published["kv_usage"]) == 0.0


def test_limit_shrinks_under_kv_load_and_recovers(
    simulator: Callable[..., SimulatorProcess], start_worker: Callable[..., RunningWorker]
) -> None:
    # 128 blocks of 16 tokens: three long requests fill more than 85% of it.
    sim = simulator(time_scale=1, kv_blocks=128, max_model_len=2048)
    running = start_worker(sim.base_url, gpu_backend=None, max_batch=32)
    worker = running.worker
    for _ in range(20):
        worker.sizer.observe(40)  # short tickets: the KV cache alone would allow the maximum
    wait_until(lambda: worker.sizer.limit == 32, 5, "an idle cache to allow the full batch")

    def load() -> None:
        body = {"prompt": "x " * 600, "max_tokens": 700, "ignore_eos": True, "model": worker.primary.model}
        requests.post(f"{sim.base_url}/v1/completions", json=body, timeout=60)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for thread in threads:
        thread.start()
    history: list[int] = []
    wait_until(
        lambda: (
            record(history, worker.sizer.limit)
            and sim_metric(sim.base_url, "vllm:kv_cache_usage_perc") > 0.85
        ),
        10,
        "the load to pass the watermark",
    )
    wait_until(lambda: record(history, worker.sizer.limit) <= 2, 10, "the limit to shrink")
    for thread in threads:
        thread.join(60)
    wait_until(lambda: worker.sizer.limit == 32, 10, "the limit to recover once vLLM is idle")
    assert min(history) >= 1 and max(history) <= 32
