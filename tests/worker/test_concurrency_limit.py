"""The adaptive concurrency limit on synthetic latency traces."""

from __future__ import annotations

import pytest

from worker.concurrency_limit import ConcurrencyLimit, LimiterSettings

BASE_TPOT = 0.02
BASE_PREFILL = 0.0005


def feed(limiter: ConcurrencyLimit, answers: int, tpot: float, prefill: float = BASE_PREFILL) -> list[int]:
    out = []
    for _ in range(answers):
        limiter.observe(tpot_seconds=tpot, ttft_per_prompt_token=prefill)
        out.append(limiter.limit)
    return out


def test_steady_latency_keeps_the_limit_at_its_ceiling() -> None:
    limiter = ConcurrencyLimit(LimiterSettings(max_limit=32))
    assert feed(limiter, 300, BASE_TPOT)[-1] == 32
    assert limiter.changes == 0


def test_twice_the_per_token_time_shrinks_the_limit_within_the_short_window() -> None:
    settings = LimiterSettings(max_limit=32, short_window=8)
    limiter = ConcurrencyLimit(settings)
    feed(limiter, 100, BASE_TPOT)
    shrinking = feed(limiter, settings.short_window, 2 * BASE_TPOT)
    assert shrinking[-1] <= 24, shrinking
    assert shrinking == sorted(shrinking, reverse=True)
    held = feed(limiter, 40, 2 * BASE_TPOT)
    assert held[-1] <= 16 and held[-1] >= settings.min_limit


def test_a_slow_prefill_alone_shrinks_it_too() -> None:
    limiter = ConcurrencyLimit(LimiterSettings(max_limit=32))
    feed(limiter, 100, BASE_TPOT)
    assert feed(limiter, 8, BASE_TPOT, prefill=3 * BASE_PREFILL)[-1] <= 24


def test_it_grows_back_when_latency_falls_and_never_leaves_its_bounds() -> None:
    settings = LimiterSettings(min_limit=2, max_limit=32)
    limiter = ConcurrencyLimit(settings)
    feed(limiter, 100, BASE_TPOT)
    assert feed(limiter, 200, 10 * BASE_TPOT)[-1] == settings.min_limit
    recovered = feed(limiter, 60, BASE_TPOT)
    assert recovered[-1] == 32
    assert all(settings.min_limit <= value <= 32 for value in recovered)


def test_noise_within_the_tolerance_does_not_move_it() -> None:
    limiter = ConcurrencyLimit(LimiterSettings(max_limit=32, tolerance=1.25))
    for i in range(400):
        limiter.observe(tpot_seconds=BASE_TPOT * (1.1 if i % 2 else 0.9), ttft_per_prompt_token=None)
    assert limiter.limit == 32


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="long_window"):
        LimiterSettings(short_window=10, long_window=10)


def test_a_twofold_rise_shrinks_it_within_the_short_window_and_its_end_grows_it_back() -> None:
    settings = LimiterSettings(max_limit=32, short_window=8)
    limiter = ConcurrencyLimit(settings)
    feed(limiter, 100, BASE_TPOT)
    assert feed(limiter, settings.short_window, 2 * BASE_TPOT)[-1] < 32
    shrunk = feed(limiter, 20, 2 * BASE_TPOT)[-1]
    recovered = feed(limiter, 60, BASE_TPOT)
    assert recovered[-1] == 32 > shrunk
    assert recovered == sorted(recovered), "it grows back steadily, without dips"


def test_answers_count_by_their_tokens_so_a_few_short_slow_ones_do_not_shrink_it() -> None:
    # Short answers that shared their steps with a long prefill see several times the per-token
    # time; a full batch's long answers, at the baseline, outweigh them.
    settings = LimiterSettings(max_limit=32, short_window=8)
    weighted, unweighted = ConcurrencyLimit(settings), ConcurrencyLimit(settings)
    for limiter in (weighted, unweighted):
        feed(limiter, 100, BASE_TPOT)
    for _ in range(20):
        for tpot, tokens in ((BASE_TPOT, 500), (BASE_TPOT, 500), (5 * BASE_TPOT, 20)):
            weighted.observe(tpot_seconds=tpot, ttft_per_prompt_token=BASE_PREFILL, output_tokens=tokens)
            unweighted.observe(tpot_seconds=tpot, ttft_per_prompt_token=BASE_PREFILL)
    assert weighted.limit == 32
    assert unweighted.limit < 16, "without the weights the same answers read as congestion"
    # A long answer that is slow is heard at once.
    weighted.observe(tpot_seconds=3 * BASE_TPOT, ttft_per_prompt_token=BASE_PREFILL, output_tokens=5000)
    assert weighted.limit < 32
