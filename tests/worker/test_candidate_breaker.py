"""The candidate's own breaker steers the canary: two simulators, faults injected into the candidate.

While the candidate's circuit is open, canary tickets go to the primary (answered once, nothing
lost), shadow calls stop, and the rollout's event stream says so; once the candidate is healed a
half-open probe closes the circuit and canary tickets reach it again. No wave judge runs here (the
interval is an hour), so only the breaker moves the traffic.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import requests
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared import clock
from shared.breaker import Phase, endpoint_id
from shared.breaker_store import BreakerStore, refusing
from shared.control import read_events
from shared.keys import QueueKeys
from shared.policy import BreakerPolicy, Policy
from shared.queue import TicketQueue
from shared.rollout_stats import read_shadow
from shared.rollout_store import RolloutStore
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, wait_all_ended
from worker.config import WorkerConfig
from worker.gpu_memory import make_provider
from worker.worker import Worker

PRIMARY_MODEL = "qwen-sim:2026.11"
CANDIDATE_MODEL = "qwen-sim:2026.12"
OPEN_SECONDS = 6
BREAKER = f"""
[breaker]
min_requests = 5
instant = {{ window_seconds = 1, error_rate = 0.30, open_seconds = {OPEN_SECONDS} }}
sustained = {{ window_seconds = 2, error_rate = 0.50 }}
deep = {{ window_seconds = 600, error_rate = 0.99 }}
"""


@pytest.fixture
def breaker_policy(fast_policy: Policy) -> Policy:
    breaker = BreakerPolicy.model_validate(tomllib.loads(BREAKER)["breaker"])
    return fast_policy.model_copy(update={"breaker": breaker})


@pytest.fixture
def running_worker(
    redis_client: Redis, breaker_policy: Policy, queue_name: str, simulator: Callable[..., SimulatorProcess]
) -> Iterator[tuple[RunningWorker, SimulatorProcess]]:
    primary = simulator(model=PRIMARY_MODEL)
    config = WorkerConfig(
        gpu=0,
        vllm_url=primary.base_url,
        worker_id=f"w-{queue_name}",
        queue_name=queue_name,
        lease_seconds=breaker_policy.queue.lease_seconds,
        grace_seconds=5.0,
        heartbeat_seconds=0.5,
        resize_seconds=0.2,
        block_seconds=0.2,
    )
    worker = Worker(config, redis_client, breaker_policy, gpu_provider=make_provider("sim", primary.base_url))
    worker.rollout.refresh_seconds = 0.0
    running = RunningWorker(worker)
    running.thread.start()
    yield running, primary
    running.stop()


def _faults(sim: SimulatorProcess, **fields: object) -> None:
    requests.post(f"{sim.base_url}/sim/faults", json=fields, timeout=5).raise_for_status()


def _run(queue: TicketQueue, branch: str, count: int) -> dict[str, str]:
    """Submit `count` short complaints of `branch` and wait for them; ticket id -> answering model."""
    producer = producer_for(queue)
    body = {"type": "complaint", "branch_id": branch, "prompt": f"{branch} asks " * 8, "max_tokens": 8}
    ids = [producer.submit(body).ticket_id for _ in range(count)]
    tickets = wait_all_ended(queue, ids, 60, f"{branch}'s tickets to end")
    assert [(t.status.value, t.attempts) for t in tickets] == [("done", 1)] * count, [
        t.error for t in tickets
    ]
    return {t.id: str((t.usage or {}).get("model")) for t in tickets}


def _breaker_steps(redis_client: Redis, keys: QueueKeys) -> list[dict[str, str]]:
    events = reversed(read_events(redis_client, keys, 500))
    return [e for e in events if e.get("kind") == "rollout" and e.get("step") == "candidate_breaker"]


def test_an_open_candidate_breaker_sends_canary_tickets_to_the_primary_and_stops_shadow_until_it_heals(
    running_worker: tuple[RunningWorker, SimulatorProcess],
    simulator: Callable[..., SimulatorProcess],
    redis_client: Redis,
    breaker_policy: Policy,
    queue_name: str,
) -> None:
    running, _primary = running_worker
    candidate = simulator(model=CANDIDATE_MODEL)
    keys = QueueKeys(queue_name)
    queue = TicketQueue(redis_client, breaker_policy, queue_name)
    # As a monitor would publish it: without one the level follows depth, and a burst reads as orange.
    redis_client.hset(
        keys.alarm, mapping={"level": "green", "since": clock.now(), "updated_at": clock.now() + 600}
    )
    state = RolloutStore(redis_client, keys).start(
        candidate_url=candidate.base_url,
        version="2026.12",
        interval_seconds=3600,
        shadow_fraction=1.0,
        actor="t",
    )
    store = BreakerStore(redis_client, keys, breaker_policy.breaker)
    endpoint = endpoint_id(candidate.base_url)

    _faults(candidate, error_rate=1.0, error_status=500)
    tripping = _run(queue, "b0", 10)  # wave 0: b0 is a canary branch
    assert set(tripping.values()) == {PRIMARY_MODEL}, "the primary rescues every failed candidate call"
    assert store.read(endpoint).phase(clock.now()) is Phase.OPEN
    arms = keys.rollout_arms(state.id)
    tried = int(cast("str", redis_client.hget(arms, "0:candidate:error")))
    assert breaker_policy.breaker.min_requests <= tried <= 10

    diverted = _run(queue, "b0", 20) | _run(queue, "b5", 10)  # b5 is on the primary and shadowed
    assert store.read(endpoint).phase(clock.now()) is Phase.OPEN, (
        f"the test outran open_seconds={OPEN_SECONDS}"
    )
    assert set(diverted.values()) == {PRIMARY_MODEL}
    assert int(cast("str", redis_client.hget(arms, "0:candidate:error"))) == tried, "no call reached it"
    assert int(cast("str", redis_client.hget(arms, "0:primary:ok") or 0)) >= 20, (
        "the canary ran on the primary"
    )
    shadow = running.worker.rollout.shadow
    assert shadow.skipped["breaker"] >= 10 and not read_shadow(redis_client, keys, state.id)
    views = store.views()
    (view,) = [v for v in views if v.endpoint == endpoint]
    assert view.as_dict()["role"] == "candidate"
    assert refusing(views) is None, "the candidate's open circuit never refuses the queue's tickets"
    first = _breaker_steps(redis_client, keys)[0]
    assert first["routing"] == "primary" and "instant:opened" in first["transition"]
    assert first["rollout"] == state.id and first["endpoint"] == endpoint

    _faults(candidate, error_rate=0.0)
    wait_until(
        lambda: store.read(endpoint).phase(clock.now()) is not Phase.OPEN, OPEN_SECONDS + 5, "half-open"
    )

    def back_on_candidate() -> bool:
        return CANDIDATE_MODEL in _run(queue, "b0", 3).values()

    wait_until(back_on_candidate, 20, "canary tickets to reach the healed candidate", interval=0.2)
    assert store.read(endpoint).phase(clock.now()) is Phase.CLOSED
    assert _breaker_steps(redis_client, keys)[-1]["routing"] == "candidate"
    stats = queue.stats()
    assert stats.outcome_count("complaint", "submitted") == stats.outcome_count("complaint", "done")
