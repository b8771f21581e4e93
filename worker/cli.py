"""`tidegate worker`: run one GPU worker, or one per GPU under a supervisor; probe; print vLLM flags."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Literal

import redis
import typer

from shared.cli_support import EXIT_BAD_INPUT, fail, load_settings, parse_queue_names, print_json
from shared.config import Settings, setting_help
from shared.keys import QueueKeys
from shared.logs import configure_logging, tag_process
from shared.metrics import serve
from shared.redis_conn import RedisUnavailable, connect_from
from shared.tracing import configure_tracing
from worker.config import WorkerConfig
from worker.gpu_memory import GpuBackendError, GpuMemoryProvider, make_provider
from worker.model_spec import ModelSpec, ModelSpecError, load_model_spec
from worker.registry import check_alive, default_worker_id
from worker.supervisor import PlanError, Supervisor, plan_targets
from worker.vllm_args import launch_args

log = logging.getLogger("tidegate.worker")

app = typer.Typer(add_completion=False)

Backend = Literal["nvml", "sim", "auto"]


def _split_urls(values: list[str] | None) -> list[str]:
    return [u.strip() for value in values or [] for u in value.split(",") if u.strip()]


@app.command()
def worker(
    gpu: Annotated[
        int | None, typer.Option("--gpu", help="GPU index this worker serves (default 0).")
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="all, or N: one supervised worker process per GPU.")
    ] = None,
    vllm_url: Annotated[
        list[str] | None,
        typer.Option(
            "--vllm-url", help=setting_help("vllm_url") + " Repeat it, or a comma list, one per GPU."
        ),
    ] = None,
    fallback_vllm_url: Annotated[
        str | None,
        typer.Option("--fallback-vllm-url", help=setting_help("fallback_vllm_url")),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Served model name (default: asked from /v1/models).")
    ] = None,
    burst: Annotated[bool, typer.Option("--burst", help="Drain the queue, then exit.")] = False,
    max_batch: Annotated[int | None, typer.Option(help=setting_help("max_batch"))] = None,
    safety_margin: Annotated[float | None, typer.Option(help=setting_help("safety_margin"))] = None,
    kv_high_watermark: Annotated[float | None, typer.Option(help=setting_help("kv_high_watermark"))] = None,
    critical_headroom: Annotated[
        float | None,
        typer.Option(help=setting_help("critical_headroom")),
    ] = None,
    slo_guard: Annotated[
        bool | None,
        typer.Option(
            "--slo-guard/--no-slo-guard",
            help=setting_help("slo_guard"),
        ),
    ] = None,
    adaptive_limit: Annotated[
        bool | None,
        typer.Option("--adaptive-limit/--no-adaptive-limit", help=setting_help("adaptive_limit")),
    ] = None,
    adaptive_tolerance: Annotated[float | None, typer.Option(help=setting_help("adaptive_tolerance"))] = None,
    adaptive_slo: Annotated[
        bool | None,
        typer.Option("--adaptive-slo/--no-adaptive-slo", help=setting_help("adaptive_slo")),
    ] = None,
    preemption: Annotated[
        bool | None,
        typer.Option("--preemption/--no-preemption", help=setting_help("preemption")),
    ] = None,
    preemption_patience: Annotated[
        float | None, typer.Option(help=setting_help("preemption_patience"))
    ] = None,
    prefill_guard_tokens: Annotated[
        int | None, typer.Option(help=setting_help("prefill_guard_tokens"))
    ] = None,
    lease_seconds: Annotated[float | None, typer.Option(help=setting_help("lease_seconds"))] = None,
    grace_seconds: Annotated[
        float, typer.Option(help="On SIGTERM, time running tickets get to finish.")
    ] = 30.0,
    gpu_backend: Annotated[
        str | None, typer.Option(help=setting_help("gpu_backend") + " One of nvml, sim, auto.")
    ] = None,
    model_config: Annotated[
        str | None, typer.Option(help="The model's config.json (or its directory), for KV bytes per token.")
    ] = None,
    kv_layers: Annotated[int | None, typer.Option(help="Override: transformer layers.")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="Override: KV heads.")] = None,
    head_dim: Annotated[int | None, typer.Option(help="Override: head dimension.")] = None,
    kv_dtype_bytes: Annotated[
        int | None, typer.Option(help="Override: bytes per KV element (2 = fp16).")
    ] = None,
    metrics_port: Annotated[int, typer.Option(help="Serve Prometheus /metrics here; 0 = off.")] = 0,
    check: Annotated[
        bool,
        typer.Option("--check", help="Exit 0 if this worker (or any on this host) has a live heartbeat."),
    ] = False,
    print_vllm_args: Annotated[
        bool, typer.Option("--print-vllm-args", help="Print the vLLM launch flags for this node.")
    ] = False,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            help=setting_help("queue_name")
            + " Repeat it, or a comma list, to serve several queues in that priority order.",
        ),
    ] = None,
    worker_id: Annotated[str | None, typer.Option(help="Registry name (default: HOST-gpuN).")] = None,
    heartbeat_seconds: Annotated[float, typer.Option(help="Registry heartbeat interval.")] = 2.0,
    resize_seconds: Annotated[float, typer.Option(help="How often the batch limit is recomputed.")] = 2.0,
    block_seconds: Annotated[float, typer.Option(help="Longest blocking wait for work (≤ 10).")] = 5.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document (--check, --print-vllm-args).")
    ] = False,
) -> None:
    """Run one GPU worker per GPU against vLLM: claim by priority, batch by free memory, write results."""
    _configure_logging(log_level)
    configure_tracing("tidegate-worker")  # off unless the OTEL_* variables ask for it
    given_urls = _split_urls(vllm_url)
    queues = parse_queue_names(queue)
    settings = load_settings(
        queue_name=queues[0] if queues else None,
        vllm_url=given_urls[0] if given_urls else None,
        fallback_vllm_url=fallback_vllm_url,
        gpu_backend=gpu_backend,
        max_batch=max_batch,
        safety_margin=safety_margin,
        kv_high_watermark=kv_high_watermark,
        critical_headroom=critical_headroom,
        slo_guard=slo_guard,
        adaptive_limit=adaptive_limit,
        adaptive_tolerance=adaptive_tolerance,
        adaptive_slo=adaptive_slo,
        preemption=preemption,
        preemption_patience=preemption_patience,
        prefill_guard_tokens=prefill_guard_tokens,
        lease_seconds=lease_seconds,
    )
    urls = given_urls or [settings.vllm_url]
    spec = _model_spec(model_config, kv_layers, kv_heads, head_dim, kv_dtype_bytes)
    if check:
        _check(settings, worker_id, gpu, as_json)
    if print_vllm_args:
        _print_vllm_args(settings, spec, urls[0], gpus, as_json)
        return
    if gpus is not None:
        argv = _child_args(
            settings,
            extra_queues=queues[1:],
            model=model,
            burst=burst,
            grace_seconds=grace_seconds,
            model_config=model_config,
            overrides=(kv_layers, kv_heads, head_dim, kv_dtype_bytes),
            timings=(heartbeat_seconds, resize_seconds, block_seconds),
            log_level=log_level,
        )
        _supervise(settings, gpus, urls, argv, worker_id, metrics_port, grace_seconds)
    index = gpu if gpu is not None else 0
    if len(urls) > 1 and not 0 <= index < len(urls):
        fail(
            f"--gpu {index} has no URL among the {len(urls)} --vllm-url values (one per GPU)", EXIT_BAD_INPUT
        )
    try:
        config = WorkerConfig(
            gpu=index,
            vllm_url=urls[index] if len(urls) > 1 else urls[0],
            worker_id=worker_id or default_worker_id(index),
            queue_name=settings.queue_name,
            extra_queues=queues[1:],
            replica_acks=settings.replica_acks,
            fallback_vllm_url=settings.fallback_vllm_url,
            model=model,
            max_batch=settings.max_batch,
            safety_margin=settings.safety_margin,
            kv_high_watermark=settings.kv_high_watermark,
            critical_headroom=settings.critical_headroom,
            slo_guard=settings.slo_guard,
            adaptive_limit=settings.adaptive_limit,
            adaptive_tolerance=settings.adaptive_tolerance,
            adaptive_slo=settings.adaptive_slo,
            preemption=settings.preemption,
            preemption_patience=settings.preemption_patience,
            prefill_guard_tokens=settings.prefill_guard_tokens,
            lease_seconds=settings.policy.queue.lease_seconds,
            grace_seconds=grace_seconds,
            burst=burst,
            model_spec=spec,
            heartbeat_seconds=heartbeat_seconds,
            resize_seconds=resize_seconds,
            block_seconds=block_seconds,
        )
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    _run_one(settings, config, settings.gpu_backend, metrics_port)


def _configure_logging(level_name: str) -> None:
    level = logging.getLevelNamesMapping().get(level_name.upper())
    if level is None:
        fail(f"--log-level={level_name!r} is not accepted; use debug|info|warning|error", EXIT_BAD_INPUT)
    configure_logging(level)


def _model_spec(
    path: str | None, layers: int | None, heads: int | None, head_dim: int | None, dtype_bytes: int | None
) -> ModelSpec:
    try:
        return load_model_spec(path).with_overrides(
            layers=layers, kv_heads=heads, head_dim=head_dim, dtype_bytes=dtype_bytes
        )
    except ModelSpecError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def _connect(settings: Settings) -> redis.Redis:
    try:
        client = connect_from(settings)
        client.ping()
        return client
    except (RedisUnavailable, redis.RedisError) as exc:
        fail(f"Redis: {exc}")


def _check(settings: Settings, worker_id: str | None, gpu: int | None, as_json: bool) -> None:
    """Kubernetes probe: the named worker, else any worker on this host (on `--gpu` when given)."""
    client = _connect(settings)
    host = None if worker_id else socket.gethostname()
    try:
        alive = check_alive(client, QueueKeys(settings.queue_name), worker_id=worker_id, host=host, gpu=gpu)
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


def _print_vllm_args(settings: Settings, spec: ModelSpec, url: str, gpus: str | None, as_json: bool) -> None:
    provider = _gpu_provider(settings.gpu_backend, url, None)
    total: int | None = None
    count = 1
    try:
        if provider is not None:
            count = provider.device_count()
            total = provider.memory(0).total_bytes if count else None
    except (GpuBackendError, OSError) as exc:
        log.warning("GPU figures unavailable (%s)", exc)
    if gpus is not None and gpus != "all":
        if not gpus.isdigit() or int(gpus) < 1:
            fail(f"--gpus {gpus!r} is not accepted; use all or a positive number", EXIT_BAD_INPUT)
        count = int(gpus)
    args, notes = launch_args(
        gpus=max(count, 1),
        spec=spec,
        safety_margin=settings.safety_margin,
        context_limit_tokens=settings.policy.queue.context_limit_tokens,
        gpu_total_bytes=total,
    )
    if as_json:
        print_json({"args": args.argv(), **args.as_dict(), "gpus": count, "notes": notes})
        return
    for note in notes:
        typer.echo(f"# {note}", err=True)
    typer.echo(args.command_line())


def _child_args(
    settings: Settings,
    *,
    extra_queues: tuple[str, ...],
    model: str | None,
    burst: bool,
    grace_seconds: float,
    model_config: str | None,
    overrides: tuple[int | None, int | None, int | None, int | None],
    timings: tuple[float, float, float],
    log_level: str,
) -> list[str]:
    """Flags every child shares, from the resolved settings (the environment passes through too)."""
    args = [
        "--queue",
        ",".join((settings.queue_name, *extra_queues)),
        "--max-batch",
        str(settings.max_batch),
        "--safety-margin",
        repr(settings.safety_margin),
        "--kv-high-watermark",
        repr(settings.kv_high_watermark),
        "--critical-headroom",
        repr(settings.critical_headroom),
        "--slo-guard" if settings.slo_guard else "--no-slo-guard",
        "--adaptive-limit" if settings.adaptive_limit else "--no-adaptive-limit",
        "--adaptive-tolerance",
        repr(settings.adaptive_tolerance),
        "--adaptive-slo" if settings.adaptive_slo else "--no-adaptive-slo",
        "--preemption" if settings.preemption else "--no-preemption",
        "--preemption-patience",
        repr(settings.preemption_patience),
        "--prefill-guard-tokens",
        str(settings.prefill_guard_tokens),
        "--lease-seconds",
        repr(settings.policy.queue.lease_seconds),
        "--grace-seconds",
        repr(grace_seconds),
        "--gpu-backend",
        settings.gpu_backend,
        "--heartbeat-seconds",
        repr(timings[0]),
        "--resize-seconds",
        repr(timings[1]),
        "--block-seconds",
        repr(timings[2]),
        "--log-level",
        log_level,
    ]
    optional = {
        "--model": model,
        "--fallback-vllm-url": settings.fallback_vllm_url,
        "--model-config": model_config,
        "--kv-layers": overrides[0],
        "--kv-heads": overrides[1],
        "--head-dim": overrides[2],
        "--kv-dtype-bytes": overrides[3],
    }
    for flag, value in optional.items():
        if value is not None:
            args += [flag, str(value)]
    if burst:
        args.append("--burst")
    return args


def _supervise(
    settings: Settings,
    gpus: str,
    urls: list[str],
    common: list[str],
    worker_id: str | None,
    metrics_port: int,
    grace_seconds: float,
) -> None:
    def device_count() -> int:
        provider = _gpu_provider(settings.gpu_backend, urls[0], None)
        if provider is None:
            fail("--gpus all: no GPU backend can count this node's GPUs; give --gpus N")
        return provider.device_count()

    try:
        targets = plan_targets(gpus, urls, device_count)
    except PlanError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    base = worker_id or socket.gethostname()
    children = []
    for index, url in targets:
        argv = [sys.executable, "-m", "worker", "--gpu", str(index), "--vllm-url", url, *common]
        argv += ["--worker-id", f"{base}-gpu{index}"]
        if metrics_port:
            argv += ["--metrics-port", str(metrics_port + index)]
        children.append((f"worker GPU {index} ({url})", argv))
    supervisor = Supervisor(children, stop_timeout_seconds=grace_seconds + 15)
    _on_stop_signals(supervisor.request_stop)
    raise typer.Exit(supervisor.run())


def _run_one(settings: Settings, config: WorkerConfig, backend: Backend, metrics_port: int) -> None:
    from worker.telemetry import WorkerGauges, worker_registry
    from worker.worker import Worker  # the runtime loads only when a worker really starts

    tag_process(worker=config.worker_id)
    client = _connect(settings)
    provider = _gpu_provider(backend, config.vllm_url, config.gpu)
    runtime = Worker(config, client, settings.policy, gpu_provider=provider)
    if metrics_port:
        server, _ = serve(
            worker_registry(WorkerGauges(config.worker_id, config.gpu, runtime.gauges)), metrics_port
        )
        log.info("metrics on :%d/metrics", server.server_port)
    _on_stop_signals(runtime.request_stop)
    raise typer.Exit(runtime.run())


def _on_stop_signals(stop: Callable[[], None]) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
