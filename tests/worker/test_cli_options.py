"""`tidegate worker`'s options come from `WorkerConfig`: one option per setting, the option and the
variable agree, a refused value names its setting, and the supervisor's child arguments give a child
the parent's settings back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.worker.test_model_and_args import LLAMA3_8B
from tidegate.cli import app as tidegate_app
from worker.cli import app
from worker.cli_options import PER_CHILD, child_args, config_from_options, env_name, option_name, options
from worker.config import WorkerConfig

SAMPLES: dict[str, Any] = {
    "queue_name": "gold,silver",
    "vllm_url": "http://127.0.0.1:9001",
    "fallback_vllm_url": "http://127.0.0.1:9002",
    "gpu_backend": "sim",
    "max_batch": 7,
    "safety_margin": 0.25,
    "kv_high_watermark": 0.5,
    "critical_headroom": 0.3,
    "preemption": False,
    "lease_seconds": 12.5,
    "gpu": 1,
    "gpus": "2",
    "model": "tiny",
    "burst": True,
    "grace_seconds": 3.5,
    "model_config_file": "MODEL_DIR",
    "kv_layers": 4,
    "kv_heads": 2,
    "head_dim": 64,
    "kv_dtype_bytes": 1,
    "max_preemptions": 3,
    "deadline_service_seconds": 0.5,
    "worker_metrics_port": 9109,
    "worker_id": "node-a",
    "heartbeat_seconds": 0.5,
    "resize_seconds": 0.25,
    "block_seconds": 1.5,
    "log_level": "debug",
}
"""A value other than the default for every option (a new setting fails the first test until listed)."""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `TIDEGATE_*` of the test run's own leaks into the settings under test."""
    for name in WorkerConfig.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    monkeypatch.chdir(tmp_path)  # no .env either
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))


def _sample(name: str) -> Any:
    value = SAMPLES[name]
    return str(Path.cwd()) if value == "MODEL_DIR" else value


def parse(argv: list[str]) -> WorkerConfig:
    """What `tidegate worker ARGV` resolves its settings to (parsing only, nothing runs)."""
    context = typer.main.get_command(app).make_context("worker", argv)
    return config_from_options(context.params)


def _argv(name: str, value: Any) -> list[str]:
    option = option_name(name)
    if isinstance(value, bool):
        return [option if value else f"--no-{option.removeprefix('--')}"]
    return [option, str(value)]


def test_every_setting_has_an_option_with_help() -> None:
    assert set(options()) == set(SAMPLES)
    carried = set(WorkerConfig.model_fields) - set(options())
    assert {"extra_queues", "model_spec"} <= carried
    help_text = CliRunner().invoke(tidegate_app, ["worker", "--help"], terminal_width=400).stdout
    for name in options():
        assert option_name(name) in help_text, name
        assert env_name(name) in help_text, name
    for flag in ("--queue", "--vllm-url", "--gpu", "--gpus", "--metrics-port", "--model-config", "--burst"):
        assert flag in help_text  # the names deployments pass (docker-compose.yml, ops/deploy/k8s)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_option_and_the_variable_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _sample(name)
    from_flag = parse(_argv(name, value))
    monkeypatch.setenv(env_name(name), str(value).lower() if isinstance(value, bool) else str(value))
    from_env = parse([])
    assert getattr(from_flag, name) == getattr(from_env, name) != WorkerConfig.model_fields[name].default
    assert from_flag == from_env


def test_the_option_wins_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_MAX_BATCH", "9")
    assert parse([]).max_batch == 9
    assert parse(["--max-batch", "3"]).max_batch == 3


def test_log_level_in_any_case() -> None:
    assert parse(["--log-level", "WARNING"]).log_level == "warning"


def test_queue_options_are_one_list() -> None:
    config = parse(["--queue", "gold", "--queue", "silver,bronze", "--queue", "gold"])
    assert config.queue_names == ("gold", "silver", "bronze")


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--max-batch", "0"], {}, "max_batch=0 is not accepted"),
        ([], {"TIDEGATE_MAX_BATCH": "0"}, "max_batch='0' is not accepted"),
        (["--block-seconds", "30"], {}, "block_seconds=30.0 is not accepted"),
        ([], {"TIDEGATE_GPUS": "some"}, "gpus='some' is not accepted"),
        (["--queue", "ok,no way"], {}, "'no way' is not accepted"),
    ],
)
def test_a_refused_value_names_the_setting_and_exits_2(
    argv: list[str], env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(tidegate_app, ["worker", *argv])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    name = expected.split("=")[0].split(".")[0].strip("'")
    if name in WorkerConfig.model_fields:
        assert f"({option_name(name)}, {env_name(name)})" in result.stderr


def test_child_args_give_the_child_its_parents_settings() -> None:
    everything = {name: _sample(name) for name in SAMPLES if name not in PER_CHILD}
    for given in ({}, everything):
        parent = config_from_options({n: [v] if options()[n].many else v for n, v in given.items()})
        child = parse(child_args(parent))
        assert child == parent
        assert child.model_spec == parent.model_spec


def test_child_args_leave_the_per_child_settings_to_the_supervisor() -> None:
    parent = parse(["--gpus", "all", "--worker-id", "node", "--metrics-port", "9109", "--gpu", "1"])
    args = child_args(parent)
    for name in PER_CHILD:
        assert option_name(name) not in args, name
