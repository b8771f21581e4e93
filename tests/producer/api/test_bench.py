"""ops/lab/bench/api_rate.py runs end to end (tiny sizes) and reports every figure."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ops.lab.bench.api_rate import app, roomy_policy_text
from shared.policy import parse_policy


def test_roomy_policy_keeps_admission_out_of_the_way() -> None:
    policy = parse_policy(roomy_policy_text())
    assert min(t.cap for t in policy.types.values()) >= 10_000_000
    assert policy.alarms.yellow >= 10_000_000


def test_api_rate_bench_reports_all_figures(redis_url: str) -> None:
    args = [
        "--runs",
        "1",
        "--seconds",
        "0.5",
        "--threads",
        "2",
        "--workers",
        "2",
        "--redis-url",
        redis_url,
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    median = json.loads(result.stdout)["median"]
    assert median["api_accepts_per_s"] > 0
    assert median["direct_accepts_per_s"] > 0
    assert median["shed_answers"] > 0
    assert median["api_errors"] == 0
    assert 0 < median["shed_alone_p50_ms"] <= median["shed_alone_p99_ms"]
    assert median["server_shed_alone_p99_ms"] > 0  # timed inside the server, every worker's answers
    assert median["server_shed_p99_ms"] > 0
    assert median["generator_cores"] > 0
