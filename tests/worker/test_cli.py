"""`tidegate worker` as operators run it: probes, vLLM flags, bad input, the `--gpus` supervisor."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import cast

import pytest
from redis import Redis
from typer.testing import CliRunner, Result

from ops.lab.sim.process import SimulatorProcess
from shared.keys import QueueKeys
from shared.models import TicketStatus
from shared.queue import TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import REPO, RunningWorker
from tests.worker.support import all_ended, producer_for, submit_many
from tidegate.cli import app


def tidegate_worker(env: dict[str, str], *args: str) -> Result:
    """`tidegate worker ARGS` in this process (the runner swaps in `env` for the call)."""
    return CliRunner().invoke(app, ["worker", *args], env=env, terminal_width=200)


def test_check_follows_the_heartbeat(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    worker_env: dict[str, str],
    queue_name: str,
) -> None:
    assert tidegate_worker(worker_env, "--check", "--queue", queue_name).exit_code == 1
    sim = simulator()
    running = start_worker(sim.base_url)
    worker_id = running.worker.config.worker_id
    # The first heartbeat follows the first resize on the housekeeping thread: wait for the check
    # itself to pass rather than for a figure written before the beat.
    named = wait_until(
        lambda: (
            found
            if (
                found := tidegate_worker(
                    worker_env, "--check", "--queue", queue_name, "--worker-id", worker_id, "--json"
                )
            ).exit_code
            == 0
            else None
        ),
        10,
        "the worker's first heartbeat",
    )
    document = json.loads(named.stdout)
    assert document["alive"] is True and document["workers"][0]["worker_id"] == worker_id
    assert tidegate_worker(worker_env, "--check", "--queue", queue_name, "--gpu", "0").exit_code == 0
    assert tidegate_worker(worker_env, "--check", "--queue", queue_name, "--gpu", "1").exit_code == 1
    assert (
        tidegate_worker(worker_env, "--check", "--queue", queue_name, "--worker-id", "nobody").exit_code == 1
    )
    running.stop()
    gone = tidegate_worker(worker_env, "--check", "--queue", queue_name, "--worker-id", worker_id)
    assert gone.exit_code == 1 and "no live heartbeat" in gone.stderr


def test_print_vllm_args_from_the_simulated_node(
    simulator: Callable[..., SimulatorProcess], worker_env: dict[str, str]
) -> None:
    sim = simulator(gpus=2)
    shell = tidegate_worker(
        worker_env, "--print-vllm-args", "--gpu-backend", "sim", "--vllm-url", sim.base_url
    )
    assert shell.exit_code == 0, shell.output
    assert shell.stdout.split() == [
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.85",
        "--enable-chunked-prefill",
        "--scheduling-policy",
        "priority",
    ]
    printed = tidegate_worker(
        worker_env,
        "--print-vllm-args",
        "--json",
        "--gpu-backend",
        "sim",
        "--vllm-url",
        sim.base_url,
        "--gpus",
        "1",
    )
    document = json.loads(printed.stdout)
    assert document["gpus"] == 1 and document["max_num_seqs"] == 4
    assert any("max_position_embeddings" in note for note in document["notes"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "many", "--vllm-url", "http://127.0.0.1:1"], "gpus='many' is not accepted"),
        (["--max-batch", "0"], "max_batch"),
        (["--critical-headroom", "1"], "critical_headroom"),
        (["--model-config", "/nonexistent/config.json"], "cannot read"),
        (["--gpu", "3", "--vllm-url", "http://a:1,http://b:1"], "--gpu 3 has no URL"),
        (["--block-seconds", "30"], "block_seconds=30.0 is not accepted"),
        (["--log-level", "loud"], "log_level='loud' is not accepted"),
        (["--queue", "gold", "--queue", "no way"], "'no way' is not accepted"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(worker_env: dict[str, str], args: list[str], message: str) -> None:
    result = tidegate_worker(worker_env, *args)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr


def _registered(redis_client: Redis, keys: QueueKeys) -> dict[str, dict[str, str]]:
    ids = cast("list[str]", redis_client.zrange(keys.workers, 0, -1))
    return {i: cast("dict[str, str]", redis_client.hgetall(keys.worker(i))) for i in ids}


def test_gpus_all_supervises_one_worker_per_gpu_and_restarts_a_crashed_one(
    simulator: Callable[..., SimulatorProcess],
    worker_env: dict[str, str],
    redis_client: Redis,
    queue_name: str,
) -> None:
    sim = simulator(gpus=2)
    keys = QueueKeys(queue_name)
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker",
            "--gpus",
            "all",
            "--vllm-url",
            sim.base_url,
            "--gpu-backend",
            "sim",
            "--queue",
            queue_name,
            "--worker-id",
            "node",
            "--heartbeat-seconds",
            "0.3",
            "--block-seconds",
            "0.5",
        ],
        cwd=REPO,
        env=worker_env,
    )
    try:
        workers = wait_until(
            lambda: (w := _registered(redis_client, keys)) and len(w) == 2 and all(w.values()) and w,
            20,
            "two workers registered",
        )
        assert set(workers) == {"node-gpu0", "node-gpu1"}
        assert {w["gpu"] for w in workers.values()} == {"0", "1"}
        assert all(w["host"] == socket.gethostname() for w in workers.values())
        crashed_pid = int(workers["node-gpu1"]["pid"])
        os.kill(crashed_pid, signal.SIGKILL)
        wait_until(
            lambda: redis_client.hget(keys.worker("node-gpu1"), "pid") not in (None, str(crashed_pid)),
            20,
            "the crashed worker restarted under a new pid",
        )
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0
        assert redis_client.zcard(keys.workers) == 0, "every child left the registry"
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


def test_gpus_burst_drains_and_exits(
    simulator: Callable[..., SimulatorProcess],
    worker_env: dict[str, str],
    queue_name: str,
    fast_queue: TicketQueue,
) -> None:
    sim = simulator(gpus=2)
    ids = submit_many(producer_for(fast_queue), 12)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker",
            "--gpus",
            "2",
            "--vllm-url",
            sim.base_url,
            "--queue",
            queue_name,
            "--burst",
            "--block-seconds",
            "0.5",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    tickets = all_ended(fast_queue, ids)
    assert tickets is not None and {t.status for t in tickets} == {TicketStatus.DONE}
    assert {t.usage["gpu"] for t in tickets if t.usage} <= {0, 1}


def test_gpus_burst_drains_every_queue_it_serves(
    simulator: Callable[..., SimulatorProcess],
    worker_env: dict[str, str],
    queue_name: str,
    second_queue: str,
    fast_queue: TicketQueue,
    redis_client: Redis,
) -> None:
    sim = simulator(gpus=2)
    later = TicketQueue(redis_client, fast_queue.policy, second_queue)
    ids = {fast_queue: submit_many(producer_for(fast_queue), 4), later: submit_many(producer_for(later), 4)}
    flags = ["--queue", queue_name, "--queue", second_queue, "--burst", "--block-seconds", "0.5"]
    result = subprocess.run(
        [sys.executable, "-m", "worker", "--gpus", "2", "--vllm-url", sim.base_url, *flags],
        cwd=REPO,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for queue, queue_ids in ids.items():
        tickets = all_ended(queue, queue_ids)
        assert tickets is not None and {t.status for t in tickets} == {TicketStatus.DONE}, queue.keys.queue
