"""inference-perf's configuration as the bench writes it from the template, read back as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ops.lab.bench.iperf.config import REQUEST_TIMEOUT_S, LoadShape, Target, render_config, write_config

TARGET = Target(
    base_url="http://127.0.0.1:18080/",
    api_key="tg_abc-DEF_123",
    model="togethercomputer/LLaMA-2-7B-32K",
    tokenizer=Path("/models/tiny llama"),
    slo_seconds=10.0,
)


def _config(shape: LoadShape, target: Target = TARGET) -> dict[str, Any]:
    loaded = yaml.safe_load(render_config(shape, target, Path("/runs/r1/reports")))
    assert isinstance(loaded, dict)
    return loaded


def test_the_template_fills_every_placeholder_with_the_run() -> None:
    config = _config(LoadShape(rate=2.5, duration_s=60, prompt_tokens=1024, output_tokens=128, seed=7))
    assert config["api"] == {"type": "completion", "streaming": True}
    assert config["server"] == {
        "type": "vllm",
        "base_url": "http://127.0.0.1:18080",
        "api_key": "tg_abc-DEF_123",
        "model_name": "togethercomputer/LLaMA-2-7B-32K",
        "ignore_eos": True,
    }
    assert config["tokenizer"] == {"pretrained_model_name_or_path": "/models/tiny llama"}
    assert config["load"]["type"] == "poisson"
    assert config["load"]["stages"] == [{"rate": 2.5, "duration": 60}]
    assert config["load"]["num_workers"] == 1
    assert config["load"]["base_seed"] == 7
    assert config["load"]["request_timeout"] == REQUEST_TIMEOUT_S
    assert config["load"]["request_retries"] == 0
    assert config["data"]["type"] == "random"
    for name, tokens in (("input_distribution", 1024), ("output_distribution", 128)):
        assert config["data"][name] == {
            "type": "fixed",
            "min": tokens,
            "max": tokens,
            "mean": tokens,
            "std_dev": 0,
            "total_count": 150,  # rate x duration: what the stage sends
        }
    lifecycle = config["report"]["request_lifecycle"]
    assert lifecycle["summary"] is True
    assert lifecycle["per_request"] is True
    assert lifecycle["per_request_fields"]["response_chunks"] is True  # they carry the ticket ids
    assert lifecycle["use_server_output_tokens"] is True
    assert config["report"]["goodput"] == {"constraints": {"request_latency": 10.0}}
    assert config["storage"] == {"local_storage": {"path": "/runs/r1/reports"}}


def test_strings_with_yaml_syntax_stay_the_same_strings() -> None:
    odd = Target("http://127.0.0.1:1", 'tg_a: #b "c" {d}', "m: [x]", Path("/t/#1"), 2.0)
    config = _config(LoadShape(), odd)
    assert config["server"]["api_key"] == 'tg_a: #b "c" {d}'
    assert config["server"]["model_name"] == "m: [x]"
    assert config["tokenizer"]["pretrained_model_name_or_path"] == "/t/#1"


def test_a_template_naming_an_unknown_placeholder_fails_naming_it() -> None:
    with pytest.raises(KeyError, match="concurrency"):
        render_config(LoadShape(), TARGET, Path("/r"), template="load: ${concurrency}\n")


def test_write_config_writes_the_rendered_text(tmp_path: Path) -> None:
    path = write_config(tmp_path / "run" / "inference-perf.yaml", LoadShape(), TARGET, tmp_path / "reports")
    assert path.read_text() == render_config(LoadShape(), TARGET, tmp_path / "reports")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rate", 0.0, "rate=0.0"),
        ("rate", float("inf"), "rate=inf"),
        ("duration_s", 0, "duration_s=0"),
        ("prompt_tokens", 0, "prompt_tokens=0"),
        ("output_tokens", -1, "output_tokens=-1"),
    ],
)
def test_a_shape_refuses_what_inference_perf_could_not_run(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadShape(**{field: value})  # type: ignore[arg-type]


def test_a_stage_sends_rate_times_duration_requests() -> None:
    assert LoadShape(rate=2.0, duration_s=60).requests == 120
    assert LoadShape(rate=0.01, duration_s=10).requests == 1
