"""ops/lab/bench/submit_cpu.py runs end to end (tiny sizes) and reports both paths for each answer."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ops.lab.bench.submit_cpu import app


@pytest.mark.parametrize("answer", ["429", "202"])
def test_submit_cpu_bench_reports_the_shortcut_and_the_route(redis_url: str, answer: str) -> None:
    result = CliRunner().invoke(
        app, ["--answer", answer, "--rounds", "1", "--requests", "5", "--redis-url", redis_url]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["shortcut", "route"]
    assert all(f"µs/{answer}" in line for line in lines)
