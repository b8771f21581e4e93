"""BreakerGate on its own: a fake breaker store and fake endpoints, time moved by a fake clock.

The shared store's Redis side has its own tests (tests/faults/test_breaker_store.py); here only
this worker's decisions: whether to claim, where to send, what it caches and announces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.breaker import BreakerState
from shared.policy import load_policy
from tests.fake_clock import FakeClock
from worker import breaker_gate
from worker.breaker_gate import CACHE_SECONDS, BreakerGate
from worker.claim_plan import Bound, Gate
from worker.vllm_client import ErrorKind, VllmError

POLICY = load_policy()


@dataclass
class FakeEndpoint:
    base_url: str
    model: str | None = None

    def served_model(self) -> str:
        if self.model is None:
            raise VllmError(ErrorKind.CONNECT, "refused")
        return self.model


@dataclass
class FakeStore:
    """Hands out the state the test set; counts reads and records outcomes."""

    states: dict[str, BreakerState] = field(default_factory=dict)
    transitions: list[str] = field(default_factory=list)
    reads: int = 0
    recorded: list[tuple[str, bool | None, bool, float | None]] = field(default_factory=list)
    probes: int = 0
    described: dict[str, dict[str, str]] = field(default_factory=dict)
    redis: Any = None
    keys: Any = None

    def record(
        self, endpoint: str, ok: bool | None, *, probe: bool = False, retry_after: float | None = None
    ) -> tuple[BreakerState, list[str]]:
        self.reads += ok is None
        if ok is not None:
            self.recorded.append((endpoint, ok, probe, retry_after))
        transitions, self.transitions = self.transitions, []
        return self.states.get(endpoint, BreakerState()), transitions

    def take_probe(self, endpoint: str) -> bool:
        self.probes += 1
        return self.probes == 1

    def release_probe(self, endpoint: str) -> None:
        self.probes = 0

    def describe(self, endpoint: str, **info: str) -> None:
        self.described.setdefault(endpoint, {}).update(info)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return FakeClock(start=1_000.0).install(monkeypatch)


def make_gate(*fallbacks: FakeEndpoint, primary: FakeEndpoint | None = None) -> tuple[BreakerGate, FakeStore]:
    store = FakeStore()
    gate = BreakerGate(
        store,  # type: ignore[arg-type]
        POLICY,
        primary or FakeEndpoint("http://primary:8000", "qwen:1"),  # type: ignore[arg-type]
        list(fallbacks),  # type: ignore[arg-type]
    )
    return gate, store


def test_the_claim_gate_follows_the_primarys_phase(fake_clock: FakeClock) -> None:
    gate, store = make_gate()
    assert gate.claim_gate() == (Gate.GO, 0.0, None)
    store.states["primary:8000"] = BreakerState(open_until=fake_clock.at + 12)
    fake_clock.advance(CACHE_SECONDS)
    assert gate.claim_gate() == (Gate.WAIT, pytest.approx(12 - CACHE_SECONDS), Bound.OPEN)
    fake_clock.advance(12)
    assert gate.claim_gate() == (Gate.PROBE, 0.0, Bound.HALF_OPEN), "half-open, no probe out"
    store.states["primary:8000"] = BreakerState(open_until=1.0, probe_until=fake_clock.at + 5)
    fake_clock.advance(CACHE_SECONDS)
    assert gate.claim_gate()[0] is Gate.WAIT, "another worker's probe is out"


def test_after_a_failure_the_gate_waits_out_the_pause_then_offers_the_probe(fake_clock: FakeClock) -> None:
    gate, store = make_gate()
    store.states["primary:8000"] = BreakerState(failures=1, paused_until=fake_clock.at + 3)
    assert gate.claim_gate() == (Gate.WAIT, pytest.approx(3.0), Bound.FAILING)
    fake_clock.advance(3)
    assert gate.claim_gate() == (Gate.PROBE, 0.0, Bound.FAILING)
    store.states["primary:8000"] = BreakerState(failures=1, probe_until=fake_clock.at + 5)
    fake_clock.advance(CACHE_SECONDS)
    assert gate.claim_gate() == (Gate.WAIT, 0.5, Bound.FAILING), "another worker probes"


def test_the_state_is_read_once_per_cache_period(fake_clock: FakeClock) -> None:
    gate, store = make_gate()
    for _ in range(5):
        gate.primary_healthy()
    assert store.reads == 1
    fake_clock.advance(CACHE_SECONDS)
    gate.primary_healthy()
    assert store.reads == 2


def test_probes_go_to_the_primary_and_sustained_errors_to_a_matched_fallback(fake_clock: FakeClock) -> None:
    matched = FakeEndpoint("http://fallback-a:8000", "qwen:1")
    gate, store = make_gate(matched)
    gate.pair()
    assert gate.fallbacks[0].status == "matched"
    store.states["primary:8000"] = BreakerState(sustained=True)
    assert gate.client_for(routed_to_fallback=False, probe=True) is gate.primary
    assert gate.client_for(routed_to_fallback=False, probe=False) is matched
    store.states["fallback-a:8000"] = BreakerState(failures=1, paused_until=fake_clock.at + 2)
    fake_clock.advance(CACHE_SECONDS)
    assert gate.client_for(routed_to_fallback=False, probe=False) is gate.primary, "its failure pause runs"
    store.states["fallback-a:8000"] = BreakerState(open_until=fake_clock.at + 30)
    fake_clock.advance(CACHE_SECONDS)
    assert gate.client_for(routed_to_fallback=False, probe=False) is gate.primary, "its circuit is open"


def test_a_mismatched_fallback_is_reported_once_and_never_used(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(
        breaker_gate, "append_event", lambda _r, _k, kind, **f: events.append({"kind": kind, **f})
    )
    other = FakeEndpoint("http://fallback-b:8000", "qwen:2")
    gate, store = make_gate(other)
    gate.pair()
    gate.pair()
    assert gate.fallbacks[0].status == "mismatched"
    assert [e["kind"] for e in events] == ["fallback_mismatch"] and events[0]["wanted"] == "1"
    assert store.described["fallback-b:8000"]["fallback_status"] == "mismatched"
    store.states["primary:8000"] = BreakerState(sustained=True)
    assert gate.client_for(routed_to_fallback=True, probe=False) is gate.primary


def test_an_unknown_fallback_takes_only_tickets_routed_to_it(fake_clock: FakeClock) -> None:
    silent = FakeEndpoint("http://fallback-c:8000", None)  # its /v1/models does not answer
    gate, store = make_gate(silent)
    gate.pair()
    assert gate.fallbacks[0].status == "unknown"
    assert gate.client_for(routed_to_fallback=True, probe=False) is silent
    store.states["primary:8000"] = BreakerState(sustained=True)
    assert gate.client_for(routed_to_fallback=False, probe=False) is gate.primary, (
        "sustained needs a verified one"
    )


def test_outcomes_are_counted_and_transitions_told_to_listeners(fake_clock: FakeClock) -> None:
    gate, store = make_gate()
    heard: list[tuple[str, list[str]]] = []
    gate.listeners.append(lambda endpoint, _state, transitions: heard.append((endpoint, transitions)))
    gate.record(gate.primary, True)
    store.transitions = ["instant:opened"]
    store.states["primary:8000"] = BreakerState(open_until=fake_clock.at + 30)
    gate.record(gate.primary, False, probe=True, retry_after=4.0)
    assert store.recorded == [("primary:8000", True, False, None), ("primary:8000", False, True, 4.0)]
    assert heard == [("primary:8000", ["instant:opened"])]
    assert not gate.primary_healthy(), "the recorded state is the cached one"


def test_the_probe_is_taken_once_and_given_back(fake_clock: FakeClock) -> None:
    gate, _store = make_gate()
    assert gate.take_probe() and not gate.take_probe()
    gate.release_probe()
    assert gate.take_probe()
