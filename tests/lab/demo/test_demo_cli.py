"""`tidegate demo` as a newcomer runs it, shortened: a surge fires the alarms, loan approvals are never
shed, every request and every ticket is accounted for, and neither the end nor Ctrl-C leaves a process
or a key behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from redis import Redis

from shared.keys import QueueKeys
from tests.private_redis import private_redis
from tests.waiting import wait_until

DEMO = [sys.executable, "-c", "from tidegate.cli import main; main()", "demo"]


def demo_env(redis_url: str) -> dict[str, str]:
    return os.environ | {"TIDEGATE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}


def processes_of(queue: str) -> list[int]:
    """Pids whose environment names `queue`: every process the demo started for it."""
    marker = f"TIDEGATE_QUEUE_NAME={queue}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def queue_keys(client: Redis, queue: str) -> list[bytes]:
    pattern = QueueKeys(queue).prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    return list(client.scan_iter(match=pattern, count=1000))


OTHERS_KEYS = {
    "rq:job:someone-else": "a job of another rq user",
    "rq:queue:tidegate-actions": "another deployment's action queue",
    "{tidegate:default}:mode": "normal",
}


def test_short_demo_run_balances_its_books(tmp_path: Path) -> None:
    # A Redis of its own, holding someone else's keys: afterwards it holds exactly those again.
    with private_redis(tmp_path) as redis_url:
        client = Redis.from_url(redis_url, decode_responses=True)
        client.mset(OTHERS_KEYS)
        client.sadd("rq:queues", "rq:queue:tidegate-actions")
        run_dir = tmp_path / "run"
        _short_demo(redis_url, run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert set(client.keys("*")) == {*OTHERS_KEYS, "rq:queues"}, summary["queue"]
        assert client.smembers("rq:queues") == {"rq:queue:tidegate-actions"}
        assert client.mget(list(OTHERS_KEYS)) == list(OTHERS_KEYS.values())
        client.close()


def _short_demo(redis_url: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [*DEMO, "--duration", "20", "--no-live", "--drain-timeout", "30", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=110,
        env=demo_env(redis_url),
    )
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert re.search(
        r"accounting: done \+ rejected \+ expired \+ cancelled \+ failed = submitted: holds", out
    )
    assert re.search(r"alarms: fired, peak (yellow|orange|red)", out), out[-3000:]
    assert "loan_approval rejected: 0 (never shed)" in out
    assert re.search(r"requests: \d+ planned = within SLO \d+ \+ late \d+ .*: balances", out), out[-3000:]
    assert re.search(r"t=\s*\d+\.\ds (normal|surge|recovery|drain)", out)  # --no-live progress lines
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["checks"]["accounting_holds"] and summary["checks"]["critical_rejected"] == 0
    assert summary["checks"]["alarm_fired"]
    assert summary["ledgers"]["redis"] == summary["ledgers"]["clients"]
    assert summary["types"]["loan_approval"]["outcomes"]["done"] > 0
    assert any(a["level"] != "green" for a in summary["alarms"])
    tickets = (tmp_path / "tickets.jsonl").read_text().splitlines()
    assert len(tickets) == sum(t["requests"] for t in summary["types"].values())
    # One end per unique request, retries apart: the ends sum to the plan, whatever the retries.
    assert summary["checks"]["requests_balance"]
    assert sum(summary["requests"]["ends"].values()) == summary["requests"]["planned"] == len(tickets)
    assert {"api.log", "monitor.log", "worker-gpu0.log", "worker-gpu1.log"} <= {
        p.name for p in tmp_path.glob("*.log")
    }
    # A shared Redis: the demo's queue is gone afterwards, and so are its processes.
    assert queue_keys(Redis.from_url(redis_url), summary["queue"]) == []
    assert processes_of(summary["queue"]) == []


def test_ctrl_c_stops_everything_and_cleans_up(redis_url: str, tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [*DEMO, "--duration", "60", "--no-live", "--run-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=demo_env(redis_url),
    )
    queue = ""
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            found = re.search(r"queue (demo-[\w-]+)", line)
            queue = queue or (found.group(1) if found else "")
            if line.startswith("t="):  # the traffic is flowing
                break
        assert queue, "the demo never named its queue"
        # 2 simulators, 2 workers, monitor (+ its rq worker), API
        wait_until(lambda: len(processes_of(queue)) >= 6, 10, "every process of the demo")
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=40)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, rest[-3000:]
    assert "interrupted" in rest
    wait_until(lambda: processes_of(queue) == [], 10, "every process of the demo to exit", interval=0.1)
    assert queue_keys(Redis.from_url(redis_url), queue) == []
    assert list(Redis.from_url(redis_url).scan_iter(match=f"*{queue}*")) == []  # rq's too


def test_vllm_cpu_engine_that_is_not_installed_names_the_setup_script(tmp_path: Path) -> None:
    run = subprocess.run(
        [*DEMO, "--engine", "vllm-cpu", "--no-live"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"TIDEGATE_VLLM_VENV": str(tmp_path / "no-venv")},
    )
    assert run.returncode == 1
    assert "--engine vllm-cpu: vLLM-CPU is not installed" in run.stderr
    assert "ops/lab/vllm_cpu/setup_all.sh" in run.stderr


def test_bad_flags_exit_2_naming_the_flag() -> None:
    run = subprocess.run([*DEMO, "--surge", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--surge=0.0 is not accepted" in run.stderr
    run = subprocess.run([*DEMO, "--engine", "tpu"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--engine='tpu' is not accepted; use sim|vllm-cpu" in run.stderr
