"""A worker serving `--queue a --queue b` keeps each queue's endpoint health its own: an endpoint
failing b's tickets opens b's breaker (in b's keys), a's stays closed and a's tickets are still
claimed and answered while b's wait."""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable

import requests
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.breaker import Phase, endpoint_id
from shared.breaker_store import BreakerStore
from shared.control import read_events
from shared.policy import BreakerPolicy, Policy
from shared.queue import TicketQueue
from shared.shed import ShedCode
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, submit_many, wait_all_done
from worker.config import WorkerConfig
from worker.worker import Worker

BREAKER = """
[breaker]
min_requests = 5
instant = { window_seconds = 1, error_rate = 0.30, open_seconds = 60 }
sustained = { window_seconds = 4, error_rate = 0.50 }
deep = { window_seconds = 6, error_rate = 0.15 }
"""


def _faults(sim: SimulatorProcess, **fields: object) -> None:
    requests.post(f"{sim.base_url}/sim/faults", json=fields, timeout=5).raise_for_status()


def test_an_endpoint_failing_the_second_queue_opens_its_breaker_not_the_firsts(
    redis_client: Redis,
    fast_policy: Policy,
    queue_name: str,
    second_queue: str,
    simulator: Callable[..., SimulatorProcess],
) -> None:
    breaker = BreakerPolicy.model_validate(tomllib.loads(BREAKER)["breaker"])
    policy = fast_policy.model_copy(
        update={"breaker": breaker, "queue": fast_policy.queue.model_copy(update={"max_attempts": 5})}
    )
    sim = simulator()
    endpoint = endpoint_id(sim.base_url)
    first = TicketQueue(redis_client, policy, queue_name)
    second = TicketQueue(redis_client, policy, second_queue)
    first_store = BreakerStore(redis_client, first.keys, policy.breaker)
    second_store = BreakerStore(redis_client, second.keys, policy.breaker)
    config = WorkerConfig(
        gpu=0,
        vllm_url=sim.base_url,
        worker_id=f"w-{queue_name}",
        queue_name=queue_name,
        extra_queues=(second_queue,),
        lease_seconds=policy.queue.lease_seconds,
        grace_seconds=5.0,
        heartbeat_seconds=0.5,
        resize_seconds=0.2,
        block_seconds=0.2,
    )
    running = RunningWorker(Worker(config, redis_client, policy))
    running.thread.start()
    try:
        _faults(sim, error_rate=1.0, error_status=503, extra_latency_s=0.3)
        held = submit_many(producer_for(second), 12, max_tokens=8)
        wait_until(
            lambda: second_store.read(endpoint).phase(time.time()) is Phase.OPEN,
            10,
            "the second queue's circuit to open",
        )
        # What b had in flight when its circuit opened ends (failed and back in b, or answered).
        wait_until(lambda: second.stats().inflight == 0, 10, "b's tickets in flight at the opening to end")
        assert first_store.read(endpoint).phase(time.time()) is Phase.CLOSED
        assert not [e for e in read_events(redis_client, first.keys, 50) if e["kind"] == "breaker"]
        assert any(e["kind"] == "breaker" for e in read_events(redis_client, second.keys, 50))
        refused = producer_for(second).submit(
            {"type": "complaint", "branch_id": "b1", "prompt": "hello", "max_tokens": 8}
        )
        assert refused.code is ShedCode.CIRCUIT_OPEN, "b's admission sees b's open circuit"

        _faults(sim, error_rate=0.0, extra_latency_s=0.0)
        answered = submit_many(producer_for(first), 4, max_tokens=8)
        wait_all_done(first, answered, 20)  # a's circuit is closed: claimed while b's is open
        assert second_store.read(endpoint).phase(time.time()) is Phase.OPEN
        assert second.stats().inflight == 0, "b's tickets wait in b while its circuit is open"
        assert any(t is not None and not t.status.terminal for t in second.get_many(held))
    finally:
        running.stop()
