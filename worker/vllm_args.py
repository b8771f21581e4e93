"""The vLLM launch flags that fit this node and this worker (`tidegate worker --print-vllm-args`).

- `--max-num-seqs = min(4 × GPUs, 32)`: vLLM's running batch; beyond it requests queue inside
  vLLM, where tidegate's priorities no longer apply.
- `--max-model-len`: the longest context, no more than the model supports, the policy admits and
  80% of the KV cache holds, so one maximal ticket leaves 20% headroom for the others.
- `--gpu-memory-utilization = 1 − safety margin`: the same 15% margin the batch sizer keeps.
- `--enable-chunked-prefill` (a long prompt does not stall decoding) and
  `--scheduling-policy priority` (the `priority` each request carries is honoured).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass

from worker.model_spec import ModelSpec

SEQS_PER_GPU = 4
MAX_NUM_SEQS_CAP = 32
CONTEXT_HEADROOM = 0.20
BLOCK_SIZE = 16
"""vLLM's KV block size on GPUs; `--max-model-len` is rounded down to whole blocks."""


@dataclass(frozen=True)
class VllmLaunchArgs:
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "priority"

    def argv(self) -> list[str]:
        args = [
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-model-len",
            str(self.max_model_len),
            "--gpu-memory-utilization",
            f"{self.gpu_memory_utilization:.2f}",
        ]
        if self.enable_chunked_prefill:
            args.append("--enable-chunked-prefill")
        return [*args, "--scheduling-policy", self.scheduling_policy]

    def command_line(self) -> str:
        return shlex.join(self.argv())

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def kv_cache_tokens(gpu_total_bytes: int, utilization: float, spec: ModelSpec) -> int:
    """Tokens vLLM's pre-allocated KV cache would hold on one GPU of `gpu_total_bytes`."""
    budget = int(gpu_total_bytes * utilization) - spec.weight_bytes
    return max(budget, 0) // spec.kv_bytes_per_token


def launch_args(
    *,
    gpus: int,
    spec: ModelSpec,
    safety_margin: float,
    context_limit_tokens: int,
    gpu_total_bytes: int | None,
) -> tuple[VllmLaunchArgs, list[str]]:
    """The flags, and notes for the operator about what bounded them."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus} is not accepted; it must be at least 1")
    utilization = round(1.0 - safety_margin, 2)
    notes: list[str] = []
    bounds = {
        "the model's max_position_embeddings": spec.max_position_embeddings,
        "the policy's context_limit_tokens": context_limit_tokens,
    }
    if gpu_total_bytes is not None:
        tokens = kv_cache_tokens(gpu_total_bytes, utilization, spec)
        bounds[f"80% of a {tokens}-token KV cache"] = int(tokens * (1 - CONTEXT_HEADROOM))
    else:
        notes.append("GPU memory unknown: --max-model-len is not bounded by the KV cache size")
    bound_name, bound = min(bounds.items(), key=lambda item: item[1])
    max_model_len = max(bound // BLOCK_SIZE * BLOCK_SIZE, BLOCK_SIZE)
    notes.append(f"--max-model-len {max_model_len} is bounded by {bound_name}")
    if max_model_len < context_limit_tokens:
        notes.append(
            f"tickets longer than {max_model_len} tokens will be refused by vLLM; "
            f"lower context_limit_tokens ({context_limit_tokens}) in the policy to refuse them at admission"
        )
    args = VllmLaunchArgs(
        max_num_seqs=min(SEQS_PER_GPU * gpus, MAX_NUM_SEQS_CAP),
        max_model_len=max_model_len,
        gpu_memory_utilization=utilization,
    )
    return args, notes
