"""The in-flight limit as one decision: memory and latency together, the critical share of the
result, the prefill guard, and the latencies that feed the adaptive limit."""

from __future__ import annotations

import logging

import pytest

from tests.worker.support import completion
from worker.batch_sizer import BatchSizer, SizerInputs
from worker.concurrency_limit import ConcurrencyLimit, LimiterSettings
from worker.headroom import CriticalHeadroom
from worker.inflight_limit import InflightLimit, adaptive_limiter, answer_latency, engine_latency
from worker.vllm_metrics import VllmMetrics, parse_metrics

MAX_BATCH = 16


def limits(prefill_guard_tokens: int = 0, headroom: float = 0.25) -> InflightLimit:
    sizer = BatchSizer(kv_bytes_per_token=1, max_batch=MAX_BATCH)
    settings = LimiterSettings(min_limit=2, max_limit=MAX_BATCH)
    return InflightLimit(
        sizer=sizer,
        headroom=CriticalHeadroom(share=headroom),
        adaptive=ConcurrencyLimit(settings),
        engine_adaptive=ConcurrencyLimit(settings),
        prefill_guard_tokens=prefill_guard_tokens,
    )


def test_one_answer_gives_its_time_per_token_and_its_first_token_per_prompt_token() -> None:
    tpot, per_prompt = answer_latency(completion(ttft=0.2, tpot=0.02, prompt=400, tokens=101))
    assert tpot == pytest.approx(0.02) and per_prompt == pytest.approx(0.0005)
    assert answer_latency(completion(ttft=0.2, tpot=0.02, tokens=1))[0] is None
    assert answer_latency(completion(ttft=0.2, tpot=0.02, prompt=40))[1] is None, "too short to say"


def test_slower_answers_lower_the_limit_below_the_sizer_and_the_change_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = limits()
    assert limit.limit == MAX_BATCH == limit.sizer.limit
    for _ in range(50):
        limit.observe_answer(completion(ttft=0.2, tpot=0.02))
    with caplog.at_level(logging.INFO, logger="worker.inflight_limit"):
        for _ in range(16):
            limit.observe_answer(completion(ttft=0.4, tpot=0.04))
    assert limit.limit == limit.adaptive_limit and limit.limit < MAX_BATCH
    changes = [r for r in caplog.records if getattr(r, "event", None) == "concurrency_limit"]
    assert changes and changes[-1].concurrency_limit == limit.limit  # type: ignore[attr-defined]
    assert all(r.previous_limit > r.concurrency_limit for r in changes)  # type: ignore[attr-defined]


def test_the_smaller_of_memory_and_latency_wins() -> None:
    limit = limits()
    limit.sizer.update(SizerInputs(200, 400, None, own_inflight=0, own_reserved_tokens=0))
    assert limit.limit == limit.sizer.limit < MAX_BATCH == limit.adaptive_limit


def test_the_adaptive_limit_bounds_the_others_and_memory_alone_bounds_critical_tickets() -> None:
    limit = limits(headroom=0.25)
    for _ in range(50):
        limit.observe_answer(completion(ttft=0.2, tpot=0.02))
    for _ in range(40):
        limit.observe_answer(completion(ttft=0.4, tpot=0.04))
    shrunk = limit.limit
    assert shrunk < MAX_BATCH == limit.critical_limit
    kept = CriticalHeadroom(share=0.25).slots(shrunk)
    idle = limit.shares(limit.critical_limit, 0, None, 0)
    assert (idle.count, idle.normal_count) == (MAX_BATCH, shrunk - kept)
    # The others' share is full, and so is the adaptive limit: a burst of loans still starts.
    full = limit.shares(limit.critical_limit, shrunk, None, 0)
    assert (full.count, full.normal_count) == (MAX_BATCH - shrunk, 0)
    # Memory bounds everyone: a smaller sizer limit is the critical tickets' limit too.
    limit.sizer.update(SizerInputs(200, 400, None, own_inflight=0, own_reserved_tokens=0))
    assert limit.critical_limit == limit.sizer.limit < MAX_BATCH


def test_the_prefill_guard_bounds_prompts_in_prefill_and_lets_one_long_prompt_through() -> None:
    limit = limits(prefill_guard_tokens=8000, headroom=0)
    idle = limit.shares(MAX_BATCH, 0, None, prefill_tokens=0)
    assert idle.normal_prompt_budget == 8000 and idle.normal_prompt_first_over
    busy = limit.shares(MAX_BATCH, 3, None, prefill_tokens=6000)
    assert busy.normal_prompt_budget == 2000 and not busy.normal_prompt_first_over
    full = limit.shares(MAX_BATCH, 3, None, prefill_tokens=8000)
    assert full.normal_count == 0 and full.count == MAX_BATCH - 3, "critical tickets still fit"
    off = limits(prefill_guard_tokens=0).shares(MAX_BATCH, 3, None, prefill_tokens=10**6)
    assert off.normal_prompt_budget == 0 and off.normal_count > 0


def test_the_adaptive_limit_floor_keeps_a_quarter_of_the_batch() -> None:
    limiter = adaptive_limiter(32)
    for _ in range(100):
        limiter.observe(tpot_seconds=0.02, ttft_per_prompt_token=None)
    for _ in range(300):
        limiter.observe(tpot_seconds=0.5, ttft_per_prompt_token=None)
    assert limiter.limit == 8
    assert adaptive_limiter(1).limit == 1


EXPOSITION = """
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0"}} 4.0
# HELP vllm:prompt_tokens Number of prefill tokens processed.
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{engine="0"}} {prompts}
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf"}} {requests}
vllm:time_to_first_token_seconds_count{{engine="0"}} {requests}
vllm:time_to_first_token_seconds_sum{{engine="0"}} {ttft}
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf"}} {tokens}
vllm:inter_token_latency_seconds_count{{engine="0"}} {tokens}
vllm:inter_token_latency_seconds_sum{{engine="0"}} {itl}
"""


def sample(*, prompts: float, requests: float, ttft: float, tokens: float, itl: float) -> VllmMetrics:
    text = EXPOSITION.format(prompts=prompts, requests=requests, ttft=ttft, tokens=tokens, itl=itl)
    return parse_metrics(text, engine="0")


def test_vllm_histograms_give_the_means_of_the_interval_between_two_samples() -> None:
    before = sample(prompts=10_000, requests=20, ttft=4.0, tokens=2_000, itl=40.0)
    after = sample(prompts=14_000, requests=30, ttft=6.0, tokens=3_000, itl=70.0)
    latency = engine_latency(before, after)
    assert latency is not None
    assert latency.tpot_seconds == pytest.approx(30.0 / 1_000)
    assert latency.ttft_per_prompt_token == pytest.approx(2.0 / 4_000)
    assert engine_latency(None, after) is None
    assert engine_latency(after, after) is None, "nothing happened in between: nothing to say"


def test_answers_and_vllm_on_different_clocks_are_each_judged_by_their_own_baseline() -> None:
    """A simulator's histograms run on its simulated clock: four times the worker's at time scale 4."""
    limit = limits()
    tokens, itl = 0.0, 0.0
    for _ in range(30):
        for _ in range(10):
            limit.observe_answer(completion(ttft=0.05, tpot=0.002))
        tokens, itl = tokens + 500, itl + 500 * 0.008
        limit.observe_engine(sample(prompts=0, requests=0, ttft=0, tokens=tokens, itl=itl))
    assert limit.limit == MAX_BATCH


def test_an_engine_slowing_down_lowers_the_limit_between_answers() -> None:
    limit = limits()
    tokens, itl = 0.0, 0.0
    for per_token in [0.02] * 60 + [0.05] * 16:
        tokens, itl = tokens + 500, itl + 500 * per_token
        limit.observe_engine(sample(prompts=0, requests=0, ttft=0, tokens=tokens, itl=itl))
    assert limit.limit < MAX_BATCH
