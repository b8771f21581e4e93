"""Several monitors: exactly one acts; when it dies another takes over within the lock's expiry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from ops.monitor.leader import acting_monitor
from shared.control import read_events
from shared.keys import QueueKeys
from shared.policy import AlarmLevel
from tests.monitor.conftest import MonitorFactory
from tests.monitor.support import fill
from tests.waiting import wait_until, waited


def alarm_count(redis_client: Redis, keys: QueueKeys) -> int:
    return sum(e["kind"] == "alarm" for e in read_events(redis_client, keys, 1000))


def test_only_one_of_two_monitors_acts_and_the_other_takes_over(
    make_monitor: MonitorFactory, redis_client: Redis
) -> None:
    first = make_monitor(lock_ttl_seconds=0.6, monitor_id="monitor-a")
    second = make_monitor(lock_ttl_seconds=0.6, monitor_id="monitor-b")
    fill(first.queue, 35)
    a, b = first.tick(), second.tick()
    assert (a.acting, b.acting) == (True, False)
    assert b.level is AlarmLevel.YELLOW  # the standby reads what the acting one published
    for _ in range(3):
        first.tick()
        second.tick()
    assert alarm_count(redis_client, first.keys) == 1
    assert acting_monitor(redis_client, first.keys) == "monitor-a"

    # monitor-a dies (stops renewing without releasing); monitor-b acts within the lock's expiry.
    waited(lambda: second.tick().acting, 0.6 + 0.3, "the standby to take over within the lock expiry")
    assert acting_monitor(redis_client, first.keys) == "monitor-b"
    fill(first.queue, 20)
    assert second.tick().level is AlarmLevel.ORANGE
    assert alarm_count(redis_client, first.keys) == 2  # yellow was taken over, not raised again

    # monitor-a comes back: it finds the lock taken and stands by.
    assert first.tick().acting is False
    assert alarm_count(redis_client, first.keys) == 2


def test_a_monitor_that_lost_the_lock_mid_sample_publishes_nothing(
    make_monitor: MonitorFactory, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = make_monitor(monitor_id="monitor-stale")
    assert stale.tick().acting
    redis_client.set(stale.keys.monitor_lock, "monitor-new", px=5000)  # taken over meanwhile
    monkeypatch.setattr(stale.leadership, "refresh", lambda: True)  # it still believes it acts
    fill(stale.queue, 60)
    result = stale.tick()
    assert result.acting is False and result.error == "lost the lock before publishing"
    assert alarm_count(redis_client, stale.keys) == 0
    assert redis_client.hget(stale.keys.alarm, "level") == "green"


def test_a_clean_shutdown_hands_over_at_once(make_monitor: MonitorFactory, redis_client: Redis) -> None:
    first = make_monitor(lock_ttl_seconds=30, monitor_id="monitor-a")
    second = make_monitor(lock_ttl_seconds=30, monitor_id="monitor-b")
    assert first.tick().acting and not second.tick().acting
    first.close()
    assert second.tick().acting


# ---- real processes ------------------------------------------------------------------------------------
SpawnMonitor = Callable[[], tuple[subprocess.Popen[bytes], Path]]


@pytest.fixture
def spawn_monitor(redis_url: str, queue_name: str, tmp_path: Path) -> Iterator[SpawnMonitor]:
    """Starts `tidegate monitor` processes; each returns with the file its log goes to."""
    env = {**os.environ, "TIDEGATE_REDIS_URL": redis_url, "TIDEGATE_QUEUE_NAME": queue_name}
    started: list[subprocess.Popen[bytes]] = []

    def spawn() -> tuple[subprocess.Popen[bytes], Path]:
        args = ["monitor", "--interval", "0.2", "--lock-ttl", "1.5", "--metrics-port", "0"]
        log_path = tmp_path / f"monitor-{len(started)}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-c", "from tidegate.cli import main; main()", *args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )
        started.append(process)
        return process, log_path

    yield spawn
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_killing_the_acting_process_hands_over_within_the_lock_expiry(
    spawn_monitor: SpawnMonitor, redis_client: Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    logs = dict(spawn_monitor() for _ in range(2))
    wait_until(lambda: acting_monitor(redis_client, keys) is not None, 30, "a monitor to act")
    holder = acting_monitor(redis_client, keys)
    assert holder is not None
    pid = int(holder.split(":")[1])
    by_pid = {p.pid: p for p in logs}
    assert pid in by_pid
    standby = next(p for p in logs if p.pid != pid)
    # Both are up: the standby has logged that it watches the queue, which it does right before its
    # sampling thread starts bidding for the lock every interval.
    wait_until(lambda: "watching queue" in logs[standby].read_text(), 30, "the standby to contend")
    wait_until(lambda: redis_client.hget(keys.alarm, "updated_at") is not None, 10, "a first sample")

    by_pid[pid].send_signal(signal.SIGKILL)
    by_pid[pid].wait(10)
    took = waited(
        lambda: str(standby.pid) in (acting_monitor(redis_client, keys) or "").split(":"), 10, "the takeover"
    )
    assert took <= 1.5 + 0.5, f"takeover took {took:.2f} s"

    standby.send_signal(signal.SIGTERM)  # a clean stop releases the lock at once
    assert standby.wait(10) == 0
    assert acting_monitor(redis_client, keys) is None
