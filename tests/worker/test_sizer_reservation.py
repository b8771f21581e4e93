"""The sizer counts its own tickets at full size, so answers still to be written cannot overrun the
KV cache (the overload benchmark's crash-on-OOM simulator crashed when free blocks alone were trusted)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.batch_sizer import BatchSizer, SizerInputs, reserved_kv_limit
from worker.model_spec import ModelSpec
from worker.vllm_metrics import VllmMetrics

CAPACITY_BLOCKS = 2000  # 32 000 tokens of 16


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
    for _ in range(10):
        sizer.observe(1100)
    # 20 tickets just prefilled: 40% of the cache in use, but each may still write its answer.
    decision = sizer.update(inputs(0.4, inflight=20, reserved=20 * 1100))
    # Free blocks alone: 20 + 19 200 × 0.85 // 1100 = 34 -> 32. Reserved: 27 200 - 22 000 = 5 200 -> +4.
    assert decision.kv_limit == 24 and decision.limit == 24
    assert sizer.token_budget(20 * 1100) == 27_200 - 22_000
    assert sizer.token_budget(26_000) == 1_200


def test_without_a_cache_size_the_free_block_view_still_applies() -> None:
    sizer = BatchSizer(kv_bytes_per_token=ModelSpec().kv_bytes_per_token)
    vllm = VllmMetrics(
        kv_usage=0.5, num_gpu_blocks=None, block_size=None, running=0, waiting=0, preemptions=0
    )
    decision = sizer.update(SizerInputs(None, None, vllm, own_inflight=3, own_reserved_tokens=90_000))
    assert decision.kv_limit is None and decision.limit == 32
    assert sizer.token_budget(0) is None


@given(
    reserved=st.integers(min_value=0, max_value=60_000),
    inflight=st.integers(min_value=0, max_value=40),
    per_ticket=st.integers(min_value=1, max_value=20_000),
)
def test_tickets_added_by_the_reserved_limit_fit_within_the_margin(
    reserved: int, inflight: int, per_ticket: int
) -> None:
    limit = reserved_kv_limit(32_000, reserved, per_ticket, 0.15, inflight, 1024)
    added = max(limit - inflight, 0)
    if added > 0 and limit > 1:
        assert reserved + added * per_ticket <= 32_000 * 0.85
