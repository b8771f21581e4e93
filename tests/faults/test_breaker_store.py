"""Breaker state shared through Redis: counted by many workers at once, each transition written
(and its event recorded) exactly once, one probe at a time (half-open, or after a failure pause
every worker shares), buckets that expire."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import cast

import pytest
from redis import Redis

from shared import clock
from shared.breaker import Phase, endpoint_id
from shared.breaker_store import BreakerStore
from shared.control import read_events
from shared.keys import QueueKeys
from shared.policy import BreakerLevelPolicy, BreakerPolicy, InstantPolicy, QueuePolicy, load_policy
from tests.fake_clock import FakeClock
from worker.breaker_gate import CACHE_SECONDS, BreakerGate
from worker.claim_plan import Bound, Gate
from worker.vllm_client import VllmClient

POLICY = BreakerPolicy(
    min_requests=5,
    instant=InstantPolicy(window_seconds=1, error_rate=0.3, open_seconds=0.5),
    sustained=BreakerLevelPolicy(window_seconds=2, error_rate=0.2),
    deep=BreakerLevelPolicy(window_seconds=3, error_rate=0.15),
)
THREADS = 8


def _together(count: int, action: Callable[[], object]) -> list[object]:
    barrier = threading.Barrier(count)
    results: list[object] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        outcome = action()
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def _transitions(redis_client: Redis, keys: QueueKeys) -> list[str]:
    events = read_events(redis_client, keys, 100)
    return sorted(e["transition"] for e in events if e.get("kind") == "breaker")


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Real time to start with (bucket TTLs are Redis's own), then moved by the test."""
    return FakeClock(clock.now()).install(monkeypatch)


def test_concurrent_failures_open_once_and_one_probe_closes(
    redis_client: Redis, queue_name: str, fake_clock: FakeClock
) -> None:
    keys = QueueKeys(queue_name)
    stores = [BreakerStore(redis_client, keys, POLICY) for _ in range(THREADS)]
    store = stores[0]
    for _ in range(2):
        store.record("vllm-a:8000", True)
    assert store.read("vllm-a:8000").phase(clock.now()) is Phase.CLOSED
    it = iter(stores)
    _together(THREADS, lambda: next(it).record("vllm-a:8000", False))
    state = store.read("vllm-a:8000")
    assert state.phase(clock.now()) is Phase.OPEN
    assert _transitions(redis_client, keys) == ["deep:on", "instant:opened", "sustained:on"]

    assert not store.take_probe("vllm-a:8000")  # still open
    fake_clock.advance(POLICY.instant.open_seconds + 0.05)
    probes = _together(THREADS, lambda: store.take_probe("vllm-a:8000"))
    assert probes.count(True) == 1
    closed, transitions = store.record("vllm-a:8000", True, probe=True)
    assert transitions == ["instant:closed"] and closed.phase(clock.now()) is Phase.CLOSED


def test_buckets_expire_and_an_emptied_window_clears_its_rung(
    redis_client: Redis, queue_name: str, fake_clock: FakeClock
) -> None:
    keys = QueueKeys(queue_name)
    store = BreakerStore(redis_client, keys, POLICY)
    for _ in range(6):
        store.record("vllm-b:8000", False)
    assert store.read("vllm-b:8000").sustained
    bucket_ttls = [
        cast("int", redis_client.ttl(k))
        for k in redis_client.scan_iter(match=keys.breaker("vllm-b:8000") + ":*")
    ]
    assert bucket_ttls and all(0 < ttl <= 2 * POLICY.deep.window_seconds for ttl in bucket_ttls)
    fake_clock.advance(POLICY.deep.window_seconds + 0.2)
    state, transitions = store.record("vllm-b:8000", None)
    assert set(transitions) == {"sustained:off", "deep:off"}
    assert not state.sustained and not state.deep


def test_two_workers_share_one_failure_pause_and_only_one_gets_the_probe(
    redis_client: Redis, queue_name: str, fake_clock: FakeClock
) -> None:
    keys = QueueKeys(queue_name)
    vllm = VllmClient("http://127.0.0.1:9")  # never called: only its URL names the endpoint
    retry = QueuePolicy(retry_backoff_seconds=1.0, retry_backoff_max_seconds=8.0)
    first, second = (
        BreakerGate(BreakerStore(redis_client, keys, POLICY, retry), load_policy(), vllm, [])
        for _ in range(2)
    )
    assert second.claim_gate() == (Gate.GO, 0.0, None)
    first.record(vllm, False, retry_after=2.0)  # vLLM asks for 2 s, more than the first ceiling
    fake_clock.advance(CACHE_SECONDS)
    for gate in (first, second):
        verdict, wait, why = gate.claim_gate()
        assert (verdict, why) == (Gate.WAIT, Bound.FAILING) and wait == pytest.approx(2.0 - CACHE_SECONDS)
    second.record(vllm, False)  # the rest of the crashed batch: the same outage
    state = first.store.read(endpoint_id(vllm.base_url))
    assert state.failures == 1 and state.phase(clock.now()) is Phase.CLOSED, "pacing is no circuit"

    fake_clock.advance(2.0)
    assert [g.claim_gate()[0] for g in (first, second)] == [Gate.PROBE, Gate.PROBE]
    assert [g.take_probe() for g in (second, first)] == [True, False], "one probe for both workers"
    fake_clock.advance(CACHE_SECONDS)
    assert first.claim_gate()[0] is Gate.WAIT, "the other worker's probe is out"
    second.record(vllm, False, probe=True, retry_after=3.0)  # the probe failed: both pause again
    fake_clock.advance(CACHE_SECONDS)
    state = first.store.read(endpoint_id(vllm.base_url))
    assert (state.failures, state.probe_until) == (2, 0)
    assert [g.claim_gate()[0] for g in (first, second)] == [Gate.WAIT, Gate.WAIT]

    fake_clock.advance(3.0)
    assert first.take_probe() and not second.take_probe()
    first.record(vllm, True, probe=True)
    fake_clock.advance(CACHE_SECONDS)
    assert [g.claim_gate()[0] for g in (first, second)] == [Gate.GO, Gate.GO]
    vllm.close()
