"""Drain and arrival rates, live workers and the scale-out figure."""

from __future__ import annotations

import pytest
from redis import Redis

from ops.monitor.sampler import RateWindow, Sampler
from ops.monitor.scaling import ScalingConfig, desired_workers
from shared.queue import TicketQueue
from tests.fake_clock import FakeClock
from tests.monitor.support import fill


def test_rate_window_measures_growth_over_the_window() -> None:
    window = RateWindow(10.0)
    assert window.add(0.0, 0) == 0.0
    assert window.add(1.0, 5) == 5.0
    for t in range(2, 30):
        rate = window.add(float(t), 5 + 2 * (t - 1))
    assert rate == pytest.approx(2.0)  # the early burst of 5/s has left the 10 s window


def test_rate_window_starts_over_when_counters_are_reset() -> None:
    window = RateWindow(10.0)
    window.add(0.0, 100)
    window.add(1.0, 110)
    assert window.add(2.0, 3) == 0.0
    assert window.add(3.0, 5) == 2.0


def test_sampler_reads_depth_rates_and_live_workers(
    ticket_queue: TicketQueue, redis_client: Redis, fake_clock: FakeClock
) -> None:
    sampler = Sampler(ticket_queue, window_seconds=10.0)
    first = sampler.sample()
    assert (first.depth, first.drain_rate, first.arrival_rate, first.workers_alive) == (0, 0.0, 0.0, 0)
    ids = fill(ticket_queue, 20, "complaint")
    for ticket_id in ids[:6]:
        ticket_queue.cancel(ticket_id)
    for claimed in ticket_queue.claim("w1", 4):  # two answered, two ended unstarted (deadline)
        done = claimed.ticket.id in ids[6:8]
        ticket_queue.finish(claimed.ticket.id, claimed.token, "done" if done else "expired")
    keys = ticket_queue.keys
    redis_client.hset(
        keys.worker("alive"),
        mapping={
            "gpu": "1",
            "kv_usage": "0.7",
            "inflight": "3",
            "batch_limit": "8",
            "concurrency_limit": "6",
        },
    )
    redis_client.hset(keys.worker("dead"), mapping={"gpu": "0", "kv_usage": "0.99"})
    redis_client.zadd(keys.workers, {"alive": fake_clock.at + 30, "dead": fake_clock.at + 1})
    fake_clock.advance(2.0)
    second = sampler.sample()
    assert second.depth == 10
    assert second.drain_rate == pytest.approx(5.0)  # 6 cancelled, 2 done, 2 expired in 2 s
    assert second.service_rate == pytest.approx(1.0)  # only the 2 answered
    assert second.service_peak == pytest.approx(1.0)
    assert second.arrival_rate_by_type == pytest.approx(
        {"loan_approval": 0, "complaint": 10.0, "archive_query": 0}
    )
    fake_clock.advance(20.0)
    assert sampler.sample().service_peak == pytest.approx(1.0)  # the rate fell; the peak holds
    assert second.arrival_rate == pytest.approx(10.0)  # 20 admitted in 2 s
    assert [w.worker_id for w in second.workers] == ["alive"]
    assert second.kv_free_min == pytest.approx(0.3)
    assert second.free_slots == 3  # the throttle's 6 in force, 3 running; the dead worker's not counted


@pytest.mark.parametrize(
    ("depth", "drain", "arrival", "alive", "expected"),
    [
        (0, 0.0, 0.0, 0, 1),  # never below min_workers
        (60, 0.0, 0.0, 0, 4),  # 60/30 = 2/s needed, 0.5/s assumed per worker
        (60, 4.0, 1.0, 2, 2),  # 2 + 1 = 3/s needed, 2/s measured per worker
        (90, 2.0, 2.0, 2, 5),  # 3 + 2 = 5/s needed, 1/s per worker
        (100_000, 1.0, 0.0, 1, 64),  # capped at max_workers
    ],
)
def test_desired_workers(depth: int, drain: float, arrival: float, alive: int, expected: int) -> None:
    assert desired_workers(depth, drain, arrival, alive, ScalingConfig()) == expected


def test_scaling_config_names_bad_values() -> None:
    with pytest.raises(ValueError, match="target_drain_seconds must be > 0, got 0"):
        ScalingConfig(target_drain_seconds=0)
    with pytest.raises(ValueError, match="min 5, max 2"):
        ScalingConfig(min_workers=5, max_workers=2)
