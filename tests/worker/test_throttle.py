"""The adaptive throttle, fed synthetic critical answers on a patched clock."""

from __future__ import annotations

import pytest

from worker.throttle import HORIZON_SECONDS, MIN_ANSWERS, RUN_SHARE, Throttle

SLO = 2.0
ALLOWANCE = SLO * RUN_SHARE


class Clock:
    def __init__(self) -> None:
        self.at = 1_000.0

    def __call__(self) -> float:
        return self.at


def feed(throttle: Throttle, pressure: float, answers: int = MIN_ANSWERS) -> None:
    for _ in range(answers):
        throttle.observe(run_seconds=pressure * ALLOWANCE, slo_seconds=SLO)


def test_not_in_force_without_critical_answers() -> None:
    assert Throttle(32, now=Clock()).ceiling(32) is None


def test_loans_past_their_allowance_cut_it_by_a_quarter_down_to_the_floor() -> None:
    clock = Clock()
    throttle = Throttle(32, now=clock)
    limits = []
    for _ in range(6):
        feed(throttle, 1.3)
        limits.append(throttle.ceiling(32))
    assert limits == [24, 18, 13, 9, 8, 8], "a quarter off per verdict, floor max_batch / 4"
    assert throttle.pressure == pytest.approx(1.3)


def test_loans_well_within_it_take_back_a_quarter_of_the_distance_then_probe_a_slot_at_a_time() -> None:
    clock = Clock()
    throttle = Throttle(32, now=clock)
    for _ in range(4):
        feed(throttle, 1.5)
        throttle.ceiling(32)
    assert throttle.ceiling(32) == 9
    grown = []
    for _ in range(4):
        feed(throttle, 0.5)
        grown.append(throttle.ceiling(32))
    assert grown == [15, 16, 17, 18], (
        "a leap past three quarters of 13 (the last cut's ceiling), then a slot a verdict"
    )


def test_a_cut_from_near_capacity_is_approached_a_slot_at_a_time() -> None:
    clock = Clock()
    throttle = Throttle(32, now=clock)
    feed(throttle, 1.5)
    assert throttle.ceiling(32) == 24  # cut from 32 to three quarters of it: probing from here
    grown = []
    for _ in range(4):
        feed(throttle, 0.5)
        grown.append(throttle.ceiling(32))
    assert grown == [25, 26, 27, 28]


def test_between_the_marks_it_holds_and_a_verdict_needs_enough_new_answers() -> None:
    clock = Clock()
    throttle = Throttle(32, now=clock)
    feed(throttle, 1.2)
    assert throttle.ceiling(32) == 24
    feed(throttle, 0.9)
    assert throttle.ceiling(32) == 24
    feed(throttle, 1.5, answers=MIN_ANSWERS - 1)
    assert throttle.ceiling(32) == 24, "too few answers since the last verdict"


def test_it_never_exceeds_the_capacity_in_force() -> None:
    clock = Clock()
    throttle = Throttle(32, now=clock)
    feed(throttle, 0.5)
    assert throttle.ceiling(12) == 12


def test_it_lifts_when_no_critical_answer_finished_within_the_horizon() -> None:
    clock = Clock()
    throttle = Throttle(32, now=clock)
    feed(throttle, 1.5)
    assert throttle.ceiling(32) == 24
    clock.at += HORIZON_SECONDS + 0.1
    assert throttle.ceiling(32) is None
    feed(throttle, 0.9)
    assert throttle.ceiling(32) == 32, "back in force from capacity, not from the old cut"


def test_a_bad_run_share_is_refused() -> None:
    with pytest.raises(ValueError, match="run_share"):
        Throttle(32, run_share=0)


def test_a_dip_in_capacity_does_not_drag_the_throttle_down_with_it() -> None:
    clock = Clock()
    throttle = Throttle(32, now=clock)
    feed(throttle, 1.5)
    assert throttle.ceiling(32) == 24
    feed(throttle, 0.9)
    assert throttle.ceiling(12) == 12, "capacity binds while it is lower"
    feed(throttle, 0.9)
    assert throttle.ceiling(30) == 24, "and the throttle's own limit is back when it rises"
