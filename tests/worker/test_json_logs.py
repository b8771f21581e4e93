"""Every process logs one JSON object per line, and a ticket's lines carry its id, branch and type
(and the worker's id on a worker), so one ticket can be followed from the API's log to the worker's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from ops.lab.procs.ports import free_port, http_ok
from ops.lab.sim.process import SimulatorProcess
from tests.waiting import wait_until
from tests.worker.conftest import REPO

START_TIMEOUT_S = 20.0


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "the process logged nothing"
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
    for record in parsed:
        assert {"time", "level", "logger", "process", "message"} <= record.keys(), record
    return parsed


def tidegate(*args: str) -> list[str]:
    return [sys.executable, "-c", "from tidegate.cli import main; main()", *args]


def test_a_ticket_is_found_by_its_id_in_api_and_worker_logs(
    simulator: Callable[..., SimulatorProcess], worker_env: dict[str, str], queue_name: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {**worker_env, "TIDEGATE_OPERATOR_KEY": "op_logs_test", "TIDEGATE_QUEUE_NAME": queue_name}
    api_log = tmp_path / "api.log"
    with api_log.open("w") as sink:
        api = subprocess.Popen(
            tidegate("api", "--host", "127.0.0.1", "--port", str(port)),
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            def answers() -> bool:
                assert api.poll() is None, api_log.read_text()
                return http_ok(f"http://127.0.0.1:{port}/livez")

            wait_until(answers, START_TIMEOUT_S, "the API to answer /livez", interval=0.1)
            answer = requests.post(
                f"http://127.0.0.1:{port}/v1/tickets",
                json={"type": "complaint", "branch_id": "0412", "prompt": "my card was charged twice"},
                headers={"Authorization": "Bearer op_logs_test"},
                timeout=10,
            )
            assert answer.status_code == 202, answer.text
            ticket_id = answer.json()["id"]
        finally:
            api.send_signal(signal.SIGINT)
            api.wait(timeout=20)
    sim = simulator()
    worker = subprocess.run(
        [sys.executable, "-m", "worker", "--vllm-url", sim.base_url, "--queue", queue_name, "--burst",
         "--block-seconds", "0.5", "--gpu-backend", "sim"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr

    api_records = json_lines(api_log.read_text())
    (submitted,) = [r for r in api_records if r.get("ticket_id") == ticket_id]
    assert (submitted["branch_id"], submitted["type"]) == ("0412", "complaint")
    assert any(r["logger"].startswith("uvicorn") for r in api_records), "uvicorn's lines are JSON too"

    worker_records = json_lines(worker.stderr)
    (done,) = [r for r in worker_records if r.get("ticket_id") == ticket_id]
    assert done["message"] == f"ticket {ticket_id}: done"
    assert (done["branch_id"], done["type"]) == ("0412", "complaint")
    assert done["worker"] and all(r.get("worker") == done["worker"] for r in worker_records)


def test_the_monitor_logs_json(worker_env: dict[str, str], queue_name: str, tmp_path: Path) -> None:
    env = {**worker_env, "TIDEGATE_QUEUE_NAME": queue_name}
    log_path = tmp_path / "monitor.log"
    with log_path.open("w") as sink:
        monitor = subprocess.Popen(
            tidegate("monitor", "--interval", "0.2", "--lock-ttl", "1", "--metrics-port", "0"),
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=sink,
        )  # fmt: skip

        def watching() -> bool:
            assert monitor.poll() is None, log_path.read_text()
            return "watching queue" in log_path.read_text()

        wait_until(watching, START_TIMEOUT_S, "the monitor to start watching", interval=0.1)
        monitor.send_signal(signal.SIGINT)
        monitor.wait(timeout=20)
    records = json_lines(log_path.read_text())
    assert {r["logger"] for r in records} >= {"tidegate.monitor"}
