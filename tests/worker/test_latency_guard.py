"""The latency guard: a batch cap that keeps critical answers within their SLO while degraded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from ops.lab.sim.process import SimulatorProcess
from producer.producer import Producer
from shared import clock
from shared.policy import load_policy
from shared.queue import TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, submit_many
from worker.headroom import CriticalHeadroom
from worker.latency_guard import MIN_ANSWERS, LatencyGuard


def answers(guard: LatencyGuard, seconds: float, count: int = MIN_ANSWERS, *, critical: bool = True) -> None:
    for _ in range(count):
        guard.observe(run_seconds=seconds, critical=critical)


def degraded_guard() -> LatencyGuard:
    guard = LatencyGuard(slo_seconds=2.0, max_batch=32)
    guard.set_active(True)
    return guard


def test_slow_critical_answers_lower_the_cap_by_a_quarter_down_to_the_floor() -> None:
    guard = degraded_guard()
    assert guard.target_seconds == 1.0  # half of the 2 s SLO
    caps = []
    for _ in range(6):
        answers(guard, 1.6)
        caps.append(guard.update(current_limit=28))
    assert caps == [21, 15, 11, 8, 8, 8]  # 28 × 0.75 each round; the floor is max_batch / 4


def test_a_shrink_is_judged_by_answers_that_ran_under_the_new_cap() -> None:
    guard = degraded_guard()
    answers(guard, 1.6)
    assert guard.update(current_limit=28) == 21
    answers(guard, 1.6, MIN_ANSWERS - 1)  # still slow, but too few since the shrink to judge
    assert guard.update(current_limit=21) == 21
    assert guard.run_p90_seconds() is None


def test_fast_answers_raise_the_cap_by_one_and_lift_it_at_max_batch() -> None:
    guard = degraded_guard()
    answers(guard, 1.6)
    assert guard.update(current_limit=32) == 24
    answers(guard, 0.5, 32)
    assert guard.update(current_limit=24) == 25
    for expected in range(26, 32):
        answers(guard, 0.5, 1)
        assert guard.update(current_limit=32) == expected
    answers(guard, 0.5, 1)
    assert guard.update(current_limit=32) is None  # reaching max_batch lifts the cap


def test_answers_between_the_grow_and_shrink_marks_hold_the_cap() -> None:
    guard = degraded_guard()
    answers(guard, 1.6)
    assert guard.update(current_limit=20) == 15
    answers(guard, 0.9, 32)  # under the 1 s target, above 0.8 s
    assert guard.update(current_limit=15) == 15


def test_the_90th_percentile_decides_not_the_mean() -> None:
    guard = degraded_guard()
    answers(guard, 0.3, 27)
    answers(guard, 3.0, 5)  # 5 of 32 slow: the mean is 0.72 s, the 90th percentile 3 s
    assert guard.run_p90_seconds() == 3.0
    assert guard.update(current_limit=32) == 24


def test_only_critical_answers_count() -> None:
    guard = degraded_guard()
    answers(guard, 5.0, 50, critical=False)
    assert guard.run_p90_seconds() is None
    assert guard.update(current_limit=32) is None


def test_normal_service_never_caps_and_leaving_degraded_lifts_the_cap() -> None:
    guard = LatencyGuard(slo_seconds=2.0, max_batch=32)
    answers(guard, 1.6)
    assert guard.update(current_limit=32) is None  # not degraded: throughput first
    guard.set_active(True)
    answers(guard, 1.6)
    assert guard.update(current_limit=32) == 24
    guard.set_active(False)
    assert guard.cap is None
    answers(guard, 1.6)
    assert guard.update(current_limit=32) is None


def test_no_fresh_answer_leaves_the_cap_alone() -> None:
    guard = degraded_guard()
    answers(guard, 1.6)
    assert guard.update(current_limit=32) == 24
    assert guard.update(current_limit=24) == 24  # nothing finished since: no evidence either way


def test_without_critical_types_there_is_nothing_to_guard() -> None:
    guard = LatencyGuard(slo_seconds=None, max_batch=32)
    guard.set_active(True)
    answers(guard, 9.0)
    assert guard.update(current_limit=32) is None


@pytest.mark.parametrize(("slo", "share", "field"), [(0.0, 0.5, "slo_seconds"), (2.0, 0.0, "run_share")])
def test_bad_settings_name_the_field(slo: float, share: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LatencyGuard(slo_seconds=slo, max_batch=32, run_share=share)


def test_the_first_cut_is_taken_from_the_normal_share_the_headroom_leaves() -> None:
    guard = LatencyGuard(slo_seconds=2.0, max_batch=32, headroom=CriticalHeadroom(share=0.2))
    guard.set_active(True)
    answers(guard, 1.6)
    assert guard.update(current_limit=30) == 18  # normal share 30 − 6 kept for loans = 24, × 0.75


def test_the_cap_bounds_the_normal_share_and_leaves_critical_tickets_the_whole_batch() -> None:
    headroom = CriticalHeadroom(share=0.2)
    shares = headroom.split(limit=20, running=6, budget=0, usable_kv_tokens=None, normal_cap=10)
    assert (shares.count, shares.normal_count) == (14, 4)  # normal share 16, capped at 10
    wide = headroom.split(limit=20, running=6, budget=0, usable_kv_tokens=None, normal_cap=30)
    assert (wide.count, wide.normal_count) == (14, 10)  # a cap above the share changes nothing
    uncapped = headroom.split(limit=20, running=6, budget=0, usable_kv_tokens=None)
    assert uncapped == wide


def test_the_default_policy_guards_the_loan_slo() -> None:
    policy = load_policy()
    assert policy.critical_slo_seconds == 2.0
    assert policy.is_critical("loan_approval") and not policy.is_critical("complaint")
    assert not policy.is_critical("no_such_type")


def patient_complaints(queue: TicketQueue) -> Producer:
    """A producer whose complaints have an SLO of ten minutes (so a deadline as far)."""
    types = dict(queue.policy.types)
    types["complaint"] = types["complaint"].model_copy(update={"slo_seconds": 600})
    policy = queue.policy.model_copy(update={"types": types})
    return Producer(queue.redis, policy, queue.keys.queue, admission_cache_seconds=0)


def test_a_degraded_worker_caps_other_work_while_loans_run_slow_and_lifts_it_after(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    """End to end: answers reach the guard, its cap bounds the claims of other types (never of
    loans), and the end of degraded service lifts it.

    3 ms per running sequence per step at real time: a loan of 100 tokens runs 1.6 s even in a
    batch of 4, well over the 1 s share of its 2 s SLO.
    """
    sim = simulator(time_scale=1, per_seq_slowdown=0.003)
    alarm_key = fast_queue.keys.alarm
    degraded = threading.Event()
    degraded.set()
    stop = threading.Event()

    def monitor() -> None:
        # What the monitor publishes: the alarm level (orange while degraded), kept fresh.
        while not stop.is_set():
            level = "orange" if degraded.is_set() else "green"
            now = clock.now()
            fast_queue.redis.hset(
                alarm_key, mapping={"level": level, "since": now, "depth": 0, "updated_at": now}
            )
            stop.wait(0.2)

    publisher = threading.Thread(target=monitor, daemon=True)
    publisher.start()
    try:
        # The guard alone: the adaptive limit would also shrink the batch as the steps slow down.
        running = start_worker(sim.base_url, max_batch=16, slo_guard=True, adaptive_limit=False)
        worker = running.worker
        guard = worker.latency_guard
        assert guard is not None
        producer = producer_for(fast_queue)
        # Loans first (they pop first anyway), then short complaints that queue behind them, for
        # longer than their SLO: submitted with a far one, so no worker ends them unstarted.
        submit_many(producer, 64, type="loan_approval", max_tokens=100)
        submit_many(patient_complaints(fast_queue), 80, max_tokens=30)
        # Uncapped, the normal share is 12 of 16 (the headroom keeps 4); the cap must go well below.
        wait_until(lambda: (guard.cap or 16) <= 8, 60, "the guard to cap the normal share", interval=0.1)

        def in_flight(critical: bool) -> int:
            return sum(
                fast_queue.policy.is_critical(r.ticket.type) == critical for r in worker.inflight.snapshot()
            )

        # Once the loans are done, complaints (claimed before the cap may stay until they end) are
        # claimed only up to the cap; no critical answer ends meanwhile, so the cap stands still.
        wait_until(lambda: in_flight(True) == 0 and in_flight(False) > 0, 60, "only complaints running")
        cap = guard.cap
        assert cap is not None and guard.floor <= cap <= 8
        wait_until(lambda: in_flight(False) == cap, 20, f"complaints filling the cap of {cap}, no more")
        for _ in range(10):
            assert in_flight(False) <= cap
            time.sleep(0.1)
        registry_key = fast_queue.keys.worker(worker.config.worker_id)
        wait_until(
            lambda: fast_queue.redis.hget(registry_key, "normal_cap") == str(cap),
            5,
            "the cap in the registry",
        )
        # Loans are not bound by the cap: more of them than the cap run at once.
        submit_many(producer, cap + 2, type="loan_approval", max_tokens=100)
        wait_until(lambda: in_flight(True) == cap + 2, 20, f"{cap + 2} loans running, over the cap")
        degraded.clear()
        wait_until(lambda: guard.cap is None, 10, "back at normal service, the cap lifted")
        wait_until(
            lambda: not fast_queue.redis.hexists(registry_key, "normal_cap"),
            5,
            "the cap gone from the registry",
        )
    finally:
        stop.set()
        publisher.join(5)
        fast_queue.redis.delete(alarm_key)


def test_the_guard_is_off_unless_asked_for(
    simulator: Callable[..., SimulatorProcess], start_worker: Callable[..., RunningWorker]
) -> None:
    sim = simulator()
    assert start_worker(sim.base_url).worker.latency_guard is None
