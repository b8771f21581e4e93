"""ops/lab/bench/shed_cpu.py runs end to end (tiny sizes) and reports both paths."""

from __future__ import annotations

from typer.testing import CliRunner

from ops.lab.bench.shed_cpu import app


def test_shed_cpu_bench_reports_the_shortcut_and_the_route(redis_url: str) -> None:
    result = CliRunner().invoke(app, ["--rounds", "1", "--requests", "5", "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["shortcut", "route"]
    assert all("µs/429" in line for line in lines)
