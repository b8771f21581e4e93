"""The breaker ladder's decisions, pure: thresholds, min_requests, half-open probes, versions."""

from __future__ import annotations

from shared.breaker import (
    BreakerLevel,
    BreakerState,
    Phase,
    Window,
    decide,
    endpoint_id,
    model_version,
    take_probe,
)
from shared.breaker_store import BreakerView, refusing
from shared.policy import BreakerPolicy

POLICY = BreakerPolicy(min_requests=10)
QUIET = {"instant": Window(), "sustained": Window(), "deep": Window()}


def _windows(**rates: tuple[int, int]) -> dict[str, Window]:
    return {**QUIET, **{name: Window(ok, err) for name, (ok, err) in rates.items()}}


def test_instant_opens_above_its_rate_and_not_below_min_requests() -> None:
    state, transitions = decide(BreakerState(), _windows(instant=(6, 4)), POLICY, 100.0)
    assert transitions == ["instant:opened"]
    assert state.phase(100.0) is Phase.OPEN and state.open_until == 100.0 + POLICY.instant.open_seconds
    assert state.level(100.0) is BreakerLevel.INSTANT
    few, none = decide(BreakerState(), _windows(instant=(0, 9)), POLICY, 100.0)
    assert none == [] and few.phase(100.0) is Phase.CLOSED
    at_threshold, none = decide(BreakerState(), _windows(instant=(7, 3)), POLICY, 100.0)
    assert none == [] and at_threshold.phase(100.0) is Phase.CLOSED


def test_half_open_takes_one_probe_and_its_result_closes_or_reopens() -> None:
    opened = BreakerState(open_until=130.0)
    assert take_probe(opened, 120.0) is None  # still open
    probing = take_probe(opened, 131.0)
    assert probing is not None and opened.phase(131.0) is Phase.HALF_OPEN
    assert take_probe(probing, 131.5) is None  # one probe at a time
    closed, transitions = decide(probing, QUIET, POLICY, 132.0, probe_result=True)
    assert transitions == ["instant:closed"] and closed.phase(132.0) is Phase.CLOSED
    again, transitions = decide(probing, QUIET, POLICY, 132.0, probe_result=False)
    assert transitions == ["instant:reopened"] and again.phase(140.0) is Phase.OPEN


def test_sustained_and_deep_switch_on_and_clear_with_enough_requests() -> None:
    state, transitions = decide(BreakerState(), _windows(sustained=(70, 30), deep=(80, 20)), POLICY, 1.0)
    assert transitions == ["sustained:on", "deep:on"]
    assert state.level(1.0) is BreakerLevel.DEEP
    kept, transitions = decide(state, _windows(sustained=(70, 30), deep=(80, 20)), POLICY, 2.0)
    assert transitions == [] and kept.deep_since == 1.0  # the episode keeps its start
    emptied, transitions = decide(state, _windows(sustained=(0, 2), deep=(80, 20)), POLICY, 2.0)
    assert (
        transitions == ["sustained:off"] and emptied.deep
    )  # its traffic moved to the fallback: judge it anew
    cleared, transitions = decide(state, _windows(sustained=(90, 10), deep=(95, 5)), POLICY, 3.0)
    assert transitions == ["sustained:off", "deep:off"] and cleared.level(3.0) is BreakerLevel.CLOSED


def test_state_round_trips_through_redis_fields() -> None:
    state = BreakerState(open_until=5.5, probe_until=6.0, sustained=True, deep=False)
    assert BreakerState.from_fields({**state.to_fields(), "version": "0"}) == state


def test_model_version_is_after_the_last_colon() -> None:
    assert model_version("qwen-72b:2026.11") == "2026.11"
    assert model_version("org/model:v1:2026.12") == "2026.12"
    assert model_version("qwen-72b") is None
    assert endpoint_id("http://127.0.0.1:8000/") == "127.0.0.1:8000"


def test_admission_refuses_only_while_every_primary_is_open() -> None:
    def view(endpoint: str, open_until: float, role: str = "primary") -> BreakerView:
        return BreakerView(endpoint, BreakerState(open_until=open_until), {"role": role}, 100.0)

    assert refusing([]) is None
    assert refusing([view("a", 130.0), view("b", 0.0)]) is None  # b still serves
    assert refusing([view("a", 130.0), view("b", 99.0)]) is None  # b is half-open: probing
    soonest = refusing([view("a", 130.0), view("b", 110.0), view("f", 0.0, role="fallback")])
    assert soonest is not None and soonest.endpoint == "b"
    assert soonest.state.retry_after(soonest.now) == 10.0
