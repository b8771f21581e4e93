"""The batch-limit formula and the sizer's behaviour at the KV watermark (no I/O)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.batch_sizer import WAITING_SAMPLES, BatchSizer, SizerInputs, memory_limit
from worker.model_spec import ModelSpec
from worker.vllm_metrics import VllmMetrics

KV_BYTES = ModelSpec().kv_bytes_per_token
GIB = 1024**3


def metrics(usage: float, *, blocks: int = 1000, running: int = 0, waiting: int = 0) -> VllmMetrics:
    return VllmMetrics(
        kv_usage=usage,
        num_gpu_blocks=blocks,
        block_size=16,
        running=running,
        waiting=waiting,
        preemptions=0,
    )


def sample(free: int | None = None, vllm: VllmMetrics | None = None, inflight: int = 0) -> SizerInputs:
    return SizerInputs(
        gpu_free_bytes=free,
        gpu_total_bytes=80 * GIB if free is not None else None,
        vllm=vllm,
        own_inflight=inflight,
        own_reserved_tokens=0,
    )


def test_memory_limit_is_the_issue_formula() -> None:
    per_ticket = 768 * KV_BYTES  # 384 MiB
    assert memory_limit(8 * GIB, per_ticket, 0.15, 32) == int(8 * GIB * 0.85 // per_ticket) == 18
    assert memory_limit(100 * GIB, per_ticket, 0.15, 32) == 32
    assert memory_limit(0, per_ticket, 0.15, 32) == 1
    assert memory_limit(-5, per_ticket, 0.15, 32) == 1


@given(
    free=st.integers(min_value=-(2**40), max_value=2**42),
    per_ticket=st.integers(min_value=1, max_value=2**34),
    margin=st.floats(min_value=0, max_value=0.99),
    max_batch=st.integers(min_value=1, max_value=256),
)
def test_memory_limit_stays_within_one_and_max_batch(
    free: int, per_ticket: int, margin: float, max_batch: int
) -> None:
    assert 1 <= memory_limit(free, per_ticket, margin, max_batch) <= max_batch


@given(
    samples=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(min_value=0, max_value=80 * GIB)),
            st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
            st.integers(min_value=0, max_value=64),
            st.integers(min_value=0, max_value=64),
        ),
        min_size=1,
        max_size=30,
    ),
    costs=st.lists(st.integers(min_value=1, max_value=40_000), max_size=20),
)
def test_sizer_limit_never_leaves_one_to_32(
    samples: list[tuple[int | None, float | None, int, int]], costs: list[int]
) -> None:
    sizer = BatchSizer(kv_bytes_per_token=KV_BYTES)
    for cost in costs:
        sizer.observe(cost)
    for free, usage, running, waiting in samples:
        vllm = None if usage is None else metrics(usage, running=running, waiting=waiting)
        decision = sizer.update(sample(free, vllm, inflight=running))
        assert 1 <= decision.limit <= 32
        assert sizer.limit == decision.limit


def test_memory_bounds_the_count_and_the_kv_cache_the_tokens() -> None:
    sizer = BatchSizer(kv_bytes_per_token=KV_BYTES)
    for _ in range(10):
        sizer.observe(1000)
    # Memory: 4 GiB × 0.85 / (1000 × 512 KiB) = 6 tickets; the cache decides in tokens, not a count.
    decision = sizer.update(sample(4 * GIB, metrics(0.5, blocks=1000)))
    assert (decision.memory_limit, decision.engine_cap, decision.limit) == (6, None, 6)
    assert "free GPU memory" in decision.reason and sizer.bound == "memory"
    decision = sizer.update(sample(40 * GIB, metrics(0.5, blocks=1000)))
    assert decision.limit == 32 and sizer.bound == "max_batch"
    assert sizer.token_budget(0) == int(8000 * 0.85)


def test_limit_shrinks_while_kv_is_above_the_watermark_and_grows_back_gradually() -> None:
    sizer = BatchSizer(kv_bytes_per_token=KV_BYTES, kv_high_watermark=0.85)
    sizer.observe(100)
    assert sizer.update(sample(None, metrics(0.1, blocks=100_000))).limit == 32
    shrinking = [
        sizer.update(sample(None, metrics(0.9, blocks=100_000), inflight=32)).limit for _ in range(12)
    ]
    assert shrinking == sorted(shrinking, reverse=True)
    assert shrinking[0] < 32
    assert shrinking[-1] == 1
    growing = [sizer.update(sample(None, metrics(0.2, blocks=100_000))).limit for _ in range(12)]
    assert growing == sorted(growing)
    assert growing[0] < 32 and growing[-1] == 32


def test_waiting_requests_inside_vllm_cap_the_limit_at_what_vllm_runs() -> None:
    sizer = BatchSizer(kv_bytes_per_token=KV_BYTES)
    sizer.observe(100)
    queueing = metrics(0.3, blocks=100_000, running=4, waiting=6)
    decisions = [sizer.update(sample(None, queueing, inflight=10)).limit for _ in range(WAITING_SAMPLES)]
    assert decisions[-1] == 4
    assert all(limit == 32 for limit in decisions[:-1])  # before the streak is long enough


def test_waiting_seen_in_one_sample_only_leaves_the_limit_alone() -> None:
    """vLLM reports a few waiting requests at step boundaries; single samples must not swing the limit."""
    sizer = BatchSizer(kv_bytes_per_token=KV_BYTES)
    sizer.observe(100)
    limits = []
    for i in range(10):
        waiting = 6 if i % 2 == 0 else 0
        vllm = metrics(0.3, blocks=100_000, running=9, waiting=waiting)
        limits.append(sizer.update(sample(None, vllm, inflight=12)).limit)
    assert limits == [32] * 10


def test_token_budget_counts_what_was_claimed_and_what_left_since_the_sample() -> None:
    sizer = BatchSizer(kv_bytes_per_token=KV_BYTES, safety_margin=0.15)
    assert sizer.token_budget(0) is None  # no vLLM figures yet: no budget
    sizer.update(
        SizerInputs(
            gpu_free_bytes=None,
            gpu_total_bytes=None,
            vllm=metrics(0.5, blocks=1000),
            own_inflight=2,
            own_reserved_tokens=500,
        )
    )
    # 8000 free tokens × 0.85 = 6800, less the 1500 claimed since the sample.
    assert sizer.token_budget(2000) == 6800 - 1500
    assert sizer.token_budget(400) == 6800 + 100, "a departure's tokens are credited at once"


def test_average_ticket_size_follows_recent_tickets() -> None:
    sizer = BatchSizer(kv_bytes_per_token=KV_BYTES, initial_ticket_tokens=700)
    assert sizer.per_ticket_tokens() == 700
    for cost in (100, 300):
        sizer.observe(cost)
    assert sizer.per_ticket_tokens() == 200
