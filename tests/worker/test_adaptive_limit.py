"""The adaptive limit wired into a worker: answers that slow down as the batch grows lower it, the
change is logged and shows in the registry, the worker's gauges and `tidegate status`; answers
that speed up again raise it back to `max_batch`."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from ops.lab.sim.process import SimulatorProcess
from producer.status import operator_status
from shared.queue import TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, submit_many, wait_all_done
from worker.telemetry import WorkerGauges

MAX_BATCH = 16


def one_at_a_time(fast_queue: TicketQueue, count: int) -> None:
    producer = producer_for(fast_queue)
    for _ in range(count):
        wait_all_done(fast_queue, submit_many(producer, 1, max_tokens=30), 20)


def gauge(running: RunningWorker) -> float | None:
    worker = running.worker
    families = WorkerGauges(worker.config.worker_id, worker.config.gpu, worker.gauges).collect()
    family = next(f for f in families if f.name == "tidegate_concurrency_limit")
    return family.samples[0].value if family.samples else None


def test_slower_tokens_in_a_fuller_batch_lower_the_limit_and_faster_ones_raise_it_again(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each running sequence slows every step by 3 ms at real time: a full batch of 16 makes tokens
    # several times slower than one ticket alone does.
    sim = simulator(time_scale=1, per_seq_slowdown=0.003, stop_median_tokens=10**6)
    running = start_worker(sim.base_url, max_batch=MAX_BATCH, critical_headroom=0, preemption=False)
    limits = running.worker.limits
    caplog.set_level(logging.INFO, logger="worker.inflight_limit")
    one_at_a_time(fast_queue, 6)  # the baseline: one ticket at a time
    assert limits.adaptive_limit == MAX_BATCH
    ids = submit_many(producer_for(fast_queue), 48, max_tokens=30)
    wait_until(
        lambda: (limits.adaptive_limit or MAX_BATCH) < MAX_BATCH, 60, "the limit to come down", interval=0.05
    )
    lowered = limits.adaptive_limit
    assert lowered is not None and limits.limit <= lowered
    registry_key = fast_queue.keys.worker(running.worker.config.worker_id)
    wait_until(
        lambda: int(fast_queue.redis.hget(registry_key, "concurrency_limit") or MAX_BATCH) < MAX_BATCH,
        5,
        "the lowered limit in the registry",
    )
    status = operator_status(fast_queue.redis, fast_queue.policy, fast_queue.keys.queue)
    assert (status["workers"][0]["concurrency_limit"] or MAX_BATCH) < MAX_BATCH
    assert (gauge(running) or MAX_BATCH) < MAX_BATCH
    changes = [r for r in caplog.records if getattr(r, "event", None) == "concurrency_limit"]
    assert changes, "every change of the limit is logged"
    wait_all_done(fast_queue, ids, 90)
    one_at_a_time(fast_queue, 30)
    wait_until(lambda: limits.adaptive_limit == MAX_BATCH, 20, "the limit back at max_batch")
    assert gauge(running) == MAX_BATCH


def test_switched_off_there_is_no_adaptive_limit(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    running = start_worker(simulator().base_url, max_batch=MAX_BATCH, adaptive_limit=False)
    assert running.worker.limits.adaptive is None and running.worker.limits.engine_adaptive is None
    assert running.worker.limits.limit == running.worker.sizer.limit
    assert gauge(running) is None


def test_loans_running_past_their_share_of_the_slo_lower_the_limit(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each running sequence slows every step by 3 ms at real time: sixteen 40-token loans side by
    # side run about 2 s each, past half of their 2 s SLO.
    sim = simulator(time_scale=1, per_seq_slowdown=0.003, stop_median_tokens=10**6)
    running = start_worker(sim.base_url, max_batch=MAX_BATCH, preemption=False)
    limits = running.worker.limits
    assert limits.pressure is not None and limits.adaptive_limit == MAX_BATCH
    caplog.set_level(logging.INFO, logger="worker.inflight_limit")
    ids = submit_many(producer_for(fast_queue), MAX_BATCH, type="loan_approval", max_tokens=40)
    wait_all_done(fast_queue, ids, 60)
    wait_until(lambda: (limits.adaptive_limit or MAX_BATCH) < MAX_BATCH, 10, "the limit to come down")
    judged = [r for r in caplog.records if getattr(r, "source", None) == "critical answers"]
    assert judged and judged[-1].critical_pressure > 1  # type: ignore[attr-defined]
    assert judged[-1].concurrency_limit == limits.adaptive_limit  # type: ignore[attr-defined]


def test_switched_off_critical_answers_do_not_judge_the_limit(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
) -> None:
    running = start_worker(simulator().base_url, max_batch=MAX_BATCH, adaptive_slo=False)
    assert running.worker.limits.pressure is None and running.worker.limits.adaptive is not None
