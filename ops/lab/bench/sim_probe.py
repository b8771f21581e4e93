"""What the simulator itself says it did: OOM crashes, preemptions and tokens, read from its `/metrics`.

The benchmark trusts these over its own client-side view because a crash fails requests that a client
may see only as a timeout or a 503; the engine counts every one. Counters are summed over the
simulator's engines (its GPUs), and `SimCounters.since` turns two readings into what happened between.
"""

from __future__ import annotations

from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

OOM_CRASHES = "tidegate_sim_oom_crashes_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"


class SimProbeError(RuntimeError):
    """The simulator's /metrics could not be read or lacks a counter the benchmark needs."""


@dataclass(frozen=True)
class SimCounters:
    """One reading of the simulator's counters and gauges, summed (gauges: max for KV usage) over GPUs."""

    oom_crashes: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    running: int
    waiting: int
    kv_usage_max: float

    def since(self, earlier: SimCounters) -> SimCounters:
        """Counter increments from `earlier` to this reading; gauges as read now."""
        return SimCounters(
            oom_crashes=self.oom_crashes - earlier.oom_crashes,
            preemptions=self.preemptions - earlier.preemptions,
            prompt_tokens=self.prompt_tokens - earlier.prompt_tokens,
            generation_tokens=self.generation_tokens - earlier.generation_tokens,
            running=self.running,
            waiting=self.waiting,
            kv_usage_max=self.kv_usage_max,
        )


def parse_counters(text: str) -> SimCounters:
    """Sum each sample of interest over engines; fail naming the counter when the simulator lacks it."""
    sums: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            peaks[sample.name] = max(peaks.get(sample.name, 0.0), sample.value)
    needed = (OOM_CRASHES, PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS, RUNNING, WAITING, KV_USAGE)
    missing = [name for name in needed if name not in sums]
    if missing:
        raise SimProbeError(
            f"the simulator's /metrics lacks {', '.join(missing)}; the overload benchmark needs a "
            "`tidegate sim-vllm` recent enough to export them"
        )
    return SimCounters(
        oom_crashes=round(sums[OOM_CRASHES]),
        preemptions=round(sums[PREEMPTIONS]),
        prompt_tokens=round(sums[PROMPT_TOKENS]),
        generation_tokens=round(sums[GENERATION_TOKENS]),
        running=round(sums[RUNNING]),
        waiting=round(sums[WAITING]),
        kv_usage_max=peaks[KV_USAGE],
    )


def read_counters(base_url: str, timeout: float = 5.0) -> SimCounters:
    try:
        response = requests.get(f"{base_url}/metrics", timeout=timeout)
        response.raise_for_status()
    except requests.RequestException as exc:
        raise SimProbeError(f"cannot read {base_url}/metrics: {exc}") from exc
    return parse_counters(response.text)


def served_model(base_url: str, timeout: float = 5.0) -> str:
    """The model name the simulator serves, as `/v1/models` lists it first."""
    try:
        response = requests.get(f"{base_url}/v1/models", timeout=timeout)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (requests.RequestException, KeyError, IndexError, ValueError) as exc:
        raise SimProbeError(f"cannot read the served model from {base_url}/v1/models: {exc}") from exc
