"""The token budget counts the worker's own tickets at full size, so answers still to be written
cannot overrun the KV cache (the overload benchmark's crash-on-OOM simulator crashed when free
blocks alone were trusted)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.batch_sizer import BatchSizer, SizerInputs
from worker.model_spec import ModelSpec
from worker.vllm_metrics import VllmMetrics

CAPACITY_BLOCKS = 2000  # 32 000 tokens of 16
USABLE = int(32_000 * 0.85)


def inputs(usage: float, inflight: int, reserved: int) -> SizerInputs:
    vllm = VllmMetrics(
        kv_usage=usage,
        num_gpu_blocks=CAPACITY_BLOCKS,
        block_size=16,
        running=inflight,
        waiting=0,
        preemptions=0,
    )
    return SizerInputs(
        gpu_free_bytes=None,
        gpu_total_bytes=None,
        vllm=vllm,
        own_inflight=inflight,
        own_reserved_tokens=reserved,
    )


def test_running_tickets_that_will_grow_leave_less_room_than_the_free_blocks_show() -> None:
    sizer = BatchSizer(kv_bytes_per_token=ModelSpec().kv_bytes_per_token, safety_margin=0.15)
    # 20 tickets just prefilled: 40% of the cache in use, but each may still write its answer.
    decision = sizer.update(inputs(0.4, inflight=20, reserved=20 * 1100))
    assert decision.limit == 32, "the count is memory's and max_batch's; the cache decides in tokens"
    # Free blocks alone: 19 200 × 0.85 = 16 320. Counted at full size: 27 200 - 22 000 = 5 200.
    assert sizer.token_budget(20 * 1100) == USABLE - 22_000
    assert sizer.token_budget(26_000) == 1_200


def test_without_a_cache_size_there_is_no_budget() -> None:
    sizer = BatchSizer(kv_bytes_per_token=ModelSpec().kv_bytes_per_token)
    vllm = VllmMetrics(
        kv_usage=0.5, num_gpu_blocks=None, block_size=None, running=0, waiting=0, preemptions=0
    )
    decision = sizer.update(SizerInputs(None, None, vllm, own_inflight=3, own_reserved_tokens=90_000))
    assert decision.limit == 32
    assert sizer.token_budget(0) is None


@given(
    at_sample=st.integers(min_value=0, max_value=40_000),
    usage=st.floats(min_value=0, max_value=1),
    claimed=st.lists(st.integers(min_value=1, max_value=4_000), max_size=20),
    left=st.integers(min_value=0, max_value=40_000),
)
def test_whatever_claims_and_departures_follow_a_sample_the_reservations_fit_the_margin(
    at_sample: int, usage: float, claimed: list[int], left: int
) -> None:
    """Claims taken within the budget, with departures credited, never reserve more than the cache
    less its margin."""
    sizer = BatchSizer(kv_bytes_per_token=ModelSpec().kv_bytes_per_token, safety_margin=0.15)
    sizer.update(inputs(usage, inflight=1, reserved=at_sample))
    reserved = max(at_sample - left, 0)
    for cost in claimed:
        budget = sizer.token_budget(reserved)
        assert budget is not None
        if cost <= budget:
            reserved += cost
            assert reserved <= USABLE
