"""Reading the simulator's counters: OOM crashes are exported, and a missing counter is named."""

from __future__ import annotations

import threading

import pytest
import requests

from ops.lab.bench.sim_probe import SimProbeError, parse_counters, read_counters, served_model
from ops.lab.sim.process import SimulatorProcess


def test_a_crash_counts_once_and_tokens_are_counted() -> None:
    # 40 blocks hold 640 tokens; requests growing to 500 tokens each cannot run together.
    with SimulatorProcess(
        kv_blocks=40, max_model_len=512, max_num_seqs=8, time_scale=20, oom_mode="crash", oom_recovery_s=1
    ) as sim:
        before = read_counters(sim.base_url)
        assert before.oom_crashes == 0
        body = {"prompt": [1] * 100, "max_tokens": 400, "ignore_eos": True}
        threads = [
            threading.Thread(
                target=requests.post, args=(f"{sim.base_url}/v1/completions",), kwargs={"json": body}
            )
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        after = read_counters(sim.base_url)
        assert after.since(before).oom_crashes == 1
        assert served_model(sim.base_url) == "togethercomputer/LLaMA-2-7B-32K"


def test_a_simulator_without_the_crash_counter_is_refused_by_name() -> None:
    text = "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total 0.0\n"
    with pytest.raises(SimProbeError, match="tidegate_sim_oom_crashes_total"):
        parse_counters(text)
