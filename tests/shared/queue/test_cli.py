"""`tidegate enqueue / ticket / status` as a user runs them, against a real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RunCli


def test_enqueue_ticket_status(run_cli: RunCli) -> None:
    out = run_cli(
        "enqueue", "--type", "loan_approval", "--branch", "0412", "--urgent-level", "3", "--prompt", "hi"
    )
    assert out.returncode == 0, out.stderr
    ticket_id = out.stdout.strip()
    assert len(ticket_id) == 26
    shown = run_cli("ticket", ticket_id, "--json")
    doc = json.loads(shown.stdout)
    assert (doc["status"], doc["priority"], doc["type"]) == ("queued", -0.3, "loan_approval")
    human = run_cli("ticket", ticket_id)
    assert "queued" in human.stdout and "-0.3" in human.stdout
    status = json.loads(run_cli("status", "--json").stdout)
    assert status["depth"] == 1 and status["depth_by_type"]["loan_approval"] == 1
    assert status["level"] == "green" and status["mode"] == "normal"
    assert "loan_approval" in run_cli("status").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--type", "mortgage"], "unknown ticket type 'mortgage'; known types: loan_approval"),
        (["--type", "loan_approval", "--urgent-level", "9"], "urgent_level"),
        (["--type", "complaint", "--prompt", ""], "prompt: prompt must not be empty"),
    ],
)
def test_bad_input_exits_2_with_one_line(run_cli: RunCli, args: list[str], message: str) -> None:
    base = {"--branch": "0412", "--prompt": "hello"}
    flags = [*args]
    for flag, value in base.items():
        if flag not in flags:
            flags += [flag, value]
    out = run_cli("enqueue", *flags)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert json.loads(run_cli("status", "--json").stdout)["depth"] == 0


def test_jsonl_file_enqueues_good_lines_and_counts_bad(run_cli: RunCli, tmp_path: Path) -> None:
    lines = [
        json.dumps({"type": "complaint", "branch_id": "0412", "prompt": "a", "vip_level": 2}),
        "{not json",
        json.dumps({"type": "archive_query", "branch_id": "0412", "prompt": "b"}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"type": "complaint", "branch_id": "0412", "prompt": "c", "urgent_level": 9}),
    ]
    path = tmp_path / "tickets.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = run_cli("enqueue", "--file", str(path), "--json")
    assert out.returncode == 2
    summary = json.loads(out.stdout)
    assert (summary["queued"], summary["invalid"]) == (2, 3)
    assert [e.split(":")[0] for e in summary["errors"]] == ["line 2", "line 4", "line 5"]
    assert json.loads(run_cli("status", "--json").stdout)["depth"] == 2


def test_unknown_ticket_and_missing_flags(run_cli: RunCli) -> None:
    missing = run_cli("ticket", "nope")
    assert missing.returncode == 2 and "no ticket 'nope'" in missing.stderr
    no_flags = run_cli("enqueue")
    assert no_flags.returncode == 2 and "missing --type, --branch, --prompt" in no_flags.stderr


def test_status_takes_the_redis_url_as_api_does(run_cli: RunCli, redis_url: str, queue_name: str) -> None:
    """`--redis-url` wins over the environment (here a port where nothing answers)."""
    env = {**os.environ, "TIDEGATE_REDIS_URL": "redis://127.0.0.1:1/0", "TIDEGATE_QUEUE_NAME": queue_name}
    command = [sys.executable, "-c", "from tidegate.cli import main; main()", "status", "--json"]
    without = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert without.returncode == 1 and "Redis" in without.stderr
    found = subprocess.run(
        [*command, "--redis-url", redis_url], capture_output=True, text=True, env=env, timeout=60
    )
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["queue"] == queue_name
