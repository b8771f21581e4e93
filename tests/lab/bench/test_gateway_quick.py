"""`tidegate bench gateway` with small sizes: real processes, every stream completes, figures present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis


@pytest.mark.timeout(120)
def test_gateway_bench_completes_every_stream_and_reports_its_figures(
    redis_url: str, redis_client: Redis, tmp_path: Path
) -> None:
    before = set(redis_client.scan_iter(match="*bench-gateway-*", count=1000))
    env = os.environ | {"TIDEGATE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-c", "from tidegate.cli import main; main()", "bench", "gateway"]
    run = subprocess.run(
        [*command, "--calls", "3", "--streams", "30", "--json", "--results-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    many = doc["many_streams"]
    assert (many["completed"], many["failed"]) == (30, 0)
    assert many["chunks_relayed"] >= 30 and many["kib_per_open_stream"] is not None
    low = doc["low_load"]
    assert low["gateway"]["p50_ms"] > 0 and low["direct"]["p50_ms"] > 0
    assert json.loads((tmp_path / "results.json").read_text())["many_streams"] == many
    left = set(redis_client.scan_iter(match="*bench-gateway-*", count=1000)) - before
    assert not left, f"the bench left its queue behind: {sorted(left)[:5]}"
