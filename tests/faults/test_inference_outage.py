"""An inference outage (the simulator killed, then restarted on its port) with the breaker on: no
ticket ends `failed` for it; queued tickets whose TTL passed end `expired`; new tickets are refused
with `circuit_open` while the circuit is open; the rest finish after recovery."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from producer.producer import Producer
from shared import clock
from shared.models import TicketRequest, TicketStatus
from shared.policy import BreakerLevelPolicy, BreakerPolicy, InstantPolicy, Policy
from shared.queue import TicketQueue
from shared.shed import ShedCode
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from worker.config import WorkerConfig
from worker.deadlines import DEADLINE_PASSED
from worker.worker import Worker

SUBMIT_INTERVAL_SECONDS = 0.1
SHORT_TTL_SECONDS = 3.0
HELD_SHORT_LIVED = 4


def _short_lived(i: int) -> TicketRequest:
    body = {"type": "complaint", "branch_id": "b1", "prompt": f"held {i}", "max_tokens": 8}
    return TicketRequest.model_validate({**body, "ttl_seconds": SHORT_TTL_SECONDS})


def _outage_policy(fast_policy: Policy) -> Policy:
    breaker = BreakerPolicy(
        min_requests=3,
        instant=InstantPolicy(window_seconds=1, error_rate=0.3, open_seconds=2),
        sustained=BreakerLevelPolicy(window_seconds=5, error_rate=0.2),
        deep=BreakerLevelPolicy(window_seconds=10, error_rate=0.15),
    )
    return fast_policy.model_copy(update={"breaker": breaker})


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    process = SimulatorProcess(time_scale=50).start()
    yield process
    process.stop()


def _traffic(producer: Producer, stop: threading.Event, out: list[tuple[str, Any]]) -> None:
    """A steady trickle of complaints, every fourth with a TTL short enough to pass in the outage."""
    i = 0
    while not stop.is_set():
        body: dict[str, Any] = {
            "type": "complaint",
            "branch_id": "b1",
            "prompt": f"card {i} " * 8,
            "max_tokens": 8,
        }
        if i % 4 == 0:
            body["ttl_seconds"] = SHORT_TTL_SECONDS
        result = producer.submit(body)
        out.append((result.ticket_id, result))
        i += 1
        stop.wait(SUBMIT_INTERVAL_SECONDS)


def _outage(
    outage_seconds: float, sim: SimulatorProcess, redis_client: Redis, fast_policy: Policy, queue_name: str
) -> None:
    policy = _outage_policy(fast_policy)
    config = WorkerConfig(
        gpu=0,
        vllm_url=sim.base_url,
        worker_id=f"outage-{queue_name}",
        queue_name=queue_name,
        lease_seconds=policy.queue.lease_seconds,
        grace_seconds=5.0,
        heartbeat_seconds=0.5,
        resize_seconds=0.5,
        block_seconds=0.5,
    )
    worker = RunningWorker(Worker(config, redis_client, policy))
    worker.thread.start()
    producer = Producer(redis_client, policy, queue_name, admission_cache_seconds=0)
    queue = TicketQueue(redis_client, policy, queue_name)
    submitted: list[tuple[str, Any]] = []
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(producer, stop, submitted), daemon=True)
    traffic.start()
    wait_until(lambda: queue.stats().outcome_count("complaint", "done") >= 3, 30, "traffic flowing")
    assert sim.pid is not None
    port = sim.port
    os.kill(sim.pid, signal.SIGKILL)  # an engine crash: connections refused from now on
    # Tickets admitted just before the circuit could open, short-lived enough to expire in the outage.
    waiting = [queue.enqueue(_short_lived(i)).ticket_id for i in range(HELD_SHORT_LIVED)]
    time.sleep(outage_seconds)  # the outage itself: the engine stays down this long
    restarted = SimulatorProcess(port=port, time_scale=50).start()
    recovered_at = clock.now()

    def answered_after_recovery() -> bool:
        after = [tid for tid, result in list(submitted) if result.outcome != "rejected"][-20:]
        return any(
            t is not None and t.status is TicketStatus.DONE and t.created_at > recovered_at
            for t in queue.get_many(after)
        )

    try:
        wait_until(
            answered_after_recovery, policy.breaker.instant.open_seconds + 30, "a probe to close the circuit"
        )
        stop.set()
        traffic.join(10)
        accepted = waiting + [tid for tid, result in submitted if result.outcome != "rejected"]
        refused = [result for _, result in submitted if result.outcome == "rejected"]
        tickets = wait_until(
            lambda: (ts := queue.get_many(accepted)) and all(t and t.status.terminal for t in ts) and ts,
            outage_seconds + 60,
            "every accepted ticket to end",
            interval=0.2,
        )
        statuses = {t.status for t in tickets if t}
        assert TicketStatus.FAILED not in statuses, [
            t.error for t in tickets if t and t.status is TicketStatus.FAILED
        ]
        assert statuses <= {TicketStatus.DONE, TicketStatus.EXPIRED}
        expired = [t for t in tickets if t and t.status is TicketStatus.EXPIRED]
        # Expired in the outage: its TTL passed, or its deadline (the type's SLO) did before it could start.
        assert all(
            t.ttl_seconds == SHORT_TTL_SECONDS or (t.error or "").startswith(DEADLINE_PASSED) for t in expired
        ), [(t.ttl_seconds, t.error) for t in expired]
        assert {t.id for t in expired} >= set(waiting)
        assert refused and {r.code for r in refused} == {ShedCode.CIRCUIT_OPEN}
        done_after = [
            t for t in tickets if t and t.status is TicketStatus.DONE and t.created_at > recovered_at
        ]
        assert done_after, "tickets submitted after recovery finish"
    finally:
        worker.stop()
        restarted.stop()


def test_a_short_outage_fails_no_ticket(
    sim: SimulatorProcess, redis_client: Redis, fast_policy: Policy, queue_name: str
) -> None:
    _outage(8.0, sim, redis_client, fast_policy, queue_name)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_an_outage_outlasting_every_breaker_window_fails_no_ticket(
    sim: SimulatorProcess, redis_client: Redis, fast_policy: Policy, queue_name: str
) -> None:
    """Twice the longest window (deep, 10 s): every rung's window is all outage, and clears in it.
    Longer adds no state (a complaint's TTL, 120 s, outlasts both) but only minutes of CI."""
    _outage(
        2.5 * _outage_policy(fast_policy).breaker.deep.window_seconds,
        sim,
        redis_client,
        fast_policy,
        queue_name,
    )
