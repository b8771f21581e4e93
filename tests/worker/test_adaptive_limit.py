"""The adaptive throttle wired into a worker: loans that run past their share of the SLO in a full
batch lower it; the change is logged and shows in the registry, the worker's gauges and `tidegate
status`, with the claim plan's bound."""

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


def gauge(running: RunningWorker) -> float | None:
    worker = running.worker
    families = WorkerGauges(worker.config.worker_id, worker.config.gpu, worker.gauges).collect()
    family = next(f for f in families if f.name == "tidegate_concurrency_limit")
    return family.samples[0].value if family.samples else None


def test_loans_running_past_their_share_of_the_slo_lower_the_throttle(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each running sequence slows every step by 3 ms at real time: sixteen 40-token loans side by
    # side run about 2 s each, past their share of the 2 s SLO.
    sim = simulator(time_scale=1, per_seq_slowdown=0.003, stop_median_tokens=10**6)
    running = start_worker(sim.base_url, max_batch=MAX_BATCH, preemption=False)
    throttle = running.worker.throttle
    assert throttle is not None and throttle.ceiling(MAX_BATCH) is None, "not in force before any loan"
    assert gauge(running) is None
    caplog.set_level(logging.INFO, logger="worker.throttle")
    ids = submit_many(producer_for(fast_queue), MAX_BATCH, type="loan_approval", max_tokens=40)
    wait_all_done(fast_queue, ids, 60)
    wait_until(
        lambda: (throttle.ceiling(MAX_BATCH) or MAX_BATCH) < MAX_BATCH, 10, "the throttle to come down"
    )
    assert throttle.pressure is not None and throttle.pressure > 1
    judged = [r for r in caplog.records if getattr(r, "event", None) == "concurrency_limit"]
    assert judged and judged[-1].critical_pressure > 1  # type: ignore[attr-defined]
    registry_key = fast_queue.keys.worker(running.worker.config.worker_id)
    wait_until(
        lambda: int(fast_queue.redis.hget(registry_key, "concurrency_limit") or MAX_BATCH) < MAX_BATCH,
        5,
        "the lowered limit in the registry",
    )
    status = operator_status(fast_queue.redis, fast_queue.policy, fast_queue.keys.queue)
    assert (status["workers"][0]["concurrency_limit"] or MAX_BATCH) < MAX_BATCH
    assert status["workers"][0]["bound"] in {"adaptive", "max_batch", "kv", "memory", "critical_reserve"}
    assert (gauge(running) or MAX_BATCH) < MAX_BATCH
