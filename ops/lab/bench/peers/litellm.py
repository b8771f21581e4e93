"""LiteLLM proxy (`litellm[proxy]`, about 750 MB) in front of the simulators, as a peer arm.

What it is, said plainly: LiteLLM's scheduler queues only while every deployment cools down, so in
front of healthy simulators it does not order requests by priority. Its `max_parallel_requests` per
deployment is a concurrency cap: a request beyond it is answered 429 at once, whatever its type.
The cap is tidegate's worker batch, so each GPU gets the same concurrency as in the other arms;
LiteLLM's own retries are off so the branches' retry rules apply, as in every arm. The proxy needs a
master key (a random one per run); it runs without a database.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

from ops.lab.bench.peers.venv import peer_executable
from ops.lab.procs.children import ChildProcess
from ops.lab.procs.ports import free_port, http_ok

LITELLM_REQUIREMENT = "litellm[proxy]==1.108.7"
"""The newest release whose `proxy` extra installs from the package index here (1.110's does not)."""
MODEL_GROUP = "sim"
READY_TIMEOUT_S = 180.0
"""The proxy imports for tens of seconds on a busy 2-core machine."""


def litellm_command(progress: Callable[[str], None] = lambda line: None) -> Path:
    return peer_executable("litellm", LITELLM_REQUIREMENT, "litellm", progress)


def litellm_config(model: str, worker_urls: Sequence[str], max_parallel_requests: int) -> dict[str, object]:
    """One deployment per simulator, each capped at `max_parallel_requests`, no retries or fallbacks."""
    deployments = [
        {
            "model_name": MODEL_GROUP,
            "litellm_params": {
                "model": f"hosted_vllm/{model}",
                "api_base": f"{url.rstrip('/')}/v1",
                "api_key": "none",
                "max_parallel_requests": max_parallel_requests,
            },
        }
        for url in worker_urls
    ]
    return {
        "model_list": deployments,
        "litellm_settings": {"num_retries": 0, "request_timeout": 600},
        "router_settings": {"num_retries": 0},
    }


class LitellmGateway:
    """One `litellm` proxy process on 127.0.0.1, its config written beside its log."""

    def __init__(
        self, model: str, worker_urls: Sequence[str], max_parallel_requests: int, run_dir: Path
    ) -> None:
        self.config = litellm_config(model, worker_urls, max_parallel_requests)
        self.run_dir = run_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = f"sk-{secrets.token_hex(16)}"
        self.child: ChildProcess | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def start(self, executable: Path) -> LitellmGateway:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / "litellm-config.yaml"
        config.write_text(json.dumps(self.config, indent=2))  # JSON is YAML
        command = [
            str(executable),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--num_workers",
            "1",
        ]
        env = os.environ | {"LITELLM_MASTER_KEY": self.key, "LITELLM_LOG": "ERROR"}
        self.child = ChildProcess("litellm", command, self.run_dir / "litellm.log", env=env).start()
        self.child.wait_ready(
            lambda: http_ok(self.url + "/health/liveliness"), READY_TIMEOUT_S, "/health/liveliness 200"
        )
        return self

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(5.0)
