"""`tidegate sim-vllm` on the command line: help, and bad flags exiting 2 with the flag named."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from ops.lab.sim.process import _flag_args
from tidegate.cli import app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sim-vllm", *args], terminal_width=200, env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_help_lists_the_flags() -> None:
    code, output = invoke("--help")
    assert code == 0
    for flag in (
        "--profile",
        "--gpus",
        "--kv-blocks",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--max-model-len",
        "--prefill-tokens-per-s",
        "--decode-step-s",
        "--per-seq-slowdown",
        "--decode-attention-s",
        "--prefill-attention-s",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--preemption-mode",
        "--oom-mode",
        "--oom-recovery-s",
        "--scheduling-policy",
        "--time-scale",
        "--seed",
        "--stop-median-tokens",
    ):
        assert flag in output, flag


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "h100-70b"], "profile 'h100-70b' is not known; accepted: a100-7b"),
        (
            ["--kv-blocks", "10", "--max-model-len", "4096"],
            "--max-model-len=4096 is larger than the 160 tokens",
        ),
        (["--time-scale", "0"], "--time-scale=0.0 is not accepted; it must be greater than 0"),
        (
            ["--max-num-seqs", "64", "--max-num-batched-tokens", "32"],
            "--max-num-batched-tokens=32 is smaller",
        ),
        (["--kv-blocks", "100000"], "--kv-blocks=100000 does not fit on a NVIDIA A100-SXM4-80GB"),
        (["--oom-mode", "explode"], "explode"),
        (
            ["--no-enable-chunked-prefill"],
            "--max-num-batched-tokens=8192 is smaller than --max-model-len=32768 with chunked prefill off",
        ),
        (["--decode-attention-s", "-1"], "--decode-attention-s=-1.0 is not accepted; it must be 0 or more"),
        (["--error-rate", "2"], "--error-rate: error_rate=2.0 is not accepted"),
        (["--error-status", "200"], "--error-status: error_status=200 is not accepted"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    code, output = invoke(*args)
    assert code == 2
    assert message in output


def test_a_port_in_use_exits_1() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        code, output = invoke("--port", str(taken.getsockname()[1]))
    assert code == 1
    assert "cannot listen on 127.0.0.1" in output


def test_a_simulator_process_passes_a_false_switch_as_its_no_flag() -> None:
    args = _flag_args({"enable_chunked_prefill": False, "decode_attention_s": 1e-6, "kv_blocks": None})
    assert args == ["--no-enable-chunked-prefill", "--decode-attention-s", "1e-06"]
