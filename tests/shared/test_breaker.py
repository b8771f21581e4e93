"""The breaker ladder's decisions, pure: thresholds, min_requests, half-open probes, versions, and
the failure streak that paces claims (its pause, its one probe, reset by a success)."""

from __future__ import annotations

import pytest

from shared import backoff
from shared.breaker import (
    BreakerLevel,
    BreakerState,
    Phase,
    Window,
    decide,
    endpoint_id,
    model_version,
    pause_seconds,
    take_probe,
)
from shared.breaker_store import BreakerView, refusing
from shared.policy import BreakerPolicy, QueuePolicy

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
    closed, transitions = decide(probing, QUIET, POLICY, 132.0, ok=True, probe=True)
    assert transitions == ["instant:closed"] and closed.phase(132.0) is Phase.CLOSED
    assert closed.probe_until == 0
    again, transitions = decide(probing, QUIET, POLICY, 132.0, ok=False, probe=True)
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
    state = BreakerState(
        open_until=5.5, probe_until=6.0, sustained=True, deep=False, failures=3, paused_until=7.25
    )
    assert BreakerState.from_fields({**state.to_fields(), "version": "0"}) == state
    older = {k: v for k, v in state.to_fields().items() if k not in ("failures", "paused_until")}
    assert BreakerState.from_fields(older) == BreakerState(open_until=5.5, probe_until=6.0, sustained=True)


def _ceiling(failures: int) -> float:
    """A pause drawn at the top of the curve (base 0.02 s, cap 0.08 s): no jitter in these tests."""
    return backoff.ceiling(failures, 0.02, 0.08)


def test_failure_pauses_grow_up_to_the_cap_and_a_success_clears_them() -> None:
    state, now, pauses = BreakerState(), 100.0, []
    for _ in range(4):
        state, transitions = decide(state, QUIET, POLICY, now, ok=False, pause=_ceiling)
        pauses.append(state.paused_until - now)
        assert transitions == [] and state.phase(now) is Phase.CLOSED, "no level, no phase: only pacing"
        assert not state.probing(now) and state.probing(state.paused_until)
        now = state.paused_until + 0.005
    assert state.failures == 4 and pauses == pytest.approx([0.02, 0.04, 0.08, 0.08])
    cleared, _ = decide(state, QUIET, POLICY, now, ok=True)
    assert (cleared.failures, cleared.paused_until) == (0, 0.0) and not cleared.probing(now)


def test_failures_during_a_pause_are_one_outage() -> None:
    first, _ = decide(BreakerState(), QUIET, POLICY, 100.0, ok=False, pause=lambda _: 1.0)
    state = first
    for moment in (100.1, 100.5, 100.99):  # the rest of the batch fails with the same crash
        state, _ = decide(state, QUIET, POLICY, moment, ok=False, pause=lambda _: 5.0)
    assert state == first, "the pause is not lengthened and the streak stays at one"


def test_one_probe_after_the_pause_its_failure_pauses_longer_its_success_clears() -> None:
    failing = BreakerState(failures=1, paused_until=110.0)
    assert take_probe(failing, 105.0) is None, "the pause runs: nobody probes"
    probing = take_probe(failing, 110.0)
    assert probing is not None and take_probe(probing, 110.5) is None, "one probe for all workers"
    again, transitions = decide(probing, QUIET, POLICY, 111.0, ok=False, probe=True, pause=_ceiling)
    assert transitions == [] and again.probe_until == 0
    assert (again.failures, again.paused_until) == (2, pytest.approx(111.04))
    healed, _ = decide(probing, QUIET, POLICY, 111.0, ok=True, probe=True)
    assert (healed.failures, healed.probe_until, healed.paused_until) == (0, 0.0, 0.0)


def test_the_pause_honours_retry_after_up_to_the_cap() -> None:
    retry = QueuePolicy(retry_backoff_seconds=0.01, retry_backoff_max_seconds=5.0)
    assert pause_seconds(1, retry) <= 0.01
    assert pause_seconds(1, retry, retry_after=3.0) == 3.0
    assert pause_seconds(1, retry, retry_after=60.0) == 5.0
    never = QueuePolicy(retry_backoff_seconds=0, retry_backoff_max_seconds=0)
    assert 0 <= pause_seconds(1, never, retry_after=1.0) <= 0.01, "a zero base still pauses, up to 0.01 s"


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
    failing = BreakerView("c", BreakerState(failures=3, paused_until=120.0), {}, 100.0)
    assert refusing([failing]) is None, "a failure pause only paces claims"
    soonest = refusing([view("a", 130.0), view("b", 110.0), view("f", 0.0, role="fallback")])
    assert soonest is not None and soonest.endpoint == "b"
    assert soonest.state.retry_after(soonest.now) == 10.0
