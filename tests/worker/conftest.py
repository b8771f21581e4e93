"""Worker test fixtures: a fast policy, simulators over real HTTP, workers in-process or as processes.

Everything runs against the real Redis of the shared fixtures (one queue per test) and the
simulator over HTTP at a high time scale; leases and backoffs are short so recovery paths are
exercised in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.policy import Policy, default_policy_text, parse_policy
from shared.queue import TicketQueue
from tests.redis_cluster import suite_env
from worker.config import WorkerConfig
from worker.gpu_memory import make_provider
from worker.worker import Worker

REPO = Path(__file__).resolve().parents[2]

FAST_QUEUE_POLICY = """
[queue]
aging_seconds = 60
lease_seconds = 2
max_attempts = 3
retention_seconds = 600
context_limit_tokens = 32768
retry_backoff_seconds = 0.05
retry_backoff_max_seconds = 0.2
default_max_tokens = 64
"""


def _fast_policy_text() -> str:
    text = default_policy_text()
    _head, _, rest = text.partition("[types.loan_approval]")
    assert rest, "the default policy changed shape: [types.loan_approval] not found"
    # An open circuit holds tickets for open_seconds; scenarios that stop vLLM on purpose run in
    # seconds, so the breaker probes again after one.
    assert "open_seconds = 30 }" in rest, "the default policy's [breaker] changed shape"
    return (
        FAST_QUEUE_POLICY
        + "\n[types.loan_approval]"
        + rest.replace("open_seconds = 30 }", "open_seconds = 1 }")
    )


@pytest.fixture(scope="session")
def fast_policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "fast_policy.toml"
    path.write_text(_fast_policy_text(), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def fast_policy(fast_policy_file: Path) -> Policy:
    return parse_policy(fast_policy_file.read_text(encoding="utf-8"), str(fast_policy_file))


@pytest.fixture
def fast_queue(redis_client: Redis, fast_policy: Policy, queue_name: str) -> TicketQueue:
    return TicketQueue(redis_client, fast_policy, queue_name)


@pytest.fixture
def simulator() -> Iterator[Callable[..., SimulatorProcess]]:
    """Start simulators with flags (stopped at the end of the test)."""
    started: list[SimulatorProcess] = []

    def start(**flags: Any) -> SimulatorProcess:
        flags.setdefault("time_scale", 20)
        flags.setdefault("scheduling_policy", "priority")
        sim = SimulatorProcess(**flags).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


class RunningWorker:
    """A Worker on a background thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, name=f"test-{worker.config.worker_id}", daemon=True)

    def _run(self) -> None:
        self.exit_code = self.worker.run()

    def stop(self, timeout: float = 30.0) -> None:
        self.worker.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop in time"


@pytest.fixture
def start_worker(
    redis_client: Redis, fast_policy: Policy, queue_name: str
) -> Iterator[Callable[..., RunningWorker]]:
    """Start in-process workers on the test's queue; stopped (in order) at the end of the test."""
    workers: list[RunningWorker] = []

    def start(vllm_url: str, *, gpu_backend: str | None = "sim", **overrides: Any) -> RunningWorker:
        settings: dict[str, Any] = {
            "gpu": 0,
            "vllm_url": vllm_url,
            "worker_id": f"w{len(workers)}-{queue_name}",
            "queue_name": queue_name,
            "lease_seconds": fast_policy.queue.lease_seconds,
            "grace_seconds": 5.0,
            "heartbeat_seconds": 0.5,
            "resize_seconds": 0.2,
            "block_seconds": 0.5,
        }
        settings.update(overrides)
        provider = make_provider("sim", vllm_url) if gpu_backend == "sim" else None
        worker = Worker(WorkerConfig(**settings), redis_client, fast_policy, gpu_provider=provider)
        running = RunningWorker(worker)
        workers.append(running)
        running.thread.start()
        return running

    yield start
    for running in workers:
        if running.thread.is_alive():
            running.stop()


@pytest.fixture
def worker_env(redis_url: str, fast_policy_file: Path) -> dict[str, str]:
    """Environment for worker processes: the test Redis and the fast policy."""
    env = dict(os.environ)
    env.update(suite_env(redis_url))
    env.update(
        TIDEGATE_POLICY_FILE=str(fast_policy_file),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def spawn_worker(
    worker_env: dict[str, str], queue_name: str, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `python -m worker` processes (killed at the end of the test if still running)."""
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(*args: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"worker-{len(processes)}.log").open("wb")
        command = [sys.executable, "-m", "worker", "--queue", queue_name, *args]
        process = subprocess.Popen(command, cwd=REPO, env=worker_env, stdout=log, stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    yield spawn
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def sim_metric(base_url: str, name: str, **labels: str) -> float:
    """One sample of the simulator's /metrics (summed over engines)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(base_url + "/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
