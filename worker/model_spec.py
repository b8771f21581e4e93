"""The served model's shape: what one token costs in KV cache and what the weights weigh.

The batch sizer turns free memory into tickets with `kv_bytes_per_token`, and `--print-vllm-args`
sizes the context from it. The figures come from the model's Hugging Face `config.json` when one is
given; otherwise from a 7B Llama (32 layers, 32 KV heads of dimension 128, fp16), the common case.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
}


class ModelSpecError(ValueError):
    """A model config that cannot be read or lacks a field; the message names the file and field."""


@dataclass(frozen=True)
class ModelSpec:
    layers: int = 32
    kv_heads: int = 32
    head_dim: int = 128
    dtype_bytes: int = 2
    attention_heads: int = 32
    hidden_size: int = 4096
    intermediate_size: int = 11008
    vocab_size: int = 32000
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    source: str = "default 7B Llama"

    @property
    def kv_bytes_per_token(self) -> int:
        """Key and value vectors of every layer: 2 × layers × KV heads × head dim × dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def parameter_count(self) -> int:
        """Parameters of a Llama-style decoder (attention with grouped KV heads, gated MLP, norms)."""
        q_and_o = 2 * self.hidden_size * self.attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.layers * (q_and_o + k_and_v + mlp + norms) + embeddings + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.parameter_count * self.dtype_bytes

    def with_overrides(
        self,
        *,
        layers: int | None = None,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        dtype_bytes: int | None = None,
    ) -> ModelSpec:
        """Flags win over the config file, so an operator can correct a config without editing it."""
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("layers", layers),
                ("kv_heads", kv_heads),
                ("head_dim", head_dim),
                ("dtype_bytes", dtype_bytes),
            )
            if value is not None
        }
        for name, value in changes.items():
            if value < 1:
                raise ModelSpecError(f"{name}={value} is not accepted; it must be at least 1")
        return replace(self, **changes) if changes else self


def _int_field(config: dict[str, Any], source: str, *names: str, default: int | None = None) -> int:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if default is not None:
        return default
    raise ModelSpecError(f"{source}: field {names[0]!r} is missing or not a positive integer")


def spec_from_config(config: dict[str, Any], source: str = "<config>") -> ModelSpec:
    """A spec from a parsed Hugging Face config (Llama, Mistral, Qwen and other decoder layouts)."""
    layers = _int_field(config, source, "num_hidden_layers", "n_layer", "num_layers")
    attention_heads = _int_field(config, source, "num_attention_heads", "n_head")
    hidden = _int_field(config, source, "hidden_size", "n_embd", "d_model")
    kv_heads = _int_field(config, source, "num_key_value_heads", "n_head_kv", default=attention_heads)
    head_dim = _int_field(config, source, "head_dim", default=max(hidden // attention_heads, 1))
    dtype_name = str(config.get("torch_dtype") or config.get("dtype") or "float16")
    if dtype_name not in DTYPE_BYTES:
        accepted = ", ".join(sorted(DTYPE_BYTES))
        raise ModelSpecError(f"{source}: torch_dtype {dtype_name!r} is not known; accepted: {accepted}")
    return ModelSpec(
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=DTYPE_BYTES[dtype_name],
        attention_heads=attention_heads,
        hidden_size=hidden,
        intermediate_size=_int_field(config, source, "intermediate_size", "n_inner", default=4 * hidden),
        vocab_size=_int_field(config, source, "vocab_size", default=32000),
        max_position_embeddings=_int_field(
            config, source, "max_position_embeddings", "n_positions", "max_seq_len", default=4096
        ),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        source=source,
    )


def load_model_spec(path: str | Path | None) -> ModelSpec:
    """The spec from a model directory or its `config.json`; the 7B Llama default when no path."""
    if path is None:
        return ModelSpec()
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelSpecError(f"--model-config {file}: cannot read it ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise ModelSpecError(
            f"--model-config {file}: not valid JSON ({exc.msg} at line {exc.lineno})"
        ) from exc
    if not isinstance(data, dict):
        raise ModelSpecError(f"--model-config {file}: expected a JSON object, found {type(data).__name__}")
    return spec_from_config(data, str(file))
