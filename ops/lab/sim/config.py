"""The simulator's resolved settings: a profile with the operator's flag overrides applied and checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from ops.lab.sim.faults import FaultError, Faults
from ops.lab.sim.profiles import Profile, get_profile

E = TypeVar("E", bound=StrEnum)


class PreemptionMode(StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


class OomMode(StrEnum):
    PREEMPT = "preempt"
    CRASH = "crash"


class SchedulingPolicy(StrEnum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class ConfigError(ValueError):
    """A flag value the simulator cannot run with; the message names the flag and what is accepted."""


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulator process needs; times are in model seconds unless named otherwise."""

    profile: Profile
    model: str
    gpus: int
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prefill_tokens_per_s: float
    decode_step_s: float
    per_seq_slowdown_s: float
    decode_attention_s: float
    prefill_attention_s: float
    enable_chunked_prefill: bool
    preemption_mode: PreemptionMode
    oom_mode: OomMode
    oom_recovery_s: float
    scheduling_policy: SchedulingPolicy
    time_scale: float
    seed: int
    stop_median_tokens: int
    faults: Faults = field(default_factory=Faults)

    @property
    def block_size(self) -> int:
        return self.profile.block_size

    @property
    def block_bytes(self) -> int:
        return self.profile.block_bytes

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv_blocks * self.block_bytes

    @property
    def swap_blocks(self) -> int:
        return self.profile.swap_blocks

    @property
    def swap_s_per_block(self) -> float:
        return self.block_bytes / self.profile.swap_bytes_per_s


def build_config(
    profile: str = "a100-7b",
    *,
    model: str | None = None,
    gpus: int = 1,
    kv_blocks: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_model_len: int | None = None,
    prefill_tokens_per_s: float | None = None,
    decode_step_s: float | None = None,
    per_seq_slowdown_s: float | None = None,
    decode_attention_s: float | None = None,
    prefill_attention_s: float | None = None,
    enable_chunked_prefill: bool = True,
    preemption_mode: PreemptionMode | str = PreemptionMode.RECOMPUTE,
    oom_mode: OomMode | str = OomMode.PREEMPT,
    oom_recovery_s: float = 90.0,
    scheduling_policy: SchedulingPolicy | str = SchedulingPolicy.FCFS,
    time_scale: float = 1.0,
    seed: int = 0,
    stop_median_tokens: int | None = None,
    error_rate: float = 0.0,
    error_status: int = 500,
    extra_latency_s: float = 0.0,
) -> SimConfig:
    """Apply overrides to a profile and reject combinations vLLM itself would refuse to start with."""
    base = get_profile(profile)
    blocks = base.kv_blocks if kv_blocks is None else kv_blocks
    if max_model_len is None:
        # A cache shrunk by --kv-blocks alone gets a context that fits it, rather than a refusal to start.
        max_model_len = min(base.max_model_len, max(1, blocks) * base.block_size)
    config = SimConfig(
        profile=base,
        model=model or base.model,
        gpus=gpus,
        kv_blocks=blocks,
        max_num_seqs=base.max_num_seqs if max_num_seqs is None else max_num_seqs,
        max_num_batched_tokens=(
            base.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
        ),
        max_model_len=max_model_len,
        prefill_tokens_per_s=base.prefill_tokens_per_s
        if prefill_tokens_per_s is None
        else prefill_tokens_per_s,
        decode_step_s=base.decode_step_s if decode_step_s is None else decode_step_s,
        per_seq_slowdown_s=base.per_seq_slowdown_s if per_seq_slowdown_s is None else per_seq_slowdown_s,
        decode_attention_s=base.decode_attention_s if decode_attention_s is None else decode_attention_s,
        prefill_attention_s=base.prefill_attention_s if prefill_attention_s is None else prefill_attention_s,
        enable_chunked_prefill=enable_chunked_prefill,
        preemption_mode=_choice(PreemptionMode, preemption_mode, "--preemption-mode"),
        oom_mode=_choice(OomMode, oom_mode, "--oom-mode"),
        oom_recovery_s=oom_recovery_s,
        scheduling_policy=_choice(SchedulingPolicy, scheduling_policy, "--scheduling-policy"),
        time_scale=time_scale,
        seed=seed,
        stop_median_tokens=base.stop_median_tokens if stop_median_tokens is None else stop_median_tokens,
        faults=_faults(error_rate, error_status, extra_latency_s),
    )
    _validate(config)
    return config


def _faults(error_rate: float, error_status: int, extra_latency_s: float) -> Faults:
    try:
        return Faults(error_rate, error_status, extra_latency_s).checked()
    except FaultError as error:
        raise ConfigError(f"--{error.field.replace('_', '-')}: {error}") from None


def _choice(enum: type[E], value: E | str, flag: str) -> E:
    try:
        return enum(value)
    except ValueError:
        accepted = "|".join(member.value for member in enum)
        raise ConfigError(f"{flag}={value!r} is not accepted; use {accepted}") from None


def _validate(config: SimConfig) -> None:
    positive_ints = {
        "--gpus": config.gpus,
        "--kv-blocks": config.kv_blocks,
        "--max-num-seqs": config.max_num_seqs,
        "--max-num-batched-tokens": config.max_num_batched_tokens,
        "--max-model-len": config.max_model_len,
        "--stop-median-tokens": config.stop_median_tokens,
    }
    for flag, value in positive_ints.items():
        if value < 1:
            raise ConfigError(f"{flag}={value} is not accepted; it must be at least 1")
    positive_floats = {
        "--prefill-tokens-per-s": config.prefill_tokens_per_s,
        "--decode-step-s": config.decode_step_s,
        "--time-scale": config.time_scale,
    }
    for flag, number in positive_floats.items():
        if not number > 0:
            raise ConfigError(f"{flag}={number} is not accepted; it must be greater than 0")
    for flag, number in {
        "--per-seq-slowdown": config.per_seq_slowdown_s,
        "--decode-attention-s": config.decode_attention_s,
        "--prefill-attention-s": config.prefill_attention_s,
        "--oom-recovery-s": config.oom_recovery_s,
    }.items():
        if not number >= 0:
            raise ConfigError(f"{flag}={number} is not accepted; it must be 0 or more")
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise ConfigError(
            f"--max-num-batched-tokens={config.max_num_batched_tokens} is smaller than "
            f"--max-num-seqs={config.max_num_seqs}; vLLM needs at least one token per running sequence"
        )
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < config.max_model_len:
        raise ConfigError(
            f"--max-num-batched-tokens={config.max_num_batched_tokens} is smaller than "
            f"--max-model-len={config.max_model_len} with chunked prefill off; vLLM refuses this too "
            "(a longer prompt could never be scheduled): raise it, lower --max-model-len or keep "
            "--enable-chunked-prefill"
        )
    capacity = config.kv_blocks * config.block_size
    if config.max_model_len > capacity:
        raise ConfigError(
            f"--max-model-len={config.max_model_len} is larger than the {capacity} tokens the KV cache holds "
            f"({config.kv_blocks} blocks of {config.block_size}); lower it or raise --kv-blocks"
        )
    profile = config.profile
    used = profile.model_bytes + profile.overhead_bytes + config.kv_cache_bytes
    if used > profile.gpu_total_bytes:
        most = (profile.gpu_total_bytes - profile.model_bytes - profile.overhead_bytes) // config.block_bytes
        raise ConfigError(
            f"--kv-blocks={config.kv_blocks} does not fit on a {profile.gpu_name} beside the model; "
            f"at most {most} blocks fit"
        )
