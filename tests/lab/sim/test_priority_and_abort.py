"""Priority scheduling order, and aborts on client disconnect freeing KV blocks at once."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from functools import partial

import pytest
import requests

from ops.lab.sim.process import SimulatorProcess
from tests.lab.sim.conftest import metric, token_ids
from tests.waiting import wait_until


def finish_order(log: str) -> list[str]:
    return re.findall(r"Finished request cmpl-(\S+) on GPU", log)


def waiting_is(base_url: str, count: int) -> bool:
    return metric(base_url, "vllm:num_requests_waiting") == count


def post_in_background(base_url: str, body: dict[str, object], results: dict[str, int]) -> threading.Thread:
    def send() -> None:
        response = requests.post(f"{base_url}/v1/completions", json=body, timeout=60)
        results[str(body["request_id"])] = response.status_code

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_priority_policy_serves_lower_priority_values_first() -> None:
    with SimulatorProcess(
        scheduling_policy="priority", max_num_seqs=1, time_scale=5, max_model_len=4096
    ) as sim:
        results: dict[str, int] = {}
        blocker = {"prompt": "hold the GPU", "max_tokens": 4000, "ignore_eos": True, "request_id": "blocker"}
        threads = [post_in_background(sim.base_url, blocker, results)]
        wait_until(lambda: metric(sim.base_url, "vllm:num_requests_running") == 1, 5, "the blocker to run")
        arrivals = [("archive-1", 2), ("archive-2", 2), ("complaint-1", 1), ("loan-1", 0), ("loan-2", 0)]
        for queued, (request_id, priority) in enumerate(arrivals, start=1):
            body = {"prompt": request_id, "max_tokens": 20, "ignore_eos": True, "request_id": request_id}
            threads.append(post_in_background(sim.base_url, body | {"priority": priority}, results))
            wait_until(partial(waiting_is, sim.base_url, queued), 5, f"{request_id} to queue")
        assert metric(sim.base_url, "vllm:num_requests_running") == 1, "the blocker must outlast the queueing"
        for thread in threads:
            thread.join()
        assert set(results.values()) == {200}
        order = finish_order(sim.log_text())
        assert order == ["blocker", "loan-1", "loan-2", "complaint-1", "archive-1", "archive-2"]


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[SimulatorProcess]:
    """Real time, one sequence at a time: a long request stays running for many seconds."""
    with SimulatorProcess(time_scale=1, max_num_seqs=1) as process:
        yield process


def blocks_in_use(sim: SimulatorProcess) -> int:
    return int(requests.get(f"{sim.base_url}/sim/gpus", timeout=5).json()[0]["kv_blocks_used"])


def test_a_plain_request_is_aborted_when_its_client_disconnects(slow_sim: SimulatorProcess) -> None:
    url = f"{slow_sim.base_url}/v1/completions"
    long_request = {"prompt": token_ids(300), "max_tokens": 20_000, "ignore_eos": True}
    aborts_before = metric(slow_sim.base_url, "tidegate_sim_aborted_requests_total")
    with pytest.raises(requests.ReadTimeout):
        requests.post(url, json=long_request, headers={"X-Request-Id": "gone-plain"}, timeout=(5, 0.5))
    wait_until(lambda: blocks_in_use(slow_sim) == 0, 3, "the aborted request's blocks")
    assert metric(slow_sim.base_url, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(slow_sim.base_url, "vllm:num_requests_running") == 0
    assert metric(slow_sim.base_url, "tidegate_sim_aborted_requests_total") == aborts_before + 1
    # vLLM 0.32 does not count an aborted request as finished "abort" (ops/lab/vllm_cpu/OBSERVED.md).
    assert metric(slow_sim.base_url, "vllm:request_success_total", finished_reason="abort") == 0
    assert "Aborted request cmpl-gone-plain on GPU 0 (client disconnected)" in slow_sim.log_text()


def test_a_stream_is_aborted_when_its_client_disconnects(slow_sim: SimulatorProcess) -> None:
    url = f"{slow_sim.base_url}/v1/completions"
    body = {"prompt": token_ids(300), "max_tokens": 20_000, "ignore_eos": True, "stream": True}
    with requests.post(
        url, json=body, headers={"X-Request-Id": "gone-stream"}, stream=True, timeout=10
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith(b"data: ")
        assert blocks_in_use(slow_sim) > 0
        assert metric(slow_sim.base_url, "vllm:kv_cache_usage_perc") > 0
    wait_until(lambda: blocks_in_use(slow_sim) == 0, 3, "the aborted stream's blocks")
    assert metric(slow_sim.base_url, "vllm:kv_cache_usage_perc") == 0.0
    assert "Aborted request cmpl-gone-stream on GPU 0 (client disconnected)" in slow_sim.log_text()


def test_a_waiting_request_is_dropped_when_its_client_disconnects(slow_sim: SimulatorProcess) -> None:
    url = f"{slow_sim.base_url}/v1/completions"
    body = {"prompt": "hold", "max_tokens": 20_000, "ignore_eos": True, "stream": True}
    with requests.post(url, json=body, stream=True, timeout=10) as holder:
        lines = holder.iter_lines()  # dropping this iterator would close the connection
        assert next(lines).startswith(b"data: ")
        with pytest.raises(requests.ReadTimeout):
            requests.post(url, json={"prompt": "queued", "request_id": "gone-waiting"}, timeout=(5, 0.5))
        wait_until(
            lambda: metric(slow_sim.base_url, "vllm:num_requests_waiting") == 0,
            3,
            "the waiting request to leave the queue",
        )
        assert metric(slow_sim.base_url, "vllm:num_requests_running") == 1
    wait_until(lambda: blocks_in_use(slow_sim) == 0, 3, "the holder's blocks")
    assert "Aborted request cmpl-gone-waiting on GPU 0 (client disconnected)" in slow_sim.log_text()
