"""`tidegate sim-vllm`: serve the vLLM-compatible simulator."""

from __future__ import annotations

import logging
import socket
import sys
from typing import Annotated

import typer
import uvicorn

from ops.lab.sim.config import ConfigError, OomMode, PreemptionMode, SchedulingPolicy, build_config
from ops.lab.sim.profiles import DEFAULT_PROFILE, PROFILES

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1
READY_LINE = "tidegate sim-vllm listening on"

app = typer.Typer(add_completion=False)


@app.command()
def sim_vllm(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one and prints it.")] = 8000,
    profile: Annotated[
        str, typer.Option(help=f"GPU/model profile: {', '.join(PROFILES)}.")
    ] = DEFAULT_PROFILE,
    model: Annotated[str | None, typer.Option(help="Served model name [default: the profile's].")] = None,
    gpus: Annotated[int, typer.Option(help="Simulated GPUs behind this endpoint, one engine each.")] = 1,
    kv_blocks: Annotated[
        int | None, typer.Option(help="KV-cache blocks per GPU [default: from memory].")
    ] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Most sequences in one batch.")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="Token budget of one step.")] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(help="Context length: prompt plus output [default: the profile's, within the cache]."),
    ] = None,
    prefill_tokens_per_s: Annotated[float | None, typer.Option(help="Prefill speed, tokens/s.")] = None,
    decode_step_s: Annotated[float | None, typer.Option(help="Base time of one step, seconds.")] = None,
    per_seq_slowdown: Annotated[
        float | None, typer.Option(help="Step time added per running sequence.")
    ] = None,
    decode_attention_s: Annotated[
        float | None,
        typer.Option(help="Step time per context token of each decoding sequence (attention), seconds."),
    ] = None,
    prefill_attention_s: Annotated[
        float | None,
        typer.Option(help="Step time per (new token, context token) pair of a prefill chunk, seconds."),
    ] = None,
    enable_chunked_prefill: Annotated[
        bool,
        typer.Option(help="Split a prompt over steps to fit the token budget (vLLM V1's default)."),
    ] = True,
    preemption_mode: Annotated[PreemptionMode, typer.Option(help="How a sequence leaves a full cache.")] = (
        PreemptionMode.RECOMPUTE
    ),
    oom_mode: Annotated[
        OomMode, typer.Option(help="preempt like vLLM, or crash like an OOM.")
    ] = OomMode.PREEMPT,
    oom_recovery_s: Annotated[float, typer.Option(help="Restart time after a crash, model seconds.")] = 90.0,
    scheduling_policy: Annotated[SchedulingPolicy, typer.Option(help="Order of the waiting queue.")] = (
        SchedulingPolicy.FCFS
    ),
    time_scale: Annotated[float, typer.Option(help="How many times faster than real time to run.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the generated stop lengths.")] = 0,
    stop_median_tokens: Annotated[
        int | None, typer.Option(help="Median answer length when max_tokens does not cut it first.")
    ] = None,
    error_rate: Annotated[
        float,
        typer.Option(
            help="Share of completions answered with --error-status (0-1); POST /sim/faults changes it."
        ),
    ] = 0.0,
    error_status: Annotated[int, typer.Option(help="HTTP status of an injected error (400-599).")] = 500,
    extra_latency_s: Annotated[
        float, typer.Option(help="Wall-clock seconds added before every completion answers.")
    ] = 0.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve a vLLM-compatible endpoint whose GPUs, KV cache and batching are simulated."""
    try:
        config = build_config(
            profile,
            model=model,
            gpus=gpus,
            kv_blocks=kv_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            prefill_tokens_per_s=prefill_tokens_per_s,
            decode_step_s=decode_step_s,
            per_seq_slowdown_s=per_seq_slowdown,
            decode_attention_s=decode_attention_s,
            prefill_attention_s=prefill_attention_s,
            enable_chunked_prefill=enable_chunked_prefill,
            preemption_mode=preemption_mode,
            oom_mode=oom_mode,
            oom_recovery_s=oom_recovery_s,
            scheduling_policy=scheduling_policy,
            time_scale=time_scale,
            seed=seed,
            stop_median_tokens=stop_median_tokens,
            error_rate=error_rate,
            error_status=error_status,
            extra_latency_s=extra_latency_s,
        )
    except (ConfigError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    level = logging.getLevelNamesMapping().get(log_level.upper())
    if level is None:
        typer.echo(
            f"error: --log-level={log_level!r} is not accepted; use debug|info|warning|error", err=True
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        sock = _listen(host, port)
    except OSError as error:
        typer.echo(f"error: cannot listen on {host}:{port}: {error}", err=True)
        raise typer.Exit(EXIT_FAILURE) from None

    from ops.lab.sim.server import create_app  # FastAPI loads only when serving, not for --help

    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    )
    typer.echo(f"{READY_LINE} http://{host}:{bound_port}")
    server.run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """Bind before serving so port 0 resolves to a real port we can announce."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
