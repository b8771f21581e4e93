"""`tidegate mode`, `tidegate monitor --once` and `tidegate status` as an operator runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis
from rq.job import Job

from ops.lab.procs.ports import free_port
from producer.producer import Producer
from shared.keys import QueueKeys
from shared.queue import TicketQueue
from tests.conftest import RunCli as Run
from tests.monitor.support import RqQueues, fill
from tests.redis_cluster import suite_env
from tests.waiting import wait_until


def test_mode_set_and_show_are_recorded_and_enforced(
    run_cli: Run, producer: Producer, redis_client: Redis, queue_name: str
) -> None:
    shown = run_cli("mode", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"queue": queue_name, "mode": "normal"}

    changed = run_cli("mode", "set", "critical-only", "--actor", "alice", "--json")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout) == {
        "queue": queue_name,
        "mode": "critical-only",
        "previous": "normal",
        "actor": "alice",
    }
    rejected = producer.submit({"type": "complaint", "branch_id": "b1", "prompt": "hi"})
    assert rejected.outcome == "rejected" and rejected.code == "critical_only"

    doc = json.loads(run_cli("mode", "show", "--json").stdout)
    assert (doc["mode"], doc["actor"], doc["previous"]) == ("critical-only", "alice", "normal")
    assert "set by alice" in run_cli("mode", "show").stdout
    events = redis_client.xrange(QueueKeys(queue_name).events)
    assert [fields["kind"] for _, fields in events] == ["mode"]

    back = run_cli("mode", "set", "normal")
    assert back.returncode == 0 and "critical-only -> normal" in back.stdout


def test_mode_set_rejects_an_unknown_mode_with_exit_2(run_cli: Run) -> None:
    out = run_cli("mode", "set", "panic")
    assert out.returncode == 2
    assert "panic" in out.stderr and "critical-only" in out.stderr


def test_monitor_once_publishes_and_status_shows_level_mode_and_transitions(
    run_cli: Run, ticket_queue: TicketQueue, rq_queues: RqQueues, queue_name: str
) -> None:
    fill(ticket_queue, 52)
    queues = (
        "--actions-queue",
        rq_queues.jobs.actions_queue,
        "--callbacks-queue",
        rq_queues.jobs.callbacks_queue,
    )
    once = run_cli("monitor", "--once", "--json", *queues)
    assert once.returncode == 0, once.stderr
    doc = json.loads(once.stdout)
    assert (doc["acting"], doc["level"], doc["depth"], doc["queue"]) == (True, "orange", 52, queue_name)
    assert [(t["from"], t["to"]) for t in doc["transitions"]] == [("green", "yellow"), ("yellow", "orange")]
    assert doc["desired_workers"] >= 1

    run_cli("mode", "set", "critical-only")
    status = json.loads(run_cli("status", "--json").stdout)
    assert (status["level"], status["mode"], status["depth"]) == ("orange", "critical-only", 52)
    assert [(e["from"], e["to"], e["depth"]) for e in status["transitions"]] == [
        ("yellow", "orange", "52"),
        ("green", "yellow", "52"),
    ]  # newest first
    assert status["level_since"] == pytest.approx(doc["at"])
    human = run_cli("status").stdout
    assert "orange" in human and "critical-only" in human and "yellow→orange" in human

    jobs = [Job.fetch(job_id, connection=rq_queues.conn) for job_id in rq_queues.actions.job_ids]
    assert [job.func_name.rpartition(".")[2] for job in jobs] == ["scale_out", "degrade"]


def test_monitor_rejects_a_lock_ttl_shorter_than_the_interval(run_cli: Run) -> None:
    out = run_cli("monitor", "--once", "--interval", "2", "--lock-ttl", "1")
    assert out.returncode == 2 and "--lock-ttl" in out.stderr


def test_monitor_and_status_show_each_queue_they_are_given(
    run_cli: Run,
    ticket_queue: TicketQueue,
    rq_queues: RqQueues,
    queue_name: str,
    second_queue: str,
    redis_client: Redis,
) -> None:
    fill(ticket_queue, 35)
    fill(TicketQueue(redis_client, ticket_queue.policy, second_queue), 3)
    jobs = (
        "--actions-queue",
        rq_queues.jobs.actions_queue,
        "--callbacks-queue",
        rq_queues.jobs.callbacks_queue,
    )
    once = run_cli("monitor", "--once", "--json", "--queue", f"{queue_name},{second_queue}", *jobs)
    assert once.returncode == 0, once.stderr
    sampled = [(d["queue"], d["acting"], d["level"], d["depth"]) for d in json.loads(once.stdout)["queues"]]
    assert sampled == [(queue_name, True, "yellow", 35), (second_queue, True, "green", 3)]

    shown = run_cli("status", "--json", "--queue", queue_name, "--queue", second_queue)
    assert shown.returncode == 0, shown.stderr
    docs = json.loads(shown.stdout)["queues"]
    assert [(d["queue"], d["level"], d["depth"]) for d in docs] == [
        (queue_name, "yellow", 35),
        (second_queue, "green", 3),
    ]
    assert json.loads(run_cli("status", "--json").stdout)["queue"] == queue_name, (
        "one queue: its document alone"
    )
    human = run_cli("status", "--queue", f"{queue_name},{second_queue}").stdout
    assert queue_name in human and second_queue in human and "yellow" in human
    bad = run_cli("status", "--queue", "no way")
    assert bad.returncode == 2 and "--queue: 'no way'" in bad.stderr


def test_one_monitor_process_watches_several_queues_and_serves_their_metrics(
    redis_url: str,
    redis_client: Redis,
    ticket_queue: TicketQueue,
    queue_name: str,
    second_queue: str,
    rq_queues: RqQueues,
) -> None:
    fill(ticket_queue, 35)
    port = free_port()
    args = ["monitor", "--queue", queue_name, "--queue", second_queue, "--interval", "0.2", "--lock-ttl", "2"]
    # The alarm's action jobs go to this test's rq queues, which the fixture deletes afterwards.
    args += [
        "--actions-queue",
        rq_queues.jobs.actions_queue,
        "--callbacks-queue",
        rq_queues.jobs.callbacks_queue,
    ]
    monitor = subprocess.Popen(
        [sys.executable, "-c", "from tidegate.cli import main; main()", *args, "--metrics-port", str(port)],
        env={**os.environ, **suite_env(redis_url)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    keys = [QueueKeys(queue_name), QueueKeys(second_queue)]
    try:

        def published() -> bool:
            assert monitor.poll() is None, "the monitor exited"
            return all(redis_client.hget(k.alarm, "level") for k in keys)

        wait_until(published, 30, "both queues' alarms published", interval=0.1)
        assert [redis_client.hget(k.alarm, "level") for k in keys] == ["yellow", "green"]
        body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        families = {f.name: f for f in text_string_to_metric_families(body)}
        depth = {s.labels["queue"]: s.value for s in families["tidegate_queue_depth_all_types"].samples}
        assert depth == {queue_name: 35, second_queue: 0}
    finally:
        monitor.send_signal(signal.SIGTERM)
        _, stderr = monitor.communicate(timeout=30)
    assert monitor.returncode == 0, stderr
    assert not any(redis_client.exists(k.monitor_lock) for k in keys), "each queue's lock was given up"
