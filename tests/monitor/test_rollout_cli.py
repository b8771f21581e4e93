"""`tidegate rollout` as an operator runs it, `tidegate status`, the report's plot and the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from ops.lab.procs.ports import free_port
from ops.lab.sim.process import SimulatorProcess
from shared.keys import QueueKeys
from shared.metrics import build_registry
from shared.policy import Policy, RolloutPolicy
from shared.rollout_report import rollout_report
from shared.rollout_stats import record_call, record_shadow
from shared.rollout_store import RolloutStore
from tests.conftest import RunCli


def test_start_refuses_a_candidate_serving_another_version(run_cli: RunCli) -> None:
    with SimulatorProcess(model="qwen-sim:2026.12", time_scale=20) as sim:
        wrong = run_cli("rollout", "start", "--candidate", sim.base_url, "--version", "2026.11")
        right = run_cli("rollout", "start", "--candidate", sim.base_url, "--version", "2026.12", "--json")
    assert wrong.returncode == 2 and "--version" in wrong.stderr and "qwen-sim:2026.12" in wrong.stderr
    assert right.returncode == 0 and json.loads(right.stdout)["version"] == "2026.12"


def test_an_operator_starts_pauses_reports_and_rolls_back(
    run_cli: RunCli, tmp_path: Path, queue_name: str
) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # not started yet: its version cannot be checked
    started = run_cli(
        "rollout",
        "start",
        "--candidate",
        down,
        "--version",
        "2026.12",
        "--interval",
        "90m",
        "--shadow",
        "0.1",
        "--json",
    )
    assert started.returncode == 0, started.stderr
    doc = json.loads(started.stdout)
    assert (doc["status"], doc["wave"], doc["interval_seconds"], doc["queue"]) == (
        "running",
        0,
        5400.0,
        queue_name,
    )

    again = run_cli("rollout", "start", "--candidate", down, "--version", "2026.13")
    assert again.returncode == 1 and "is running" in again.stderr
    bad = run_cli("rollout", "start", "--candidate", down, "--version", "x", "--shadow", "1.5")
    assert bad.returncode == 2 and "--shadow" in bad.stderr
    assert run_cli("rollout", "pause").stdout.startswith(f"rollout {doc['id']}")

    status = json.loads(run_cli("status", "--json").stdout)
    assert status["rollout"]["status"] == "paused" and status["rollout"]["version"] == "2026.12"
    plot = tmp_path / "rollout.png"
    report = run_cli("rollout", "report", "--json", "--plot", str(plot))
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["shadow"]["records"] == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = run_cli("rollout", "report")
    assert "TTFT p95" in table.stdout and "wave 0:" in table.stdout

    rolled = json.loads(run_cli("rollout", "rollback", "--reason", "drill", "--json").stdout)
    assert (rolled["status"], rolled["reason"]) == ("rolled_back", "drill")
    assert run_cli("rollout", "resume").returncode == 1


def test_the_report_compares_shadow_answers_and_the_metrics_show_the_rollout(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    registry = build_registry(redis_client, policy, queue_name, include_process=False)

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "queue"))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("tidegate_rollout") and s.labels["queue"] == keys.queue
        }

    assert samples()[("tidegate_rollout_wave", (("status", "none"), ("version", "")))] == -1
    state = RolloutStore(redis_client, keys).start(
        candidate_url="http://c:8000", version="v2", interval_seconds=60, shadow_fraction=0.5, actor="t"
    )
    kept = RolloutPolicy(shadow_records=10)
    for n in range(12):
        answer = {
            "ttft_seconds": 0.1 * (n + 1),
            "tpot_seconds": 0.01,
            "total_seconds": 1.0,
            "completion_tokens": 20,
            "prompt_tokens": 5,
            "error": None,
        }
        failed = {"error": "connection: refused"}
        record_shadow(
            redis_client,
            keys,
            kept,
            state.id,
            {
                "ticket": f"t{n}",
                "at": 1000.0 + n,
                "primary": answer,
                "candidate": failed if n % 2 else answer,
                "similarity": None if n % 2 else 0.5,
            },
        )
    for outcome in ("ok", "ok", "error"):
        record_call(
            redis_client,
            keys,
            kept,
            rollout_id=state.id,
            wave=0,
            arm="candidate",
            outcome=outcome,
            ttft_seconds=0.2,
        )
    doc = rollout_report(redis_client, keys)
    assert doc is not None
    control, candidate = doc["shadow"]["arms"]
    assert doc["shadow"]["records"] == 10, "only the latest shadow_records are kept"
    assert (control["answers"], control["errors"], candidate["answers"], candidate["errors"]) == (
        10,
        0,
        10,
        5,
    )
    assert doc["shadow"]["similarity_mean"] == 0.5
    assert control["ttft_p95_seconds"] == 1.2 and candidate["ttft_p50_seconds"] == 0.7
    assert cast("int", redis_client.ttl(keys.rollout_shadow(state.id))) > 0, "shadow records expire"
    figures = samples()
    assert figures[("tidegate_rollout_wave", (("status", "running"), ("version", "v2")))] == 0
    assert figures[("tidegate_rollout_calls_total", (("arm", "candidate"), ("outcome", "error")))] == 1
    assert figures[("tidegate_rollout_calls_total", (("arm", "candidate"), ("outcome", "ok")))] == 2
