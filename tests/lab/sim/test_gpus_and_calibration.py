"""Several simulated GPUs behind one endpoint, their NVML-like memory, and the profile's calibration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from ops.lab.sim.process import SimulatorProcess
from ops.lab.sim.profiles import A100_7B
from tests.lab.sim.conftest import complete, metric, scrape, token_ids
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def two_gpus() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(gpus=2, time_scale=1, kv_blocks=512, max_model_len=8192) as process:
        yield process


def test_requests_spread_over_gpus_and_metrics_carry_an_engine_label(two_gpus: SimulatorProcess) -> None:
    url = f"{two_gpus.base_url}/v1/completions"
    body = {"prompt": token_ids(40), "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with (
        requests.post(url, json=body, stream=True, timeout=10) as first,
        requests.post(url, json=body, stream=True, timeout=10) as second,
    ):
        first_lines, second_lines = first.iter_lines(), second.iter_lines()
        assert next(first_lines) and next(second_lines)
        samples = scrape(two_gpus.base_url)
        running = {s.labels["engine"]: s.value for s in samples["vllm:num_requests_running"]}
        assert running == {"0": 1.0, "1": 1.0}
        for name in ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:cache_config_info"):
            engines = {s.labels["engine"] for s in samples[name]}
            assert engines == {"0", "1"}, name
            assert all(s.labels["model_name"] == A100_7B.model for s in samples[name])
        gpus = requests.get(f"{two_gpus.base_url}/sim/gpus", timeout=5).json()
        assert [gpu["kv_blocks_used"] > 0 for gpu in gpus] == [True, True]
    wait_until(
        lambda: metric(two_gpus.base_url, "vllm:num_requests_running") == 0, 5, "both streams to abort"
    )


def test_sim_gpus_report_memory_as_nvml_would(two_gpus: SimulatorProcess) -> None:
    gpus = requests.get(f"{two_gpus.base_url}/sim/gpus", timeout=5).json()
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    gpu = gpus[0]
    kv_cache = 512 * A100_7B.block_bytes
    assert gpu["total_bytes"] == A100_7B.gpu_total_bytes
    assert gpu["model_bytes"] == A100_7B.model_bytes and gpu["kv_blocks_total"] == 512
    assert gpu["used_bytes"] == A100_7B.model_bytes + A100_7B.overhead_bytes + kv_cache
    assert gpu["free_bytes"] == gpu["total_bytes"] - gpu["used_bytes"]


def test_pressure_from_another_process_lowers_free_memory(two_gpus: SimulatorProcess) -> None:
    base = two_gpus.base_url
    before = requests.get(f"{base}/sim/gpus", timeout=5).json()[1]
    eaten = 10 * 1024**3
    after = requests.post(f"{base}/sim/gpus/1/pressure", json={"extra_used_bytes": eaten}, timeout=5).json()
    assert after["free_bytes"] == before["free_bytes"] - eaten
    assert requests.get(f"{base}/sim/gpus", timeout=5).json()[0]["free_bytes"] == before["free_bytes"]
    too_much = requests.post(
        f"{base}/sim/gpus/1/pressure", json={"extra_used_bytes": before["total_bytes"]}, timeout=5
    )
    assert too_much.status_code == 400 and "extra_used_bytes" in too_much.json()["error"]["message"]
    negative = requests.post(f"{base}/sim/gpus/1/pressure", json={"extra_used_bytes": -1}, timeout=5)
    assert negative.status_code == 400
    missing = requests.post(f"{base}/sim/gpus/7/pressure", json={"extra_used_bytes": 0}, timeout=5)
    assert missing.status_code == 404 and "GPUs run from 0 to 1" in missing.json()["error"]["message"]
    requests.post(f"{base}/sim/gpus/1/pressure", json={"extra_used_bytes": 0}, timeout=5)


def test_default_profile_keeps_the_seed_latencies_over_http() -> None:
    """A lone 500-token ticket takes 0.4 model seconds and a 16k one 3.2, whatever the time scale."""
    with SimulatorProcess(time_scale=50) as sim:
        assert (
            complete(sim.base_url, prompt=token_ids(500), max_tokens=128, ignore_eos=True).status_code == 200
        )
        short = metric(sim.base_url, "vllm:e2e_request_latency_seconds_sum")
        assert (
            complete(sim.base_url, prompt=token_ids(16_000), max_tokens=128, ignore_eos=True).status_code
            == 200
        )
        long = metric(sim.base_url, "vllm:e2e_request_latency_seconds_sum") - short
    assert short == pytest.approx(0.4, rel=0.03)
    assert long == pytest.approx(3.2, rel=0.03)
