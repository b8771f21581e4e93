"""The process stack: it comes up healthy, serves a ticket end to end, and leaves no process behind —
neither after `stop()` nor when its parent is terminated without calling it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from ops.lab.procs.process_group import group_alive
from ops.lab.stack import Stack, StackConfig
from tests.waiting import seconds_until, wait_until

LEFTOVER_WAIT_S = 15.0


def wait_gone(pids: list[int], timeout: float = LEFTOVER_WAIT_S) -> list[int]:
    seconds_until(lambda: not any(group_alive(pid) for pid in pids), timeout, interval=0.1)
    return [pid for pid in pids if group_alive(pid)]


def test_stack_serves_a_ticket_and_stops_every_process(
    redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    stack = Stack(StackConfig(redis_url=redis_url, queue_name=queue_name, run_dir=tmp_path, gpus=1))
    with stack:
        key = stack.branch_key("branch-001")
        assert stack.branch_key("branch-001") == key  # created once, then reused
        headers = {"Authorization": f"Bearer {key}"}
        accepted = requests.post(
            f"{stack.api_url}/v1/tickets",
            json={"type": "loan_approval", "prompt": "Assess this loan file.", "max_tokens": 32},
            headers=headers,
            timeout=10,
        )
        assert accepted.status_code == 202, accepted.text
        ticket_id = accepted.json()["id"]

        def ended() -> dict[str, Any] | None:
            view = requests.get(f"{stack.api_url}/v1/tickets/{ticket_id}", headers=headers, timeout=10).json()
            return view if view["status"] not in ("queued", "running") else None

        view = wait_until(ended, 20, "the ticket to end", interval=0.1)
        assert view["status"] == "done", view
        assert set(stack.metrics_urls) == {"api", "monitor", "worker-gpu0"}
        for url in stack.metrics_urls.values():
            assert requests.get(url, timeout=5).status_code == 200
        queues = requests.get(
            f"{stack.api_url}/v1/queues", headers={"Authorization": f"Bearer {stack.operator_key}"}, timeout=5
        ).json()
        assert [w["worker_id"] for w in queues["workers"]["details"]] == [stack.worker_id(0)]
        pids = stack.pids()
        assert len(pids) == 4  # simulator, worker, monitor, API
    assert wait_gone(pids, timeout=1.0) == []
    assert {p.name for p in tmp_path.glob("*.log")} == {
        "sim-gpu0.log",
        "worker-gpu0.log",
        "monitor.log",
        "api.log",
    }


STACK_SCRIPT = """
import json, sys, time
from pathlib import Path
from ops.lab.stack import Stack, StackConfig
from tests.waiting import seconds_until, wait_until
from ops.lab.procs.children import stop_children_on_sigterm
stop_children_on_sigterm()
stack = Stack(StackConfig(redis_url=sys.argv[1], queue_name=sys.argv[2], run_dir=Path(sys.argv[3]), gpus=1))
stack.start()  # no `with`, no stop(): only the exit hooks stand between these children and orphanhood
print(json.dumps(stack.pids()), flush=True)
time.sleep(600)
"""


def test_terminating_the_parent_leaves_no_orphans(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", STACK_SCRIPT, redis_url, queue_name, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        assert parent.stdout is not None
        pids = json.loads(parent.stdout.readline())
        assert len(pids) == 4 and all(group_alive(pid) for pid in pids)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=LEFTOVER_WAIT_S) == 128 + signal.SIGTERM
    finally:
        if parent.poll() is None:
            parent.kill()
    assert wait_gone(pids) == []
