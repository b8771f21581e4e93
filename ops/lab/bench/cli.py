"""`tidegate bench queue`, `overload`, `gateway` and `inference-perf`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from shared.cli_support import fail, load_settings, print_json
from shared.redis_conn import RedisUnavailable, resolve_redis_url

if TYPE_CHECKING:
    from ops.lab.bench.scenario import OverloadScenario

app = typer.Typer(
    add_completion=False, help="Benchmarks: overload scenario, queue speed and the OpenAI front door."
)


@app.callback()
def bench() -> None:
    """Benchmarks: overload scenario, queue speed and the OpenAI front door."""


@app.command("queue")
def queue_command(
    quick: bool = typer.Option(False, "--quick", help="smaller sizes (about 30 s)"),
    repeat: int = typer.Option(3, "--repeat", min=1, help="runs per figure; medians are reported"),
    output: Path | None = typer.Option(None, "--output", help="write the JSON result here too"),
    as_json: bool = typer.Option(False, "--json"),
    cluster: bool = typer.Option(
        False, "--cluster", help="on a Redis Cluster: one queue's drain rate beside one queue per master"
    ),
) -> None:
    """Enqueue and pop→ack throughput beside raw Redis and RQ, measured in the same run."""
    from ops.lab.bench.queue_bench import QueueBench, Sizes, ratios

    settings = load_settings()
    try:
        url = resolve_redis_url(settings.redis_url)
    except RedisUnavailable as exc:
        fail(str(exc))
    if cluster:
        _cluster_command(url, settings.redis_cluster, quick, repeat, output)
        return
    result = QueueBench(url, Sizes.quick() if quick else Sizes(), repeat).run_all()
    doc = {
        "redis_url": url,
        "repeat": repeat,
        "rates_per_second": result.rates,
        "runs": result.runs,
        "latency_ms": result.latency_ms,
        "ratios": ratios(result),
    }
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=2))
    if as_json:
        print_json(doc)
        return
    console = Console()
    table = Table("operation", "per second (median)", "runs", title=f"queue speed, median of {repeat}")
    for name, rate in result.rates.items():
        table.add_row(name, f"{rate:,.0f}", " ".join(f"{r:,.0f}" for r in result.runs[name]))
    console.print(table)
    lat = Table("latency at low load", "ms")
    for name, value in result.latency_ms.items():
        lat.add_row(name, f"{value:.2f}")
    console.print(lat)
    rat = Table("ratio", "value")
    for name, value in ratios(result).items():
        rat.add_row(name, f"{value:.2f}")
    console.print(rat)


def _cluster_command(url: str, on_cluster: bool, quick: bool, repeat: int, output: Path | None) -> None:
    from ops.lab.bench.cluster_bench import run

    if not on_cluster:
        fail("--cluster: set TIDEGATE_REDIS_CLUSTER=true and TIDEGATE_REDIS_URL to a node of the cluster", 2)
    doc = run(url, tickets=3_000 if quick else 12_000, repeat=repeat).to_dict()
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=2))
    print_json(doc)


def _parse_mix(text: str, known: list[str]) -> dict[str, float]:
    """`loan_approval=0.2,complaint=0.5,archive_query=0.3` -> weights by type."""
    mix: dict[str, float] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, sep, weight = part.partition("=")
        if not sep or name not in known:
            fail(f"--mix {text!r}: {part!r} is not TYPE=WEIGHT with TYPE one of {', '.join(known)}", 2)
        try:
            mix[name] = float(weight)
        except ValueError:
            fail(f"--mix {text!r}: the weight of {name} ({weight!r}) is not a number", 2)
    if not mix or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        fail(f"--mix {text!r} is not accepted; give weights of 0 or more with a positive sum", 2)
    return mix


def _systems(text: str, baseline: bool) -> tuple[str, ...]:
    """`tidegate,fifo,smg` -> the arms in that order; `--no-baseline` leaves the FIFO out."""
    names = tuple(name for name in (part.strip() for part in text.split(",")) if name)
    return names if baseline else tuple(name for name in names if name != "fifo")


@app.command("overload")
def overload_command(
    quick: bool = typer.Option(False, "--quick", help="a 30 s surge (about 2 minutes in all), for CI"),
    duration: float | None = typer.Option(None, "--duration", help="seconds of offered load [240; quick 30]"),
    surge: float = typer.Option(2.5, "--surge", help="peak offered load, a fraction of capacity"),
    normal: float = typer.Option(0.6, "--normal", help="offered load before and after the surge"),
    mix: str = typer.Option(
        "loan_approval=0.2,complaint=0.5,archive_query=0.3", "--mix", help="ticket types and their weights"
    ),
    branches: int = typer.Option(200, "--branches", help="branch offices sending tickets"),
    gpus: int = typer.Option(1, "--gpus", help="simulated GPUs (one worker each; as many for the baseline)"),
    time_scale: float = typer.Option(4.0, "--time-scale", help="simulated GPU speed, times real time"),
    kv_blocks: int = typer.Option(2000, "--kv-blocks", help="KV-cache blocks (16 tokens) per GPU"),
    max_num_seqs: int = typer.Option(
        32, "--max-num-seqs", help="sequences per simulated GPU, every arm (tidegate's worker batch)"
    ),
    baseline_concurrency: int = typer.Option(
        24, "--baseline-concurrency", help="the FIFO baseline's fixed requests in flight per GPU"
    ),
    honour_retry_after: float = typer.Option(
        0.5, "--honour-retry-after", help="share of branches honouring Retry-After (others retry after 1 s)"
    ),
    seed: int = typer.Option(7, "--seed", help="workload seed"),
    client: str = typer.Option(
        "tickets",
        "--client",
        help="how the branches call each arm: tickets (tidegate: submit, poll; peers: whole /v1/completions "
        "answers) or openai (every arm: streamed /v1/completions from one asyncio open loop, TTFT per class; "
        "the FIFO baseline has no OpenAI door and keeps the seed's clients)",
    ),
    results_dir: Path | None = typer.Option(
        None, "--results-dir", help="where results go [results/bench-overload/<time>]"
    ),
    worker_option: list[str] | None = typer.Option(
        None,
        "--worker-option",
        help="a `tidegate worker` flag for tidegate's workers, repeatable; for ablation runs, e.g. "
        "--worker-option=--no-preemption, --worker-option=--critical-headroom=0",
    ),
    ablate: list[str] | None = typer.Option(
        None,
        "--ablate",
        help="take a mechanism that has no product setting out, repeatable: throttle (the worker's "
        "adaptive throttle), deadlines (early refusal by deadline and no start past it)",
    ),
    baseline: bool = typer.Option(
        True, "--baseline/--no-baseline", help="run the FIFO baseline too (leave it out for ablation runs)"
    ),
    system: str = typer.Option(
        "tidegate,fifo",
        "--system",
        help="arms to run one after another, each on fresh simulators: tidegate, fifo (the seed's FIFO), "
        "engine (the simulator's own priority scheduling, no gateway), smg (SMG's priority scheduler), "
        "litellm (the LiteLLM proxy's concurrency cap); peers install into ~/.cache/tidegate/peers on first use",
    ),
    ramp: float | None = typer.Option(
        None,
        "--ramp",
        help="seconds from normal load to the surge; 0 = a step [5% of --duration: 12 s of 240]",
    ),
    memory: str = typer.Option(
        "tight",
        "--memory",
        help="tight: --kv-blocks in crash-on-OOM mode; ample: the GPU's whole KV cache in preempt mode, "
        "so no arm can crash it",
    ),
    peer_slots: int | None = typer.Option(
        None,
        "--peer-slots",
        help="requests each peer gateway sends one GPU at once (SMG's max_running_requests, LiteLLM's "
        "max_parallel_requests) [tidegate's worker batch]",
    ),
    as_json: bool = typer.Option(False, "--json", help="print results.json's summary instead of the table"),
) -> None:
    """tidegate beside the arms named by --system, each under the same seeded overload on fresh simulators."""
    import time as _time

    from ops.lab.bench.overload import OverloadBench
    from ops.lab.bench.peers.venv import PeerUnavailable
    from ops.lab.bench.report import print_result
    from ops.lab.bench.scenario import OverloadScenario
    from ops.lab.bench.systems import OverloadError
    from ops.lab.embedded_redis import RedisStartError, ensure_redis
    from ops.lab.procs.children import ChildError, stop_children_on_sigterm

    settings = load_settings()
    policy = settings.policy
    values: dict[str, Any] = {
        "surge_load": surge,
        "normal_load": normal,
        "mix": _parse_mix(mix, list(policy.type_names)),
        "branches": branches,
        "gpus": gpus,
        "time_scale": time_scale,
        "kv_blocks": kv_blocks,
        "max_num_seqs": max_num_seqs,
        "baseline_concurrency": baseline_concurrency,
        "honour_retry_after": honour_retry_after,
        "seed": seed,
        "client": client,
        "worker_args": tuple(worker_option or ()),
        "ablate": tuple(ablate or ()),
        "systems": _systems(system, baseline),
        "ramp_s": ramp,
        "memory": memory,
        "peer_slots": peer_slots,
    }
    if duration is not None:
        values["duration_s"] = duration
    try:
        scenario = OverloadScenario.quick(**values) if quick else OverloadScenario(**values)
    except ValueError as exc:
        fail(str(exc), 2)
    folder = results_dir or Path("results") / "bench-overload" / _time.strftime("%Y%m%d-%H%M%S")
    errors = Console(stderr=True)
    began = _time.monotonic()
    stop_children_on_sigterm()
    try:
        redis = ensure_redis(settings.redis_url, run_dir=folder / "redis")
    except RedisStartError as exc:
        fail(str(exc))
    errors.print(f"Redis: {redis.describe()}; results in {folder}", highlight=False)
    command = overload_command_line(
        scenario, quick=quick, duration=duration, worker_options=worker_option or (), ablate=ablate or ()
    )
    bench = OverloadBench(
        scenario,
        redis.url,
        policy,
        folder,
        redis_shared=redis.shared,
        progress=lambda line: errors.print(f"[{_time.monotonic() - began:5.0f} s] {line}", highlight=False),
        command=command,
    )
    try:
        result = bench.run()
    except (OverloadError, ChildError, PeerUnavailable) as exc:
        fail(str(exc))
    finally:
        redis.stop()
    if as_json:
        document = {k: v for k, v in result.document.items() if k != "timelines"}
        print_json(document | {"results_dir": str(result.results_dir)})
    else:
        console = Console()
        print_result(console if console.is_terminal else Console(width=150), result)
    if not result.accounting_holds:
        raise typer.Exit(1)


def overload_command_line(
    scenario: OverloadScenario,
    *,
    quick: bool,
    duration: float | None,
    worker_options: Sequence[str],
    ablate: Sequence[str],
) -> str:
    """The command that reruns `scenario`, as results.json and the report quote it."""
    return (
        "tidegate bench overload"
        + (" --quick" if quick else "")
        + (f" --duration {duration:g}" if duration is not None else "")
        + f" --surge {scenario.surge_load:g}"
        + (f" --ramp {scenario.ramp_s:g}" if scenario.ramp_s is not None else "")
        + f" --memory {scenario.memory} --time-scale {scenario.time_scale:g}"
        + f" --system {','.join(scenario.systems)}"
        + (f" --client {scenario.client}" if scenario.client != "tickets" else "")
        + (f" --peer-slots {scenario.peer_slots}" if scenario.peer_slots is not None else "")
        + "".join(f" --worker-option={option}" for option in worker_options)
        + "".join(f" --ablate {name}" for name in ablate)
    )


@app.command("gateway")
def gateway_command(
    calls: int = typer.Option(
        40, "--calls", min=1, help="low-load calls each way (direct, through tidegate)"
    ),
    streams: int = typer.Option(1000, "--streams", min=1, help="concurrent streams on one API process"),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, help="tokens per answer"),
    results_dir: Path | None = typer.Option(
        None, "--results-dir", help="where results and logs go [results/bench-gateway/<time>]"
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The OpenAI front door: time to first token added vs the simulator directly, and N open streams."""
    import time as _time

    from ops.lab.bench.gateway import GatewayOptions, run_gateway_bench
    from ops.lab.procs.children import ChildError, stop_children_on_sigterm

    settings = load_settings()
    try:
        url = resolve_redis_url(settings.redis_url)
    except RedisUnavailable as exc:
        fail(str(exc))
    folder = results_dir or Path("results") / "bench-gateway" / _time.strftime("%Y%m%d-%H%M%S")
    stop_children_on_sigterm()
    try:
        doc = run_gateway_bench(
            url, folder, GatewayOptions(calls=calls, streams=streams, max_tokens=max_tokens)
        )
    except (ChildError, RuntimeError) as exc:
        fail(str(exc))
    (folder / "results.json").write_text(json.dumps(doc, indent=2))
    if as_json:
        print_json(doc | {"results_dir": str(folder)})
        return
    low = doc["low_load"]
    table = Table("time to first token", "p50 ms", "p99 ms", title=f"low load, {calls} calls each way")
    for name in ("direct", "gateway"):
        table.add_row(name, f"{low[name]['p50_ms']:.1f}", f"{low[name]['p99_ms']:.1f}")
    table.add_row("added by tidegate", f"{low['added_p50_ms']:.1f}", f"{low['added_p99_ms']:.1f}")
    console = Console()
    console.print(table)
    many = Table("many streams", "value", title=f"{streams} concurrent streams, one API process")
    for name, value in doc["many_streams"].items():
        many.add_row(name, str(value))
    console.print(many)


@app.command("inference-perf")
def inference_perf_command(
    rate: float = typer.Option(2.0, "--rate", help="Poisson arrivals per second, below capacity"),
    duration: int = typer.Option(60, "--duration", min=1, help="seconds of load"),
    prompt_tokens: int = typer.Option(1024, "--prompt-tokens", min=1, help="tokens in every prompt"),
    output_tokens: int = typer.Option(128, "--output-tokens", min=1, help="tokens in every answer"),
    ticket_type: str = typer.Option("complaint", "--type", help="the branch key's default ticket type"),
    time_scale: float = typer.Option(1.0, "--time-scale", help="simulated GPU speed, times real time"),
    seed: int = typer.Option(7, "--seed", help="inference-perf's seed (arrival times, prompts)"),
    results_dir: Path | None = typer.Option(
        None, "--results-dir", help="where results, config and logs go [results/bench-inference-perf/<time>]"
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """inference-perf (installed on first use into ~/.cache/tidegate/peers) drives the OpenAI front door
    once; its TTFT, latency, answered count and goodput beside tidegate's own tickets. Exits 1 when TTFT
    p50 or the answered count differ by more than 10%."""
    import time as _time

    from ops.lab.bench.iperf.bench import IperfOptions, run_iperf_bench
    from ops.lab.bench.iperf.config import LoadShape
    from ops.lab.bench.iperf.report import ReportError
    from ops.lab.bench.iperf.table import print_iperf
    from ops.lab.bench.peers.venv import PeerUnavailable
    from ops.lab.bench.sim_probe import SimProbeError
    from ops.lab.procs.children import ChildError, stop_children_on_sigterm

    settings = load_settings()
    if ticket_type not in settings.policy.type_names:
        fail(
            f"--type {ticket_type!r} is not a ticket type; use one of {', '.join(settings.policy.type_names)}",
            2,
        )
    try:
        url = resolve_redis_url(settings.redis_url)
        shape = LoadShape(rate, duration, prompt_tokens, output_tokens, seed)
    except RedisUnavailable as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc), 2)
    folder = results_dir or Path("results") / "bench-inference-perf" / _time.strftime("%Y%m%d-%H%M%S")
    errors = Console(stderr=True)
    began = _time.monotonic()
    stop_children_on_sigterm()
    try:
        doc = run_iperf_bench(
            url,
            settings.policy,
            folder,
            IperfOptions(shape=shape, ticket_type=ticket_type, time_scale=time_scale),
            progress=lambda line: errors.print(
                f"[{_time.monotonic() - began:5.0f} s] {line}", highlight=False
            ),
        )
    except (PeerUnavailable, ChildError, ReportError, SimProbeError) as exc:
        fail(str(exc))
    if as_json:
        print_json(doc)
    else:
        console = Console()
        print_iperf(console if console.is_terminal else Console(width=150), doc)
    if not doc["agreement_holds"]:
        raise typer.Exit(1)
