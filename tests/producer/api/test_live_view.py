"""`tidegate status` in the terminal: the level in its colour, the workers panel, the refresh time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from redis import Redis
from rich.console import Console

from producer.live_view import render_status
from producer.producer import Producer
from producer.status import operator_status
from shared.policy import Policy
from tests.conftest import RunCli
from worker.registry import WorkerRegistry

RED_BADGE = "\x1b[1;7;31m RED "
"""Bold, reversed, red: the level as a red block."""


def fill_past_red(producer: Producer, policy: Policy) -> None:
    critical = next(name for name, tp in policy.types.items() if tp.critical)
    producer.submit_many(
        [{"type": critical, "branch_id": "0412", "prompt": f"loan {i}"} for i in range(policy.alarms.red + 1)]
    )


def test_status_draws_red_in_red_with_workers_and_refresh_time(
    redis_client: Redis, producer: Producer, queue_name: str
) -> None:
    policy = producer.policy
    registry = WorkerRegistry(redis_client, producer.queue.keys, "node-b-gpu1", heartbeat_seconds=20)
    registry.heartbeat({"gpu": 1, "inflight": 5, "batch_limit": 16, "bound": "adaptive", "kv_usage": 0.9})
    fill_past_red(producer, policy)
    doc = operator_status(redis_client, policy, queue_name)
    console = Console(record=True, width=140, force_terminal=True, color_system="standard")
    console.print(render_status(doc, refreshed_at=doc["generated_at"]))
    coloured = console.export_text(styles=True, clear=False)
    plain = console.export_text()
    assert RED_BADGE in coloured
    assert "node-b-gpu1" in plain and "90%" in plain and "16" in plain and "adaptive" in plain
    assert "workers (1 alive)" in plain
    assert f"refreshed {time.strftime('%H:%M', time.localtime(doc['generated_at']))}" in plain
    registry.deregister()


def test_status_json_carries_workers_and_sheds(
    run_cli: RunCli, redis_client: Redis, producer: Producer
) -> None:
    registry = WorkerRegistry(redis_client, producer.queue.keys, "node-c-gpu0", heartbeat_seconds=20)
    registry.heartbeat({"gpu": 0, "batch_limit": 8})
    out = run_cli("status", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [w["worker_id"] for w in doc["workers"]] == ["node-c-gpu0"]
    assert doc["workers"][0]["batch_limit"] == 8
    assert doc["sheds"]["total"] == 0
    registry.deregister()


def test_status_watch_refreshes_until_interrupted(redis_url: str, queue_name: str) -> None:
    env = {**os.environ, "TIDEGATE_REDIS_URL": redis_url, "TIDEGATE_QUEUE_NAME": queue_name}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tidegate.cli import main; main()", "status", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    time.sleep(3)  # the watching process must run long enough to refresh; piped, it prints only when it stops
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "refreshed" in out and "GREEN" in out and "workers (0 alive)" in out
