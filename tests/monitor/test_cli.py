"""`tidegate mode`, `tidegate monitor --once` and `tidegate status` as an operator runs them."""

from __future__ import annotations

import json

import pytest
from redis import Redis
from rq.job import Job

from producer.producer import Producer
from shared.keys import QueueKeys
from shared.queue import TicketQueue
from tests.conftest import RunCli as Run
from tests.monitor.support import RqQueues, fill


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
