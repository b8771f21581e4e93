"""How many tickets per second the simulated GPUs drain: the figure a load of "100%" refers to.

Estimated from the simulator's settings and the workload's sizes rather than measured, so it is
known before anything starts and the same on every machine. The model is the simulator's own step
time (`decode_step_s + per_seq_slowdown_s × running + prefill_tokens / prefill_tokens_per_s`, plus
attention over the context) at the batch the workers' sizer will choose from free GPU memory:

    each step decodes one token for each of B running tickets, and prefill is paid once per ticket, so
    per GPU  X = 1 / (out × (decode + slowdown × B) / B + prompt / prefill_speed + attention)
    attention = decode_attention × out × (prompt + out / 2) + prefill_attention × E[prompt²] / 2

times `time_scale` for wall seconds, times the number of GPUs. The run's measured drain rate (the
monitor's `drain_rate`) is printed next to it, so the estimate is checked on every run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ops.lab.sim.config import SimConfig
from ops.lab.traffic.workload import WorkloadSpec, sample_tickets
from worker.batch_sizer import memory_limit

SAMPLE_TICKETS = 4000


@dataclass(frozen=True)
class CapacityEstimate:
    tickets_per_s: float
    """All GPUs together, wall-clock."""
    per_gpu_tickets_per_s: float
    batch: int
    """Tickets each worker keeps in flight (the sizer's memory limit at the mean ticket size)."""
    mean_prompt_tokens: float
    mean_output_tokens: float
    mean_max_tokens: float

    def describe(self) -> str:
        return (
            f"{self.per_gpu_tickets_per_s:.1f}/s per GPU at batch {self.batch}, mean prompt "
            f"{self.mean_prompt_tokens:.0f} tokens, mean answer {self.mean_output_tokens:.0f} tokens"
        )


def _mean_output_tokens(config: SimConfig, max_tokens: list[int], seed: int) -> float:
    """E[min(natural stop, max_tokens)]: the simulator stops at a log-normal length unless capped."""
    rng = random.Random(f"{seed}:stops")
    mu = math.log(config.profile.stop_median_tokens)
    sigma = config.profile.stop_sigma
    total = sum(min(max(1, round(rng.lognormvariate(mu, sigma))), cap) for cap in max_tokens)
    return total / len(max_tokens)


def estimate_capacity(
    config: SimConfig,
    spec: WorkloadSpec,
    *,
    gpus: int,
    max_batch: int,
    safety_margin: float = 0.15,
    kv_bytes_per_token: int | None = None,
) -> CapacityEstimate:
    """Tickets per second `gpus` simulated GPUs with `config` drain for `spec`'s tickets.

    `kv_bytes_per_token` is what the worker assumes (default: the simulator profile's own figure).
    """
    if gpus < 1:
        raise ValueError(f"gpus={gpus} is not accepted; use at least 1")
    sample = sample_tickets(spec, SAMPLE_TICKETS)
    prompt = sum(t.prompt_tokens for t in sample) / len(sample)
    # Prefill attention grows with the square of the prompt, so the long tail weighs in through E[p²].
    prompt_squared = sum(t.prompt_tokens**2 for t in sample) / len(sample)
    caps = [t.max_tokens for t in sample]
    max_tokens = sum(caps) / len(caps)
    output = _mean_output_tokens(config, caps, spec.seed)
    profile = config.profile
    free_bytes = (
        profile.gpu_total_bytes - profile.model_bytes - profile.overhead_bytes - config.kv_cache_bytes
    )
    per_token = kv_bytes_per_token or profile.kv_bytes_per_token
    per_ticket_bytes = max(1, round((prompt + max_tokens) * per_token))
    batch = min(memory_limit(free_bytes, per_ticket_bytes, safety_margin, max_batch), config.max_num_seqs)
    kv_fit = max(1, int(config.kv_blocks * config.block_size // (prompt + output)))
    batch = max(1, min(batch, kv_fit))
    step = config.decode_step_s + config.per_seq_slowdown_s * batch
    attention = (
        config.decode_attention_s * output * (prompt + output / 2)
        + config.prefill_attention_s * prompt_squared / 2
    )
    seconds_per_ticket = output * step / batch + prompt / config.prefill_tokens_per_s + attention
    per_gpu = config.time_scale / seconds_per_ticket
    return CapacityEstimate(
        tickets_per_s=per_gpu * gpus,
        per_gpu_tickets_per_s=per_gpu,
        batch=batch,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
        mean_max_tokens=max_tokens,
    )
