"""A KV cache too small for the load: vLLM-style preemption keeps every request alive; crash mode fails them."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests

from ops.lab.sim.process import SimulatorProcess
from tests.lab.sim.conftest import metric, token_ids
from tests.waiting import wait_until

# 40 blocks hold 640 tokens; each request grows to 100 + 400 = 500 tokens (32 blocks), so any two
# requests running together exhaust the cache before either finishes.
SMALL_CACHE: dict[str, Any] = {"kv_blocks": 40, "max_model_len": 512, "max_num_seqs": 8, "time_scale": 10}
REQUEST = {"prompt": token_ids(100), "max_tokens": 400, "ignore_eos": True}


def fire_together(base_url: str, count: int) -> list[requests.Response]:
    """Send `count` completions at the same moment and collect the responses."""
    barrier = threading.Barrier(count)
    responses: list[requests.Response] = []
    lock = threading.Lock()

    def send(index: int) -> None:
        barrier.wait()
        response = requests.post(
            f"{base_url}/v1/completions", json=REQUEST | {"request_id": f"kv-{index}"}, timeout=60
        )
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return responses


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_lets_every_request_finish(mode: str) -> None:
    with SimulatorProcess(**SMALL_CACHE, preemption_mode=mode) as sim:
        responses = fire_together(sim.base_url, 4)
        assert [response.status_code for response in responses] == [200] * 4
        assert all(response.json()["usage"]["completion_tokens"] == 400 for response in responses)
        assert metric(sim.base_url, "vllm:num_preemptions_total") >= 1
        assert metric(sim.base_url, "vllm:kv_cache_usage_perc") == 0.0
        assert metric(sim.base_url, "vllm:num_requests_running") == 0


def test_crash_mode_fails_in_flight_requests_then_refuses_traffic_until_recovered() -> None:
    with SimulatorProcess(**SMALL_CACHE, oom_mode="crash", oom_recovery_s=20) as sim:
        responses = fire_together(sim.base_url, 4)
        failed = [response for response in responses if response.status_code == 500]
        assert len(failed) >= 2
        assert all(response.status_code in (200, 500) for response in responses)
        error = failed[0].json()["error"]
        assert "CUDA out of memory" in error["message"]
        assert error["type"] == "InternalServerError" and error["code"] == 500

        refused = requests.post(f"{sim.base_url}/v1/completions", json=REQUEST, timeout=30)
        assert refused.status_code == 503
        assert 1 <= int(refused.headers["Retry-After"]) <= 2  # 20 model seconds at time scale 10
        assert "CUDA out of memory" in refused.json()["error"]["message"]
        assert requests.get(f"{sim.base_url}/health", timeout=5).status_code == 503
        assert metric(sim.base_url, "vllm:num_preemptions_total") == 0
        assert metric(sim.base_url, "vllm:kv_cache_usage_perc") == 0.0

        wait_until(
            lambda: requests.get(f"{sim.base_url}/health", timeout=5).status_code == 200,
            10,
            "the simulated GPU to recover",
        )
        recovered = requests.post(
            f"{sim.base_url}/v1/completions", json=REQUEST | {"max_tokens": 5}, timeout=30
        )
        assert recovered.status_code == 200
        assert "Simulated CUDA out of memory on GPU 0" in sim.log_text()
