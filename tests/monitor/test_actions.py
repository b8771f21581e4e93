"""Alarm actions as real rq jobs: run, recorded, undone in order, retried, failed into rq's registry."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from rq.job import Job

from ops.monitor.hooks import HookFailed, run_hook
from ops.monitor.loop import Monitor
from ops.monitor.rq_worker import start_worker_process, stop_worker_process
from shared.control import read_events
from shared.policy import AlarmLevel, HooksPolicy, Policy
from tests.fake_clock import FakeClock
from tests.monitor.conftest import MonitorFactory
from tests.monitor.support import RqQueues, fill
from tests.waiting import wait_until


def with_hooks(policy: Policy, **hooks: Any) -> Policy:
    return policy.model_copy(update={"hooks": HooksPolicy(timeout_seconds=5, **hooks)})


def python_hook(code: str, *args: str) -> str:
    return shlex.join([sys.executable, "-c", code, *args])


def actions(redis_client: Redis, monitor: Monitor) -> list[tuple[str, str]]:
    events = reversed(read_events(redis_client, monitor.keys, 1000))
    return [(e["action"], e["state"]) for e in events if e["kind"] == "action"]


def settle(monitor: Monitor, fake_clock: FakeClock, seconds: int) -> None:
    for _ in range(seconds):
        fake_clock.advance(1.0)
        monitor.tick()


def test_each_level_runs_its_action_as_a_job_and_green_undoes_them_in_order(
    make_monitor: MonitorFactory, redis_client: Redis, rq_queues: RqQueues, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    ids = fill(monitor.queue, 85)
    result = monitor.tick()
    assert result.level is AlarmLevel.RED
    jobs = [Job.fetch(job_id, connection=rq_queues.conn) for job_id in rq_queues.actions.job_ids]
    assert [job.func_name for job in jobs] == [
        "ops.monitor.actions.scale_out",
        "ops.monitor.actions.degrade",
        "ops.monitor.actions.reject_mode",
    ]
    assert actions(redis_client, monitor) == []  # nothing ran inside the monitor's loop
    rq_queues.work()
    assert actions(redis_client, monitor) == [
        ("scale_out", "started"),
        ("scale_out", "done"),
        ("degrade", "started"),
        ("degrade", "done"),
        ("reject_mode", "started"),
        ("reject_mode", "done"),
    ]
    figures = redis_client.hgetall(monitor.keys.monitor_state)
    assert int(figures["desired_workers"]) == result.desired_workers
    assert not {"degraded", "rejecting", "scale_requested"} & set(figures)  # the level itself is the state

    for ticket_id in ids:
        monitor.queue.cancel(ticket_id)
    settle(monitor, fake_clock, 10)
    assert monitor.tick().level is AlarmLevel.GREEN
    rq_queues.work()
    assert actions(redis_client, monitor)[6:] == [
        ("reject_mode", "undone"),
        ("degrade", "undone"),
        ("scale_out", "undone"),
    ]


def test_a_failing_scale_hook_ends_in_rqs_failed_registry_and_the_monitor_goes_on(
    make_monitor: MonitorFactory,
    redis_client: Redis,
    policy: Policy,
    rq_queues: RqQueues,
    fake_clock: FakeClock,
) -> None:
    failing = python_hook("import sys; print('autoscaler said no', file=sys.stderr); sys.exit(3)")
    monitor = make_monitor(with_hooks(policy, scale_hook=failing))
    fill(monitor.queue, 31)
    assert monitor.tick().level is AlarmLevel.YELLOW
    [job_id] = rq_queues.actions.job_ids
    rq_queues.work()  # the first run and both retries (intervals 0 in these tests)

    failed = rq_queues.actions.failed_job_registry
    assert failed.get_job_ids() == [job_id]
    job = Job.fetch(job_id, connection=rq_queues.conn)
    assert job.retries_left == 0
    assert "exited 3: autoscaler said no" in (job.latest_result().exc_string or "")  # type: ignore[union-attr]
    assert actions(redis_client, monitor).count(("scale_out", "failed")) == 3

    fill(monitor.queue, 20)  # the monitor is unaffected: the next level still acts
    fake_clock.advance(1.0)
    assert monitor.tick().level is AlarmLevel.ORANGE
    rq_queues.work()
    assert actions(redis_client, monitor)[-2:] == [("degrade", "started"), ("degrade", "done")]


def test_a_command_hook_gets_the_figures_in_its_environment(
    make_monitor: MonitorFactory,
    redis_client: Redis,
    policy: Policy,
    rq_queues: RqQueues,
    fake_clock: FakeClock,
    tmp_path: Path,
) -> None:
    out = tmp_path / "scale.txt"
    code = (
        "import os, sys; e = os.environ; open(sys.argv[1], 'a').write("
        "' '.join([e['TIDEGATE_EVENT'], e['TIDEGATE_LEVEL'], e['TIDEGATE_QUEUE'], e['TIDEGATE_DESIRED_WORKERS']]) + '\\n')"
    )
    monitor = make_monitor(with_hooks(policy, scale_hook=python_hook(code, str(out))))
    ids = fill(monitor.queue, 40)
    desired = monitor.tick().desired_workers
    rq_queues.work()
    assert out.read_text().splitlines() == [f"scale_out yellow {monitor.queue_name} {desired}"]
    for ticket_id in ids:
        monitor.queue.cancel(ticket_id)
    settle(monitor, fake_clock, 7)
    rq_queues.work()
    assert out.read_text().splitlines()[-1].startswith(f"scale_in yellow {monitor.queue_name} ")


def test_an_http_notify_hook_is_posted_on_degrade(
    make_monitor: MonitorFactory,
    policy: Policy,
    rq_queues: RqQueues,
    fake_clock: FakeClock,
    hook_server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = hook_server
    monitor = make_monitor(with_hooks(policy, notify_hook=url))
    fill(monitor.queue, 55)
    monitor.tick()
    rq_queues.work()
    assert [(r["event"], r["level"], r["queue"]) for r in received] == [
        ("degrade", "orange", monitor.queue_name)
    ]


def test_a_late_job_whose_level_has_cleared_is_skipped(
    make_monitor: MonitorFactory, redis_client: Redis, rq_queues: RqQueues, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    ids = fill(monitor.queue, 31)
    monitor.tick()  # scale_out queued, but no rq worker is running yet
    for ticket_id in ids:
        monitor.queue.cancel(ticket_id)
    settle(monitor, fake_clock, 7)
    assert monitor.tick().level is AlarmLevel.GREEN
    rq_queues.work()
    events = [e for e in reversed(read_events(redis_client, monitor.keys, 100)) if e["kind"] == "action"]
    assert [(e["action"], e["state"], e["detail"]) for e in events] == [
        ("scale_out", "done", "skipped: the alarm is green now"),
        ("scale_out", "undone", "no scale_hook configured"),
    ]


def test_hook_errors_name_the_hook_and_the_reason(tmp_path: Path) -> None:
    payload = {"event": "scale_out"}
    with pytest.raises(HookFailed, match="no such program"):
        run_hook("scale_hook", str(tmp_path / "missing-program"), payload, 5)
    with pytest.raises(HookFailed, match=r"still running after 0\.2 s"):
        run_hook("scale_hook", python_hook("import time; time.sleep(5)"), payload, 0.2)
    with pytest.raises(HookFailed, match="request failed"):
        run_hook("notify_hook", "http://127.0.0.1:9/hook", payload, 1)
    assert run_hook("scale_hook", python_hook("pass"), payload, 5).endswith("exited 0")


def test_the_monitors_own_rq_worker_process_runs_the_actions(
    make_monitor: MonitorFactory,
    redis_client: Redis,
    rq_url: str,
    rq_queues: RqQueues,
    fake_clock: FakeClock,
) -> None:
    monitor = make_monitor()
    worker = start_worker_process(rq_url, [rq_queues.jobs.actions_queue])
    try:
        fill(monitor.queue, 31)
        monitor.tick()
        wait_until(
            lambda: ("scale_out", "done") in actions(redis_client, monitor),
            30,
            "the rq worker process to run the action",
            interval=0.1,
        )
    finally:
        stop_worker_process(worker)
    assert not worker.is_alive()
