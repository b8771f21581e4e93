"""The monitor on a real Redis queue with no workers: filling, draining, oscillating."""

from __future__ import annotations

import threading

from redis import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ops.monitor.loop import Monitor, MonitorConfig, TickResult
from shared.control import STALE_AFTER_SECONDS, read_control_state, read_events
from shared.policy import AlarmLevel, Policy
from tests.fake_clock import FakeClock
from tests.monitor.conftest import MonitorFactory
from tests.monitor.support import fill


def alarm_events(redis_client: Redis, monitor: Monitor) -> list[tuple[str, str, int]]:
    events = reversed(read_events(redis_client, monitor.keys, 1000))
    return [(e["from"], e["to"], int(e["depth"])) for e in events if e["kind"] == "alarm"]


def drain_to(monitor: Monitor, ids: list[str], depth: int) -> None:
    while len(ids) > depth:
        assert monitor.queue.cancel(ids.pop()) == "queued"


def test_filling_walks_up_at_31_51_81_and_draining_walks_back_with_hysteresis(
    make_monitor: MonitorFactory, redis_client: Redis, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    levels: dict[int, AlarmLevel] = {}
    ids: list[str] = []
    for depth in range(1, 91):
        ids += fill(monitor.queue, 1)
        result = monitor.tick()
        assert result.acting and result.error is None
        levels[depth] = result.level  # type: ignore[assignment]
    first = {lvl: min(d for d, seen in levels.items() if seen is lvl) for lvl in AlarmLevel if lvl}
    assert first == {AlarmLevel.YELLOW: 31, AlarmLevel.ORANGE: 51, AlarmLevel.RED: 81}
    assert alarm_events(redis_client, monitor) == [
        ("green", "yellow", 31),
        ("yellow", "orange", 51),
        ("orange", "red", 81),
    ]

    # Down to 76: not below red's clear line (75), so red holds however long it stays there.
    drain_to(monitor, ids, 76)
    for _ in range(10):
        fake_clock.advance(1.0)
        assert monitor.tick().level is AlarmLevel.RED
    # Below 75: red clears only after 5 s without a break, one level at a time.
    drain_to(monitor, ids, 70)
    seen = []
    for _ in range(7):
        seen.append(monitor.tick().level)
        fake_clock.advance(1.0)
    assert seen == [AlarmLevel.RED] * 5 + [AlarmLevel.ORANGE] * 2
    drain_to(monitor, ids, 0)
    for _ in range(20):
        fake_clock.advance(1.0)
        monitor.tick()
    assert monitor.tick().level is AlarmLevel.GREEN
    assert alarm_events(redis_client, monitor)[3:] == [
        ("red", "orange", 70),
        ("orange", "yellow", 0),
        ("yellow", "green", 0),
    ]


def test_depth_oscillating_around_a_threshold_does_not_flap(
    make_monitor: MonitorFactory, redis_client: Redis, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    ids = fill(monitor.queue, 49)
    monitor.tick()
    for _ in range(30):  # 49 <-> 52 around orange (50), sampled every second
        ids += fill(monitor.queue, 3)
        fake_clock.advance(1.0)
        monitor.tick()
        drain_to(monitor, ids, 49)
        fake_clock.advance(1.0)
        monitor.tick()
    assert alarm_events(redis_client, monitor) == [("green", "yellow", 49), ("yellow", "orange", 52)]
    assert monitor.tick().level is AlarmLevel.ORANGE


def test_with_the_shipped_policy_a_batch_claims_swing_walks_up_holds_and_comes_down_once(
    make_monitor: MonitorFactory, redis_client: Redis, fake_clock: FakeClock, policy: Policy
) -> None:
    """Arrivals refill the queue to 100 and a claim empties it, every half second, for 45 s."""
    monitor = make_monitor(policy, shipped_alarms=True)
    for _ in range(90):
        ids = fill(monitor.queue, 100)
        monitor.tick()
        fake_clock.advance(0.25)
        drain_to(monitor, ids, 0)
        monitor.tick()
        fake_clock.advance(0.25)
    for _ in range(80):  # the surge is over
        monitor.tick()
        fake_clock.advance(0.5)
    events = [(old, new) for old, new, _depth in alarm_events(redis_client, monitor)]
    ups = [e for e in events if AlarmLevel.parse(e[1]) > AlarmLevel.parse(e[0])]
    assert events[: len(ups)] == ups, events  # up, hold, then down: no cycling
    assert sum(new == "red" for _old, new in events) <= 1 and sum(old == "red" for old, _new in events) <= 1
    assert monitor.tick().level is AlarmLevel.GREEN


def test_level_is_published_every_sample_for_admission(
    make_monitor: MonitorFactory, redis_client: Redis, policy: Policy, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    fill(monitor.queue, 55)
    monitor.tick()
    state, _ = read_control_state(redis_client, monitor.keys, policy.alarms)
    assert (state.level, state.depth, state.level_is_published) == (AlarmLevel.ORANGE, 55, True)
    first_update = redis_client.hget(monitor.keys.alarm, "updated_at")
    fake_clock.advance(1.0)
    monitor.tick()
    assert redis_client.hget(monitor.keys.alarm, "updated_at") != first_update
    assert redis_client.hget(monitor.keys.alarm, "since") == repr(fake_clock.at - 1.0)
    figures = redis_client.hgetall(monitor.keys.monitor_state)
    assert figures["acting_monitor"] == monitor.monitor_id
    assert int(figures["desired_workers"]) >= 1 and figures["kv_free_min"] == ""


def test_expired_tickets_leave_the_depth_even_without_workers(
    make_monitor: MonitorFactory, redis_client: Redis, fake_clock: FakeClock
) -> None:
    monitor = make_monitor(interval_seconds=0.01)  # the sweep runs at most once per interval
    fill(monitor.queue, 35, "loan_approval")  # 30 s TTL
    assert monitor.tick().level is AlarmLevel.YELLOW
    fake_clock.advance(31.0)
    redis_client.delete(monitor.queue.keys.reaper_lock)  # the last sweep's lock lapses in real time
    result = monitor.tick()
    assert result.sample is not None and result.sample.depth == 0
    assert result.sample.stats.outcome_count("loan_approval", "expired") == 35


def test_an_unreachable_redis_is_reported_and_the_loop_keeps_sampling(policy: Policy) -> None:
    dead = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.1, retry=Retry(NoBackoff(), 0))
    monitor = Monitor(dead, dead, policy, "nowhere", MonitorConfig(interval_seconds=0.05))
    results: list[TickResult] = []
    stop = threading.Event()

    def record(result: TickResult) -> None:
        results.append(result)
        if len(results) == 3:
            stop.set()

    runner = threading.Thread(target=monitor.run, args=(stop, record))
    runner.start()
    runner.join(10)
    assert not runner.is_alive()
    assert len(results) == 3 and all((r.error or "").startswith("Redis error") for r in results)


def test_level_since_stays_put_while_nothing_changes(
    make_monitor: MonitorFactory, redis_client: Redis, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    first = fake_clock.at
    for _ in range(3):
        assert monitor.tick().level is AlarmLevel.GREEN
        fake_clock.advance(1.5)
    state, _ = read_control_state(redis_client, monitor.keys, monitor.policy.alarms)
    assert state.level_since == first
    # A monitor taking over carries the published moment on.
    successor = make_monitor()
    monitor.leadership.release()
    fake_clock.advance(1.5)
    assert successor.tick().acting
    state, _ = read_control_state(redis_client, monitor.keys, monitor.policy.alarms)
    assert state.level_since == first


def test_a_level_derived_from_depth_has_no_since(
    make_monitor: MonitorFactory, redis_client: Redis, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    assert monitor.tick().acting
    fake_clock.advance(STALE_AFTER_SECONDS + 1)  # the monitor has died: its level is not trusted
    state, _ = read_control_state(redis_client, monitor.keys, monitor.policy.alarms)
    assert not state.level_is_published and state.level_since is None
