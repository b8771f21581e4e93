"""Reading vLLM's /metrics: the exposition text of vLLM itself, and the simulator's over HTTP."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import requests

from ops.lab.sim.process import SimulatorProcess
from worker.vllm_metrics import VllmMetricsError, parse_metrics, scrape

# The shape vLLM 0.11 exports with two data-parallel engines (trimmed to the series the worker reads).
VLLM_TEXT = """
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions_total{engine="1",model_name="m"} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 9.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",gpu_memory_utilization="0.9",num_gpu_blocks="3000"} 1.0
"""


def test_one_engine_of_several() -> None:
    m = parse_metrics(VLLM_TEXT, engine="0")
    assert (m.kv_usage, m.num_gpu_blocks, m.block_size, m.running, m.waiting) == (0.5, 1000, 16, 3, 2)
    assert m.preemptions == 7.0
    assert m.free_kv_tokens == 8000


def test_all_engines_when_the_worker_has_none_of_its_own() -> None:
    m = parse_metrics(VLLM_TEXT, engine="5")
    assert (m.num_gpu_blocks, m.running, m.waiting) == (4000, 4, 2)
    assert m.kv_usage == pytest.approx((0.5 * 1000 + 0.25 * 3000) / 4000)


def test_old_metric_name_and_missing_cache_info() -> None:
    m = parse_metrics('vllm:gpu_cache_usage_perc{model_name="m"} 0.75\n')
    assert m.kv_usage == 0.75
    assert m.free_kv_tokens is None


def test_text_without_vllm_metrics_is_an_error() -> None:
    with pytest.raises(VllmMetricsError, match="no vllm: metrics"):
        parse_metrics("process_cpu_seconds_total 1.0\n")


def test_scrape_the_simulator(simulator: Callable[..., SimulatorProcess]) -> None:
    sim = simulator(kv_blocks=500)
    with requests.Session() as session:
        m = scrape(session, sim.base_url, engine="0")
        assert (m.kv_usage, m.num_gpu_blocks, m.block_size, m.running) == (0.0, 500, 16, 0)
        with pytest.raises(VllmMetricsError, match="/metrics"):
            scrape(session, "http://127.0.0.1:1", timeout=0.5)
