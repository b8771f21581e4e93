"""SMG (the Rust "Shepherd Model Gateway", `pip install smg`) in front of the simulators, as a peer arm.

SMG is a lab extra (see `venv.py`): the bench installs it on first use into a virtualenv of its own
and runs its `smg launch` command from there. The gateway binds 127.0.0.1 on free ports, runs its opt-in
priority scheduler with `peers/smg.yaml`, and gets each simulator registered with `POST /workers` and
a `max_running_requests` label: `--peer-slots`, else tidegate's worker batch (otherwise it counts 64
slots).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests

from ops.lab.bench.peers.venv import PeerUnavailable, peer_executable
from ops.lab.procs.children import ChildProcess
from ops.lab.procs.ports import free_port, http_ok
from shared.policy import Policy

SMG_REQUIREMENT = "smg==1.13.0"
CONFIG = Path(__file__).with_name("smg.yaml")
CLASS_BY_TYPE = {"loan_approval": "interactive", "complaint": "default", "archive_query": "bulk"}
"""The scheduler class of each ticket type of the default policy; see smg.yaml for why."""
PRIORITY_HEADER = "x-smg-priority"
READY_TIMEOUT_S = 30.0
BREAKER_PROBE_S = 5
"""Seconds before SMG's circuit breaker lets a request try a worker it opened on. Its default of 60
outlasted a crashed simulator's restart (90 model seconds, 22.5 s at time scale 4) and left SMG
answering 503 `no_available_workers` for most of a tight run after each crash: an operator would set
it to the engine's restart time, and a few seconds keeps the gap after a restart short."""


def smg_command(progress: Callable[[str], None] = lambda line: None) -> Path:
    """The `smg` executable, installed into its own virtualenv first when it is missing."""
    return peer_executable("smg", SMG_REQUIREMENT, "smg", progress)


def smg_class(policy: Policy, ticket_type: str) -> str:
    """The class a request of `ticket_type` asks for: the mapping above, else by criticality."""
    return CLASS_BY_TYPE.get(ticket_type) or ("interactive" if policy.is_critical(ticket_type) else "default")


class SmgGateway:
    """One `smg launch` with the priority scheduler, the simulators registered as its workers."""

    def __init__(self, worker_urls: Sequence[str], max_running_requests: int, run_dir: Path) -> None:
        self.worker_urls = list(worker_urls)
        self.max_running_requests = max_running_requests
        self.run_dir = run_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.child: ChildProcess | None = None

    def start(self, executable: Path) -> SmgGateway:
        command = [
            str(executable),
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--priority-scheduler-enabled",
            "--priority-scheduler-config",
            str(CONFIG),
            "--priority-scheduler-default-max-class",
            "interactive",
            "--disable-tokenizer-autoload",
            "--disable-retries",
            "--cb-timeout-duration-secs",
            str(BREAKER_PROBE_S),
            "--log-level",
            "warn",
        ]
        self.child = ChildProcess("smg", command, self.run_dir / "smg.log").start()
        self.child.wait_ready(lambda: http_ok(self.url + "/health"), READY_TIMEOUT_S, "/health 200")
        for worker in self.worker_urls:
            self._register(worker)
        return self

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(5.0)

    def _register(self, worker_url: str) -> None:
        body = {"url": worker_url, "labels": {"max_running_requests": str(self.max_running_requests)}}
        answer = requests.post(f"{self.url}/workers", json=body, timeout=10)
        if answer.status_code >= 300:
            raise PeerUnavailable(
                f"smg: POST /workers {body} answered {answer.status_code}: {answer.text[:300]}"
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(_ready(worker, worker_url) for worker in _workers(self.url)):
                return
            time.sleep(0.2)
        raise PeerUnavailable(
            f"smg: worker {worker_url} not ready within {READY_TIMEOUT_S:.0f} s; see {self.run_dir}"
        )


def _workers(url: str) -> list[dict[str, Any]]:
    try:
        workers: list[dict[str, Any]] = requests.get(f"{url}/workers", timeout=5).json().get("workers", [])
    except (requests.RequestException, ValueError):
        return []
    return workers


def _ready(worker: dict[str, Any], url: str) -> bool:
    return bool(worker.get("url") == url and worker.get("is_healthy") and worker.get("status") == "ready")
