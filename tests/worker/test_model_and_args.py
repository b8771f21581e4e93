"""Model shape (KV bytes per token, weights) and the vLLM launch flags derived from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.model_spec import ModelSpec, ModelSpecError, load_model_spec
from worker.supervisor import PlanError, plan_targets
from worker.vllm_args import kv_cache_tokens, launch_args

GIB = 1024**3

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def test_default_is_a_7b_llama_in_fp16() -> None:
    spec = ModelSpec()
    assert spec.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert 6.7e9 < spec.parameter_count < 6.8e9  # Llama-2-7B has 6.74 B parameters


def test_config_json_with_grouped_kv_heads(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    spec = load_model_spec(tmp_path)
    assert (spec.layers, spec.kv_heads, spec.head_dim, spec.dtype_bytes) == (32, 8, 128, 2)
    assert spec.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert 7.9e9 < spec.parameter_count < 8.1e9  # Llama-3-8B: 8.03 B
    assert spec.max_position_embeddings == 8192


def test_flags_override_the_config(tmp_path: Path) -> None:
    file = tmp_path / "config.json"
    file.write_text(json.dumps(LLAMA3_8B))
    spec = load_model_spec(file).with_overrides(kv_heads=4, dtype_bytes=1)
    assert spec.kv_bytes_per_token == 2 * 32 * 4 * 128 * 1
    with pytest.raises(ModelSpecError, match="layers=0"):
        spec.with_overrides(layers=0)


def test_config_errors_name_the_file_and_field(tmp_path: Path) -> None:
    file = tmp_path / "config.json"
    file.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    with pytest.raises(ModelSpecError, match=r"config\.json: field 'num_hidden_layers'"):
        load_model_spec(file)
    file.write_text(json.dumps({**LLAMA3_8B, "torch_dtype": "int3"}))
    with pytest.raises(ModelSpecError, match="torch_dtype 'int3' is not known"):
        load_model_spec(file)
    with pytest.raises(ModelSpecError, match="cannot read"):
        load_model_spec(tmp_path / "missing.json")
    file.write_text("{not json")
    with pytest.raises(ModelSpecError, match="not valid JSON"):
        load_model_spec(file)


def test_vllm_args_for_one_a100() -> None:
    spec = ModelSpec(max_position_embeddings=32768)
    args, notes = launch_args(
        gpus=1, spec=spec, safety_margin=0.15, context_limit_tokens=32768, gpu_total_bytes=80 * GIB
    )
    assert args.max_num_seqs == 4
    assert args.gpu_memory_utilization == 0.85
    tokens = kv_cache_tokens(80 * GIB, 0.85, spec)
    assert args.max_model_len == min(32768, int(tokens * 0.8)) // 16 * 16
    assert args.argv()[-3:] == ["--enable-chunked-prefill", "--scheduling-policy", "priority"]
    assert any("--max-model-len" in note for note in notes)


def test_vllm_args_headroom_binds_on_a_small_gpu() -> None:
    spec = ModelSpec(max_position_embeddings=32768)
    args, notes = launch_args(
        gpus=16, spec=spec, safety_margin=0.15, context_limit_tokens=32768, gpu_total_bytes=24 * GIB
    )
    tokens = kv_cache_tokens(24 * GIB, 0.85, spec)
    assert args.max_model_len == int(tokens * 0.8) // 16 * 16 < 32768
    assert args.max_num_seqs == 32  # min(4 × 16, 32)
    assert any("will be refused by vLLM" in note for note in notes)


def test_plan_targets() -> None:
    assert plan_targets(None, ["http://a"], lambda: 3) == [(0, "http://a"), (1, "http://a"), (2, "http://a")]
    assert plan_targets(None, ["http://a", "http://b"], lambda: 8) == [(0, "http://a"), (1, "http://b")]
    assert plan_targets(2, ["http://a", "http://b"], lambda: 8) == [(0, "http://a"), (1, "http://b")]
    with pytest.raises(PlanError, match="2 --vllm-url values"):
        plan_targets(3, ["http://a", "http://b"], lambda: 8)
    with pytest.raises(PlanError, match="no GPU"):
        plan_targets(None, ["http://a"], lambda: 0)
