"""The alarm state machine alone: raise at once, clear slowly, never flap; with the default window
and dwell, a depth swinging 0 <-> 100 within half a second walks up, holds, and comes down once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.monitor.hysteresis import AlarmTracker, Transition
from shared.control import level_for_depth
from shared.policy import AlarmLevel, AlarmPolicy

ALARMS = AlarmPolicy(window_seconds=0, min_dwell_seconds=0)  # 30 / 50 / 80, margin 5, hold 5 s, each sample
SMOOTHED = AlarmPolicy()  # the same, following depth averaged over 10 s, with a 10 s dwell
GREEN, YELLOW, ORANGE, RED = AlarmLevel.GREEN, AlarmLevel.YELLOW, AlarmLevel.ORANGE, AlarmLevel.RED


def walk(tracker: AlarmTracker, depths: list[int], start: float = 0.0, step: float = 1.0) -> list[Transition]:
    out: list[Transition] = []
    for i, depth in enumerate(depths):
        out += tracker.observe(depth, start + i * step)
    return out


def pairs(transitions: list[Transition]) -> list[tuple[AlarmLevel, AlarmLevel]]:
    return [(t.previous, t.level) for t in transitions]


def test_raises_exactly_above_each_threshold() -> None:
    tracker = AlarmTracker(ALARMS)
    seen = {}
    for depth in range(0, 100):
        for t in tracker.observe(depth, float(depth)):
            seen[t.level] = t.depth
    assert seen == {YELLOW: 31, ORANGE: 51, RED: 81}


def test_jump_records_each_crossed_level_once() -> None:
    tracker = AlarmTracker(ALARMS)
    assert pairs(tracker.observe(200, 0.0)) == [(GREEN, YELLOW), (YELLOW, ORANGE), (ORANGE, RED)]
    assert tracker.observe(200, 1.0) == []
    assert tracker.level is RED and tracker.since == 0.0


def test_clears_one_level_at_a_time_after_the_hold() -> None:
    tracker = AlarmTracker(ALARMS)
    tracker.observe(90, 0.0)
    # Depth 0 from t=1: every level's clear line is undercut from then on.
    cleared = walk(tracker, [0] * 12, start=1.0)
    assert [(t.previous, t.level, t.at) for t in cleared] == [
        (RED, ORANGE, 6.0),
        (ORANGE, YELLOW, 7.0),
        (YELLOW, GREEN, 8.0),
    ]


def test_depth_between_clear_line_and_threshold_holds_the_level() -> None:
    tracker = AlarmTracker(ALARMS)
    tracker.observe(85, 0.0)
    assert walk(tracker, [75] * 60, start=1.0) == []  # 75 is not below 80 - 5
    assert tracker.level is RED


def test_a_single_sample_above_the_clear_line_restarts_the_hold() -> None:
    tracker = AlarmTracker(ALARMS)
    tracker.observe(55, 0.0)
    # Under orange's clear line (45) from t=1, back over it at t=5, under again from t=6.
    assert walk(tracker, [40, 40, 40, 40, 46, 40, 40, 40, 40, 40], start=1.0) == []
    assert pairs(tracker.observe(40, 11.0)) == [(ORANGE, YELLOW)]


def test_no_margin_clears_once_depth_is_back_at_the_threshold() -> None:
    alarms = AlarmPolicy(
        yellow=0, orange=1, red=2, clear_margin=0, clear_hold_seconds=0, window_seconds=0, min_dwell_seconds=0
    )
    tracker = AlarmTracker(alarms)
    assert pairs(tracker.observe(1, 0.0)) == [(GREEN, YELLOW)]
    assert pairs(tracker.observe(0, 1.0)) == [(YELLOW, GREEN)]


def test_restored_state_continues_from_the_published_level() -> None:
    tracker = AlarmTracker(ALARMS, ORANGE, since=100.0)
    assert tracker.observe(60, 101.0) == []
    assert pairs(tracker.observe(81, 102.0)) == [(ORANGE, RED)]


@settings(max_examples=200, deadline=None)
@given(
    depths=st.lists(st.integers(min_value=0, max_value=150), min_size=1, max_size=120),
    step=st.sampled_from([0.25, 1.0, 2.0]),
)
def test_properties_over_any_depth_series(depths: list[int], step: float) -> None:
    """Never below what depth calls for; each clear preceded by a full hold under the clear line."""
    tracker = AlarmTracker(ALARMS)
    history: list[tuple[float, int]] = []
    for i, depth in enumerate(depths):
        now = i * step
        history.append((now, depth))
        transitions = tracker.observe(depth, now)
        assert tracker.level >= level_for_depth(depth, ALARMS)
        assert all(abs(t.level - t.previous) == 1 for t in transitions)
        for t in transitions:
            if not t.raised:
                line = tracker.clear_line(t.previous)
                window = [d for at, d in history if now - at <= ALARMS.clear_hold_seconds]
                assert all(d < line for d in window), (t, window)
                assert history[0][0] <= now - ALARMS.clear_hold_seconds


@settings(max_examples=200, deadline=None)
@given(
    level=st.sampled_from([YELLOW, ORANGE, RED]),
    highs=st.lists(st.integers(min_value=1, max_value=4), min_size=10, max_size=80),
)
def test_oscillation_around_a_threshold_never_flaps(level: AlarmLevel, highs: list[int]) -> None:
    """Depth swinging between just under the threshold and just over it raises once, never clears."""
    threshold = ALARMS.threshold(level)
    tracker = AlarmTracker(ALARMS, AlarmLevel(level - 1))
    depths = [threshold + h if i % 2 else threshold - ALARMS.clear_margin for i, h in enumerate(highs)]
    transitions = walk(tracker, depths)
    assert pairs(transitions) == [(AlarmLevel(level - 1), level)]


@settings(max_examples=100, deadline=None)
@given(period=st.integers(min_value=1, max_value=4), cycles=st.integers(min_value=3, max_value=20))
def test_dips_shorter_than_the_hold_never_clear(period: int, cycles: int) -> None:
    tracker = AlarmTracker(ALARMS)
    tracker.observe(60, -1.0)
    depths = ([10] * period + [48]) * cycles  # well under orange's clear line, then back over it
    transitions = walk(tracker, depths)
    assert transitions == [] and tracker.level is ORANGE


def test_since_is_the_first_sample_while_the_level_holds() -> None:
    tracker = AlarmTracker(ALARMS)
    for at in (10.0, 11.0, 12.0):
        assert tracker.observe(0, at) == []
    assert tracker.level is GREEN and tracker.since == 10.0
    tracker.observe(40, 13.0)
    assert tracker.since == 13.0


def swing(low: int, high: int, seconds: float, start: float, step: float = 0.05) -> list[tuple[float, int]]:
    """A depth trace that a batch claim makes: `high` for a quarter second, then `low`, and so on."""
    return [
        (start + i * step, high if (i * step) % 0.5 < 0.25 else low) for i in range(round(seconds / step))
    ]


def monotone(transitions: list[Transition]) -> bool:
    """Up, hold, down: once a transition goes down, none goes up again."""
    downs = [not t.raised for t in transitions]
    return downs == sorted(downs)


@pytest.mark.parametrize(("low", "high"), [(0, 100), (60, 140), (0, 200)])
def test_a_batch_claims_swing_cannot_make_the_level_cycle(low: int, high: int) -> None:
    tracker = AlarmTracker(SMOOTHED)
    trace = swing(low, high, 45.0, start=0.0) + [(45.0 + i * 0.05, 0) for i in range(1200)]
    transitions = [t for at, depth in trace for t in tracker.observe(depth, at)]
    assert monotone(transitions), pairs(transitions)
    assert sum(t.level is RED for t in transitions) <= 1
    assert sum(t.previous is RED for t in transitions) <= 1
    assert tracker.level is GREEN  # and it came down once the surge was over


def test_the_surge_is_seen_at_once_and_a_spike_is_not() -> None:
    tracker = AlarmTracker(SMOOTHED)
    assert pairs(tracker.observe(120, 0.0)) == [(GREEN, YELLOW), (YELLOW, ORANGE), (ORANGE, RED)]
    calm = AlarmTracker(SMOOTHED)
    for i in range(100):
        calm.observe(0, i * 0.1)
    assert calm.observe(120, 10.0) == []  # one sample of a claim's swing in 10 s of calm
    assert calm.level is GREEN


def test_no_step_down_within_the_dwell() -> None:
    tracker = AlarmTracker(AlarmPolicy(window_seconds=0, min_dwell_seconds=10, clear_hold_seconds=1))
    tracker.observe(90, 0.0)
    early = walk(tracker, [0] * 9, start=1.0)
    assert early == []  # below every clear line since t=1, but red was entered at t=0
    assert pairs(tracker.observe(0, 10.0)) == [(RED, ORANGE)]
    assert tracker.observe(90, 11.0) == []  # no step up straight after a step down
    assert pairs(tracker.observe(90, 20.0)) == [(ORANGE, RED)]
