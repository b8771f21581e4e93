"""Critical answers against their SLO as the adaptive limit's judge: the verdicts, and the limit
they move while the per-token gradient would have held it at its floor."""

from __future__ import annotations

import pytest

from tests.worker.support import completion
from worker.batch_sizer import BatchSizer
from worker.concurrency_limit import ConcurrencyLimit, LimiterSettings
from worker.critical_pressure import HORIZON_SECONDS, CriticalPressure, Verdict
from worker.headroom import CriticalHeadroom
from worker.inflight_limit import InflightLimit
from worker.latency_guard import MIN_ANSWERS
from worker.vllm_client import Completion

SLO = 2.0
MAX_BATCH = 32


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answer(*, ttft: float = 0.1, tpot: float = 0.002, tokens: int = 101) -> Completion:
    return completion(ttft=ttft, tpot=tpot, tokens=tokens)


def test_a_verdict_waits_for_enough_answers_and_reads_their_90th_percentile() -> None:
    pressure = CriticalPressure(run_share=0.5)
    for _ in range(MIN_ANSWERS - 1):
        pressure.observe(run_seconds=0.5, slo_seconds=SLO)
        assert pressure.verdict() is None
    pressure.observe(run_seconds=0.5, slo_seconds=SLO)
    verdict = pressure.verdict()
    assert verdict is not None and verdict.pressure == pytest.approx(0.5) and verdict.grow
    assert pressure.verdict() is None, "the next verdict needs new answers"
    for run in [0.5] * 4 + [1.5] * 4:
        pressure.observe(run_seconds=run, slo_seconds=SLO)
    over = pressure.verdict()
    assert over is not None and over.pressure == pytest.approx(1.5) and over.shrink
    # After a verdict to shrink, the slow answers before it no longer count.
    for _ in range(MIN_ANSWERS):
        pressure.observe(run_seconds=0.9, slo_seconds=SLO)
    held = pressure.verdict()
    assert held is not None and held.pressure == pytest.approx(0.9)
    assert not held.grow and not held.shrink


def test_each_answer_counts_against_its_own_types_slo() -> None:
    pressure = CriticalPressure(run_share=0.5)
    for _ in range(MIN_ANSWERS):
        pressure.observe(run_seconds=3.0, slo_seconds=10.0)
    verdict = pressure.verdict()
    assert verdict is not None and verdict.pressure == pytest.approx(0.6)


def test_critical_answers_stop_judging_once_none_finished_within_the_horizon() -> None:
    clock = Clock()
    pressure = CriticalPressure(clock=clock)
    assert not pressure.flowing
    pressure.observe(run_seconds=0.5, slo_seconds=SLO)
    clock.now += HORIZON_SECONDS
    assert pressure.flowing
    clock.now += 0.1
    assert not pressure.flowing


def test_bad_run_share_names_the_field() -> None:
    with pytest.raises(ValueError, match="run_share"):
        CriticalPressure(run_share=0)


def test_a_verdict_shrinks_from_what_memory_allows_grows_by_one_and_holds_between() -> None:
    limiter = ConcurrencyLimit(LimiterSettings(min_limit=8, max_limit=MAX_BATCH))
    assert limiter.limit == MAX_BATCH
    # The sizer allows 20: a quarter less than 20, not than 32, so the first verdict bites.
    assert limiter.apply_verdict(Verdict(1.4), ceiling=20) == 15
    assert limiter.apply_verdict(Verdict(0.9), ceiling=20) is None
    assert limiter.apply_verdict(Verdict(0.5), ceiling=20) == 16
    # Memory binds below the adaptive limit: growing it would say nothing, so it stays.
    assert limiter.apply_verdict(Verdict(0.5), ceiling=12) is None and limiter.limit == 16
    for _ in range(10):
        limiter.apply_verdict(Verdict(3.0), ceiling=20)
    assert limiter.limit == 8, "never below its floor"
    for _ in range(40):
        limiter.apply_verdict(Verdict(0.1), ceiling=MAX_BATCH)
    assert limiter.limit == MAX_BATCH, "never above max_batch"


def limits(clock: Clock) -> InflightLimit:
    settings = LimiterSettings(min_limit=8, max_limit=MAX_BATCH)
    return InflightLimit(
        sizer=BatchSizer(kv_bytes_per_token=1, max_batch=MAX_BATCH),
        headroom=CriticalHeadroom(share=0.2),
        adaptive=ConcurrencyLimit(settings),
        pressure=CriticalPressure(clock=clock),
    )


def test_slower_tokens_do_not_lower_the_limit_while_critical_answers_have_time_to_spare() -> None:
    clock = Clock()
    limit = limits(clock)
    for _ in range(60):
        limit.observe_answer(answer())
    # A fuller batch: every token three times slower, yet loans run in 40% of their allowance.
    for _ in range(200):
        limit.observe_answer(answer(tpot=0.006, tokens=51), critical_slo_seconds=SLO)
        limit.observe_answer(answer(tpot=0.006, tokens=301))
    assert limit.adaptive_limit == MAX_BATCH
    # Without the judge the same trace holds it at its floor.
    gradient_only = InflightLimit(
        sizer=BatchSizer(kv_bytes_per_token=1, max_batch=MAX_BATCH),
        headroom=CriticalHeadroom(share=0.2),
        adaptive=ConcurrencyLimit(LimiterSettings(min_limit=8, max_limit=MAX_BATCH)),
    )
    for _ in range(60):
        gradient_only.observe_answer(answer())
    for _ in range(200):
        gradient_only.observe_answer(answer(tpot=0.006, tokens=51), critical_slo_seconds=SLO)
        gradient_only.observe_answer(answer(tpot=0.006, tokens=301))
    assert gradient_only.adaptive_limit == 8


def test_critical_answers_past_their_allowance_lower_it_though_tokens_keep_their_pace() -> None:
    clock = Clock()
    limit = limits(clock)
    for _ in range(60):
        limit.observe_answer(answer())
    for _ in range(MIN_ANSWERS):
        # At the baseline's pace per token, but long: 1.5 times the allowance.
        limit.observe_answer(answer(ttft=0.1, tokens=701), critical_slo_seconds=SLO)
    assert limit.adaptive_limit == int(MAX_BATCH * 0.75)
    # Once no critical answer finished within the horizon, the per-token gradient decides again:
    # tokens at their baseline pace let it grow back.
    clock.now += HORIZON_SECONDS + 1
    for _ in range(40):
        limit.observe_answer(answer())
    assert limit.adaptive_limit == MAX_BATCH
