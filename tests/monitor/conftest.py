"""Monitor fixtures: a controllable clock, rq queues of the test's own, a monitor factory.

rq keys live outside the queue's hash tag, so the rq queue names, job ids and worker names used
here all contain the test's unique queue name, and cleanup deletes only keys containing it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import HTTPServer
from typing import Any

import pytest
from redis import Redis

from ops.monitor.dispatch import JobOptions
from ops.monitor.loop import Monitor, MonitorConfig
from shared import clock
from shared.policy import Policy
from tests.fake_clock import FakeClock
from tests.monitor.support import Recorder, RqQueues


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return FakeClock(clock.now()).install(monkeypatch)


@pytest.fixture
def rq_conn(rq_url: str) -> Iterator[Redis]:
    conn = Redis.from_url(rq_url, socket_connect_timeout=2, socket_timeout=10)
    yield conn
    conn.close()


@pytest.fixture
def rq_queues(rq_conn: Redis, queue_name: str) -> Iterator[RqQueues]:
    jobs = JobOptions(
        action_retry_intervals=(0, 0),
        callback_retry_intervals=(0,),
        actions_queue=f"actions-{queue_name}",
        callbacks_queue=f"callbacks-{queue_name}",
    )
    yield RqQueues(jobs, rq_conn, queue_name)
    leftovers = list(rq_conn.scan_iter(match=f"rq:*{queue_name}*", count=1000))
    if leftovers:
        rq_conn.delete(*leftovers)
    for member in (f"rq:queue:{jobs.actions_queue}", f"rq:queue:{jobs.callbacks_queue}"):
        rq_conn.srem("rq:queues", member)


MonitorFactory = Callable[..., Monitor]


def instant_alarms(policy: Policy) -> Policy:
    """The policy with alarms that follow each sample (no averaging window, no dwell): what monitors
    made here get unless `shipped_alarms`, as their tests check thresholds, holds and actions to the
    sample. The window and the dwell are checked in test_hysteresis.py, and with the alarms as
    shipped in test_alarm_walk.py."""
    alarms = policy.alarms.model_copy(update={"window_seconds": 0, "min_dwell_seconds": 0})
    return policy.model_copy(update={"alarms": alarms})


@pytest.fixture
def make_monitor(
    redis_client: Redis, rq_conn: Redis, policy: Policy, queue_name: str, rq_queues: RqQueues
) -> Iterator[MonitorFactory]:
    made: list[Monitor] = []

    def make(
        policy_override: Policy | None = None,
        monitor_id: str | None = None,
        *,
        shipped_alarms: bool = False,
        **config: object,
    ) -> Monitor:
        base = MonitorConfig(rate_window_seconds=10.0, jobs=rq_queues.jobs)
        chosen = replace(base, **config)
        chosen_policy = policy_override or policy
        if not shipped_alarms:
            chosen_policy = instant_alarms(chosen_policy)
        monitor = Monitor(redis_client, rq_conn, chosen_policy, queue_name, chosen, monitor_id)
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.close()


@pytest.fixture
def hook_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    handler = type("Handler", (Recorder,), {"received": received})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()
    server.server_close()
