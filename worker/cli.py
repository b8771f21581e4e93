"""`tidegate worker`: run one GPU worker, or one per GPU under a supervisor; probe; print vLLM flags."""

from __future__ import annotations

import inspect
import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any, Literal

import redis
import typer

from shared.cli_support import EXIT_BAD_INPUT, fail, print_json
from shared.config import Settings
from shared.keys import QueueKeys
from shared.logs import configure_logging, tag_process
from shared.metrics import serve
from shared.redis_conn import RedisUnavailable, connect_from
from shared.tracing import configure_tracing
from worker.cli_options import PER_CHILD, child_args, load_config, option_args, parameters
from worker.config import WorkerConfig
from worker.gpu_memory import GpuBackendError, GpuMemoryProvider, make_provider
from worker.registry import check_alive
from worker.supervisor import PlanError, Supervisor, plan_targets
from worker.vllm_args import launch_args

log = logging.getLogger("tidegate.worker")

app = typer.Typer(add_completion=False, rich_markup_mode=None)

Backend = Literal["nvml", "sim", "auto"]


ACTIONS = [
    inspect.Parameter(
        "check",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option("--check", help="Exit 0 if this worker (or any on this host) has a live heartbeat."),
        ],
    ),
    inspect.Parameter(
        "print_vllm_args",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool, typer.Option("--print-vllm-args", help="Print the vLLM launch flags for this node.")
        ],
    ),
    inspect.Parameter(
        "as_json",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool, typer.Option("--json", help="Print one JSON document (--check, --print-vllm-args).")
        ],
    ),
]
"""What the command does instead of running a worker; the settings' options come from WorkerConfig."""


def worker(**values: Any) -> None:
    """Run one GPU worker per GPU against vLLM: claim by priority, batch by free memory, write results."""
    config = load_config(values)
    configure_logging(logging.getLevelNamesMapping()[config.log_level.upper()])
    configure_tracing("tidegate-worker")  # off unless the OTEL_* variables ask for it
    if values["check"]:
        _check(config, values["as_json"])
    if values["print_vllm_args"]:
        _print_vllm_args(config, values["as_json"])
        return
    if config.gpus is not None:
        _supervise(config)
    urls = config.vllm_urls
    if len(urls) > 1 and not config.gpu < len(urls):
        fail(
            f"--gpu {config.gpu} has no URL among the {len(urls)} --vllm-url values (one per GPU)",
            EXIT_BAD_INPUT,
        )
    _run_one(config.model_copy(update={"vllm_url": urls[config.gpu] if len(urls) > 1 else urls[0]}))


def _declare(command: Callable[..., None], params: list[inspect.Parameter]) -> Callable[..., None]:
    """Give `command` the signature Typer reads its options from."""
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return command


app.command()(_declare(worker, [*parameters(), *ACTIONS]))


def _connect(settings: Settings) -> redis.Redis:
    try:
        client = connect_from(settings)
        client.ping()
        return client
    except (RedisUnavailable, redis.RedisError) as exc:
        fail(f"Redis: {exc}")


def _check(config: WorkerConfig, as_json: bool) -> None:
    """Kubernetes probe: the named worker, else any worker on this host (on `--gpu` when given)."""
    client = _connect(config)
    worker_id = config.worker_id if "worker_id" in config.model_fields_set else None
    gpu = config.gpu if "gpu" in config.model_fields_set else None
    host = None if worker_id else socket.gethostname()
    try:
        alive = check_alive(client, QueueKeys(config.queue_name), worker_id=worker_id, host=host, gpu=gpu)
    except redis.RedisError as exc:
        fail(f"Redis: {exc}")
    if as_json:
        print_json({"alive": bool(alive), "workers": [asdict(w) for w in alive]})
    elif alive:
        typer.echo(", ".join(f"{w.worker_id} (GPU {w.gpu})" for w in alive) + " alive")
    else:
        what = worker_id or f"any worker on {host}" + ("" if gpu is None else f" GPU {gpu}")
        typer.echo(f"no live heartbeat for {what}", err=True)
    raise typer.Exit(0 if alive else 1)


def _gpu_provider(backend: Backend, url: str, gpu: int | None) -> GpuMemoryProvider | None:
    """The configured provider; in `auto` mode a node without one sizes from vLLM's metrics alone."""
    try:
        provider = make_provider(backend, url)
        if backend != "auto" and gpu is not None:
            provider.memory(gpu)  # an explicit backend that cannot read this GPU is a startup error
        return provider
    except GpuBackendError as exc:
        if backend == "auto":
            log.warning("no GPU memory backend (%s); the batch limit follows vLLM's metrics alone", exc)
            return None
        fail(str(exc))


def _print_vllm_args(config: WorkerConfig, as_json: bool) -> None:
    provider = _gpu_provider(config.gpu_backend, config.vllm_urls[0], None)
    total: int | None = None
    count = 1
    try:
        if provider is not None:
            count = provider.device_count()
            total = provider.memory(0).total_bytes if count else None
    except (GpuBackendError, OSError) as exc:
        log.warning("GPU figures unavailable (%s)", exc)
    if config.gpu_count is not None:
        count = config.gpu_count
    args, notes = launch_args(
        gpus=max(count, 1),
        spec=config.model_spec,
        safety_margin=config.safety_margin,
        context_limit_tokens=config.policy.queue.context_limit_tokens,
        gpu_total_bytes=total,
    )
    if as_json:
        print_json({"args": args.argv(), **args.as_dict(), "gpus": count, "notes": notes})
        return
    for note in notes:
        typer.echo(f"# {note}", err=True)
    typer.echo(args.command_line())


def _supervise(config: WorkerConfig) -> None:
    def device_count() -> int:
        provider = _gpu_provider(config.gpu_backend, config.vllm_urls[0], None)
        if provider is None:
            fail("--gpus all: no GPU backend can count this node's GPUs; give --gpus N")
        return provider.device_count()

    try:
        targets = plan_targets(config.gpu_count, config.vllm_urls, device_count)
    except PlanError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    base = config.worker_id if "worker_id" in config.model_fields_set else socket.gethostname()
    common = child_args(config)
    children = []
    for index, url in targets:
        child = config.model_copy(
            update={
                "gpu": index,
                "vllm_url": url,
                "worker_id": f"{base}-gpu{index}",
                "worker_metrics_port": config.worker_metrics_port + index
                if config.worker_metrics_port
                else 0,
            }
        )
        own = [arg for name in sorted(PER_CHILD - {"gpus"}) for arg in option_args(child, name)]
        children.append((f"worker GPU {index} ({url})", [sys.executable, "-m", "worker", *own, *common]))
    supervisor = Supervisor(children, stop_timeout_seconds=config.grace_seconds + 15)
    _on_stop_signals(supervisor.request_stop)
    raise typer.Exit(supervisor.run())


def _run_one(config: WorkerConfig) -> None:
    from worker.telemetry import WorkerGauges, worker_registry
    from worker.worker import Worker  # the runtime loads only when a worker really starts

    worker_id = config.worker_id
    tag_process(worker=worker_id)
    client = _connect(config)
    provider = _gpu_provider(config.gpu_backend, config.vllm_url, config.gpu)
    runtime = Worker(config, client, config.policy, gpu_provider=provider)
    if config.worker_metrics_port:
        server, _ = serve(
            worker_registry(WorkerGauges(worker_id, config.gpu, runtime.gauges)), config.worker_metrics_port
        )
        log.info("metrics on :%d/metrics", server.server_port)
    _on_stop_signals(runtime.request_stop)
    raise typer.Exit(runtime.run())


def _on_stop_signals(stop: Callable[[], None]) -> None:
    def handler(signum: int, _frame: object) -> None:
        stop()  # first: a log write interrupted by this handler must not keep the stop from happening
        log.info("%s: stopping", signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
