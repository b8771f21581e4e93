"""A GPU node installs the core and the worker extra only, and the worker still runs."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_worker_extra_runs_the_worker_without_the_api_or_the_lab(tmp_path: Path) -> None:
    env_dir = tmp_path / "worker-node"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-e", f"{REPO}[worker]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    shown = subprocess.run(
        [str(env_dir / "bin" / "tidegate"), "worker", "--help"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "--vllm-url" in shown.stdout
    for absent in ("fastapi", "uvicorn", "matplotlib", "fakeredis", "opentelemetry"):
        probe = subprocess.run([str(python), "-c", f"import {absent}"], capture_output=True, timeout=60)
        assert probe.returncode != 0, f"{absent} is installed on a worker node"
    present = subprocess.run([str(python), "-c", "import pynvml, redis, rq"], capture_output=True, timeout=60)
    assert present.returncode == 0, present.stderr
    # Traces asked for without the `otel` extra: a warning naming the extra, and the node runs on.
    traced = subprocess.run(
        [str(python), "-c", "from shared.tracing import configure_tracing; print(configure_tracing('w'))"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "PATH": "/usr/bin:/bin"},
    )
    assert (traced.returncode, traced.stdout.strip()) == (0, "False"), traced.stderr
    assert "tidegate[otel]" in traced.stderr
