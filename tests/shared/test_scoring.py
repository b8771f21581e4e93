"""The ordering rule: priority first, FIFO among equals, aging bounds every wait."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.policy import Policy
from shared.scoring import effective_priority, queue_score


def test_contract_examples(policy: Policy) -> None:
    assert effective_priority(policy.types["loan_approval"], urgent_level=3) == -0.3
    assert effective_priority(policy.types["complaint"], vip_level=2) == 0.9
    assert effective_priority(policy.types["archive_query"], is_bulk=True) == 2.2
    assert effective_priority(policy.types["archive_query"]) == 2.0


priorities = st.floats(min_value=-5, max_value=5, allow_nan=False).map(lambda p: round(p, 2))
arrivals = st.floats(min_value=1.75e9, max_value=1.85e9, allow_nan=False)
waits = st.floats(min_value=0, max_value=86_400, allow_nan=False)


def wait_rank(priority: float, waited_seconds: float, aging_seconds: float) -> float:
    """The contract's aging, as an operator reads it: one point is worth `aging_seconds` of waiting."""
    if aging_seconds <= 0:
        return priority
    return priority - waited_seconds / aging_seconds


@given(p_a=priorities, p_b=priorities, e_a=arrivals, wait=waits, aging=st.sampled_from([0.0, 10.0, 60.0]))
def test_static_score_orders_like_aged_priority(
    p_a: float, p_b: float, e_a: float, wait: float, aging: float
) -> None:
    """Lower score ⇔ lower aged priority at any moment: the sorted set never needs rescoring."""
    e_b = e_a + wait
    now = e_b + 1.0
    score_a, score_b = queue_score(p_a, e_a, aging), queue_score(p_b, e_b, aging)
    rank_a, rank_b = wait_rank(p_a, now - e_a, aging), wait_rank(p_b, now - e_b, aging)
    if abs(rank_a - rank_b) > 1e-6 and abs(score_a - score_b) > 1e-3:
        assert (score_a < score_b) == (rank_a < rank_b)


@given(
    p=priorities,
    e=arrivals,
    gap=st.floats(min_value=1e-5, max_value=3600),
    aging=st.sampled_from([0.0, 60.0]),
)
def test_equal_priority_is_fifo(p: float, e: float, gap: float, aging: float) -> None:
    assert queue_score(p, e, aging) < queue_score(p, e + gap, aging)


@given(p_a=priorities, p_b=priorities, e_a=arrivals, e_b=arrivals)
def test_strict_mode_priority_dominates_any_realistic_wait(
    p_a: float, p_b: float, e_a: float, e_b: float
) -> None:
    if abs(e_a - e_b) < 7 * 86_400 and p_a < p_b:
        assert queue_score(p_a, e_a, 0) < queue_score(p_b, e_b, 0)


def test_archive_overtakes_fresh_loan_after_twice_aging(policy: Policy) -> None:
    aging = policy.queue.aging_seconds
    archive = queue_score(effective_priority(policy.types["archive_query"]), 1.8e9, aging)
    early_loan = queue_score(effective_priority(policy.types["loan_approval"]), 1.8e9 + 2 * aging - 1, aging)
    late_loan = queue_score(effective_priority(policy.types["loan_approval"]), 1.8e9 + 2 * aging + 1, aging)
    assert early_loan < archive < late_loan
