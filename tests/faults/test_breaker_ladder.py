"""The breaker ladder end to end, driven by the simulator's injected error rate with short windows:
instant refuses new tickets (`circuit_open`, Retry-After) and holds queued ones without spending
attempts, half-open probes close it again; sustained sends traffic to the fallback whose model
version matches, never to the mismatched one; deep pages once."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from ops.monitor.loop import Monitor, MonitorConfig
from producer.producer import Producer
from shared import clock
from shared.breaker import Phase
from shared.breaker_store import BreakerStore
from shared.control import read_events
from shared.models import Ticket, TicketStatus
from shared.policy import BreakerPolicy, HooksPolicy, Policy
from shared.queue import TicketQueue
from shared.shed import ShedCode
from tests.monitor.support import RqQueues
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker, sim_metric
from worker.config import WorkerConfig
from worker.worker import Worker

PRIMARY_MODEL = "qwen-7b:2026.11"
MATCHED_MODEL = "qwen-7b-replica:2026.11"
MISMATCHED_MODEL = "qwen-7b:2026.10"
BREAKER = """
[breaker]
min_requests = 5
instant = { window_seconds = 1, error_rate = 0.30, open_seconds = 2 }
sustained = { window_seconds = 4, error_rate = 0.50 }
deep = { window_seconds = 6, error_rate = 0.15 }
"""


SUSTAINED_ONLY = """
[breaker]
min_requests = 5
instant = { window_seconds = 1, error_rate = 0.95, open_seconds = 2 }
sustained = { window_seconds = 3, error_rate = 0.20 }
deep = { window_seconds = 600, error_rate = 0.90 }
"""


def _policy(fast_policy: Policy, hook_url: str, breaker_toml: str, max_attempts: int) -> Policy:
    """The worker tests' fast policy with short breaker windows and a notify hook."""
    breaker = BreakerPolicy.model_validate(tomllib.loads(breaker_toml)["breaker"])
    queue = fast_policy.queue.model_copy(update={"max_attempts": max_attempts})
    return fast_policy.model_copy(
        update={"breaker": breaker, "hooks": HooksPolicy(notify_hook=hook_url), "queue": queue}
    )


@pytest.fixture
def ladder(
    request: pytest.FixtureRequest,
    redis_client: Redis,
    queue_name: str,
    simulator: Callable[..., SimulatorProcess],
    hook_server: tuple[str, list[dict[str, Any]]],
    fast_policy: Policy,
) -> Iterator[dict[str, Any]]:
    breaker_toml, max_attempts = request.param
    policy = _policy(fast_policy, hook_server[0], breaker_toml, max_attempts)
    primary = simulator(model=PRIMARY_MODEL)
    matched = simulator(model=MATCHED_MODEL)
    mismatched = simulator(model=MISMATCHED_MODEL)
    config = WorkerConfig(
        gpu=0,
        vllm_url=primary.base_url,
        fallback_vllm_url=f"{mismatched.base_url}, {matched.base_url}",
        worker_id=f"ladder-{queue_name}",
        queue_name=queue_name,
        lease_seconds=policy.queue.lease_seconds,
        grace_seconds=5.0,
        heartbeat_seconds=0.5,
        resize_seconds=0.5,
        block_seconds=0.5,
    )
    running = RunningWorker(Worker(config, redis_client, policy))
    running.thread.start()
    yield {
        "policy": policy,
        "primary": primary,
        "matched": matched,
        "mismatched": mismatched,
        "producer": Producer(redis_client, policy, queue_name, admission_cache_seconds=0),
        "queue": TicketQueue(redis_client, policy, queue_name),
        "store": BreakerStore(
            redis_client, TicketQueue(redis_client, policy, queue_name).keys, policy.breaker
        ),
        "worker": running,
        "hook_calls": hook_server[1],
    }
    running.stop()


def _faults(sim: SimulatorProcess, **fields: object) -> None:
    requests.post(f"{sim.base_url}/sim/faults", json=fields, timeout=5).raise_for_status()


def _submit(producer: Producer, count: int) -> list[str]:
    body = {"type": "complaint", "branch_id": "b1", "prompt": "card declined " * 8, "max_tokens": 8}
    return [producer.submit(body).ticket_id for _ in range(count)]


def _ended(queue: TicketQueue, ids: list[str]) -> list[Ticket] | None:
    tickets = queue.get_many(ids)
    return [t for t in tickets if t] if all(t is not None and t.status.terminal for t in tickets) else None


def _phase(store: BreakerStore, endpoint: str) -> Phase:
    return store.read(endpoint).phase(clock.now())


@pytest.mark.parametrize("ladder", [(BREAKER, 3)], indirect=True)
def test_instant_refuses_and_holds_deep_pages_once_probes_close(
    ladder: dict[str, Any], redis_client: Redis, rq_queues: RqQueues, queue_name: str
) -> None:
    store: BreakerStore = ladder["store"]
    queue: TicketQueue = ladder["queue"]
    producer: Producer = ladder["producer"]
    primary = ladder["primary"].base_url.split("://")[1]
    healthy = _submit(producer, 6)
    wait_until(lambda: _ended(queue, healthy), 20, "healthy tickets done")
    pairing = {v.endpoint: v.as_dict()["fallback"] for v in store.views()}
    assert pairing[ladder["matched"].base_url.split("://")[1]] == "matched"
    assert pairing[ladder["mismatched"].base_url.split("://")[1]] == "mismatched"
    assert any(e["kind"] == "fallback_mismatch" for e in read_events(redis_client, queue.keys, 50))

    # Instant: every answer fails (a little late, so a burst is in flight together); the circuit
    # opens within its window and refuses new tickets.
    _faults(ladder["primary"], error_rate=1.0, error_status=503, extra_latency_s=0.3)
    held = _submit(producer, 12)
    wait_until(lambda: _phase(store, primary) is Phase.OPEN, 5, "the primary's circuit to open")
    refused = producer.submit({"type": "complaint", "branch_id": "b1", "prompt": "hello", "max_tokens": 8})
    assert refused.outcome == "rejected" and refused.code is ShedCode.CIRCUIT_OPEN
    assert (
        refused.retry_after is not None
        and 0 < refused.retry_after <= ladder["policy"].breaker.instant.open_seconds
    )
    # Nothing is sent while open: the calls out when it opened end, and the tickets wait.
    wait_until(lambda: queue.stats().inflight == 0, 5, "the calls out when the circuit opened to end")
    assert _phase(store, primary) is Phase.OPEN, "the test outran open_seconds"
    assert max(t.attempts for t in queue.get_many(held) if t) <= 1

    # Deep (and sustained) tripped with it: the monitor pages once, however often it samples.
    monitor = Monitor(
        redis_client, rq_queues.conn, ladder["policy"], queue_name, MonitorConfig(jobs=rq_queues.jobs)
    )
    for _ in range(3):
        monitor.tick()
    monitor.close()
    rq_queues.work()
    pages = [c for c in ladder["hook_calls"] if c.get("event") == "breaker_deep"]
    assert [p["endpoint"] for p in pages] == [primary]

    # Recovery: half-open probes close the circuit and the held tickets finish, none failed.
    _faults(ladder["primary"], error_rate=0.0, extra_latency_s=0.0)
    wait_until(lambda: _phase(store, primary) is Phase.CLOSED, 10, "half-open probes to close the circuit")
    tickets = wait_until(lambda: _ended(queue, held), 30, "held tickets to finish")
    assert {t.status for t in tickets} == {TicketStatus.DONE}, [(t.status, t.error) for t in tickets]
    assert sim_metric(ladder["mismatched"].base_url, "vllm:prompt_tokens_total") == 0
    transitions = [
        e["transition"] for e in read_events(redis_client, queue.keys, 200) if e["kind"] == "breaker"
    ]
    assert "instant:opened" in transitions and "instant:closed" in transitions
    assert transitions.count("deep:on") == 1


@pytest.mark.parametrize("ladder", [(SUSTAINED_ONLY, 20)], indirect=True)
def test_sustained_errors_go_to_the_version_matched_fallback_only(ladder: dict[str, Any]) -> None:
    store: BreakerStore = ladder["store"]
    queue: TicketQueue = ladder["queue"]
    producer: Producer = ladder["producer"]
    primary = ladder["primary"].base_url.split("://")[1]
    wait_until(lambda: len(store.views()) == 3, 10, "the worker to pair its fallbacks")
    _faults(ladder["primary"], error_rate=0.5, error_status=500)
    ids: list[str] = []
    wait_until(
        lambda: ids.extend(_submit(producer, 2)) or store.read(primary).sustained,
        15,
        "the sustained rung to switch on",
        interval=0.05,
    )
    ids += _submit(producer, 10)
    tickets = wait_until(lambda: _ended(queue, ids), 40, "every ticket to end")
    assert {t.status for t in tickets} == {TicketStatus.DONE}, [(t.status, t.error) for t in tickets]
    models = {t.usage.get("model") for t in tickets if t.usage}
    assert MATCHED_MODEL in models
    assert MISMATCHED_MODEL not in models
    assert sim_metric(ladder["mismatched"].base_url, "vllm:prompt_tokens_total") == 0
