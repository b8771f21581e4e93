"""vLLM runs, in compose and in Kubernetes, with exactly the engine flags that
`tidegate worker --print-vllm-args` prints for the model it serves and the GPUs behind it.

The worker derives them (batch cap from the GPU count, context from the model's config.json and the
policy, memory share from the safety margin), so each deployment file is checked against a real run
of the CLI with the named model's config.json. No GPU figures are given: for these models on
80 GB GPUs the KV cache does not bound the context, and the printed notes say which bound applied.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deploy_files import (
    K8S_DIR,
    REPO,
    REQUIRED_ENV,
    compose_services,
    interpolate,
    load_yaml_documents,
    vllm_flags,
)

REQUIRED_VLLM_FLAGS = (
    "--max-num-seqs",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--enable-chunked-prefill",
    "--scheduling-policy",
)

# The fields of each model's published config.json that the worker reads.
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 152064,
    },
    "Qwen/Qwen2.5-1.5B-Instruct": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "max_position_embeddings": 32768,
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    },
}


def k8s_vllm_args() -> list[str]:
    (worker,) = [doc for doc in load_yaml_documents(K8S_DIR / "worker.yaml") if doc["kind"] == "Deployment"]
    (vllm,) = [c for c in worker["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    args: list[str] = vllm["args"]
    return args


def compose_vllm_args(service: str) -> list[str]:
    return [interpolate(token, REQUIRED_ENV) for token in compose_services()[service]["command"]]


DEPLOYMENTS: dict[str, tuple[Callable[[], list[str]], int]] = {
    # where vLLM runs: (its command line, GPUs it serves)
    "compose vllm": (lambda: compose_vllm_args("vllm"), 2),
    "compose vllm-fallback": (lambda: compose_vllm_args("vllm-fallback"), 1),
    "k8s worker pod": (k8s_vllm_args, 1),
}


def closed_port() -> int:
    """A loopback port nothing listens on, so the sim backend fails fast and reports no GPU figures."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def print_vllm_args(gpus: int, model_config: Path) -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tidegate.cli import main; main()",
            "worker",
            "--print-vllm-args",
            "--json",
            "--gpus",
            str(gpus),
            "--model-config",
            str(model_config),
            "--gpu-backend",
            "sim",
            "--vllm-url",
            f"http://127.0.0.1:{closed_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(model_config.parent)},
    )
    assert result.returncode == 0, result.stderr
    printed: dict[str, Any] = json.loads(result.stdout)
    return printed


@pytest.mark.parametrize("deployment", list(DEPLOYMENTS))
def test_vllm_flags_match_print_vllm_args(deployment: str, tmp_path: Path) -> None:
    read_args, gpus = DEPLOYMENTS[deployment]
    deployed = vllm_flags(read_args())
    model = deployed["--model"]
    assert model in MODEL_CONFIGS, f"{deployment} serves {model}; add its config.json fields here"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MODEL_CONFIGS[model]))
    printed = print_vllm_args(gpus, config)
    assert printed["gpus"] == gpus
    expected = vllm_flags(printed["args"])
    assert set(REQUIRED_VLLM_FLAGS) <= set(expected), (
        f"--print-vllm-args no longer prints {REQUIRED_VLLM_FLAGS}"
    )
    for flag, value in expected.items():
        assert flag in deployed, f"{deployment} lacks {flag} {value or ''}"
        assert deployed[flag] == value, f"{deployment}: {flag} {deployed[flag]}, the worker prints {value}"
