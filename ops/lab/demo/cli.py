"""`tidegate demo`: everything on one machine, 200 simulated branches, a surge, a live view, a summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer
from rich.console import Console

from ops.lab.demo.options import DEFAULT_DURATION_S, DemoOptions
from ops.lab.demo.run import run_demo
from ops.lab.embedded_redis import EMBEDDED_CHOICES, Embedded
from ops.lab.stack.stack import ENGINES, Engine
from ops.lab.traffic.player import RETRY_MODES, RetryMode
from shared.cli_support import EXIT_BAD_INPUT, fail, load_settings
from worker.cli_options import load_config

app = typer.Typer(add_completion=False)
PIPE_WIDTH = 140


def _choice(flag: str, value: str, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        fail(f"{flag}={value!r} is not accepted; use {'|'.join(accepted)}", EXIT_BAD_INPUT)
    return value


@app.command()
def demo(
    duration: Annotated[
        float, typer.Option(help="Seconds of traffic (normal, surge, recovery); the backlog drains after.")
    ] = DEFAULT_DURATION_S,
    surge: Annotated[float, typer.Option(help="Peak offered load as a multiple of capacity.")] = 2.5,
    normal: Annotated[float, typer.Option(help="Offered load before and after the surge.")] = 0.6,
    branches: Annotated[int, typer.Option(help="Simulated branch offices, one API key each.")] = 200,
    gpus: Annotated[
        int | None, typer.Option(help="Simulated GPUs, one worker each (default 2; vLLM-CPU: 1).")
    ] = None,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Live screen, or a line every 5 s.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the workload (arrivals, mix, sizes).")] = 7,
    engine: Annotated[str, typer.Option(help=f"Inference engine: {'|'.join(ENGINES)}.")] = "sim",
    keep_running: Annotated[
        bool, typer.Option(help="Keep the API, workers and metrics up after the summary, until Ctrl-C.")
    ] = False,
    redis: Annotated[
        str,
        typer.Option(
            help="auto: TIDEGATE_REDIS_URL, else 127.0.0.1:6379, else embedded; "
            "redis-server|fakeredis: always embed that one."
        ),
    ] = "auto",
    retry: Annotated[
        str, typer.Option(help=f"How shed branches retry: {'|'.join(RETRY_MODES)} (fixed = every 1 s).")
    ] = "retry-after",
    max_attempts: Annotated[int, typer.Option(help="Submissions per request before a branch gives up.")] = 5,
    time_scale: Annotated[
        float,
        typer.Option(help="Simulator speed relative to real GPUs (4 gives the seed's normal-load latency)."),
    ] = DemoOptions.time_scale,
    capacity: Annotated[
        float | None, typer.Option(help="Tickets/s that 100% load means (default: estimated or measured).")
    ] = None,
    drain_timeout: Annotated[
        float, typer.Option(help="After the traffic, seconds to let the backlog finish before cancelling it.")
    ] = 45.0,
    run_dir: Annotated[
        Path | None, typer.Option(help="Folder for logs and data [default: a new temp folder].")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON document.")] = False,
) -> None:
    """Run tidegate on one machine: Redis (embedded if none runs), simulated GPUs, one worker per GPU,
    the monitor and the API; play 200 branches through a surge; show it live; print a summary."""
    settings = load_settings()
    worker_settings = load_config({})  # the workers' knobs from the environment, as each worker reads them
    try:
        options = DemoOptions(
            duration=duration,
            surge=surge,
            normal=normal,
            branches=branches,
            gpus=gpus if gpus is not None else (1 if engine == "vllm-cpu" else 2),
            live=live,
            seed=seed,
            engine=cast(Engine, _choice("--engine", engine, ENGINES)),
            keep_running=keep_running,
            redis_url=settings.redis_url,
            embedded=cast(Embedded, _choice("--redis", redis, EMBEDDED_CHOICES)),
            run_dir=run_dir,
            retry=cast(RetryMode, _choice("--retry", retry, RETRY_MODES)),
            max_attempts=max_attempts,
            time_scale=time_scale,
            drain_timeout=drain_timeout,
            capacity=capacity,
            policy_file=settings.policy_file,
            max_batch=worker_settings.max_batch,
            safety_margin=worker_settings.safety_margin,
            json_output=as_json,
        )
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    console = Console(stderr=as_json, highlight=False)
    if not console.is_terminal:  # logs and pipes: wide enough that the tables keep their columns
        console = Console(stderr=as_json, highlight=False, width=PIPE_WIDTH)
    errors = Console(stderr=True, highlight=False)
    code = run_demo(options, settings.policy, console, errors)
    raise typer.Exit(code)
