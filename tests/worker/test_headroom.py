"""The share of a worker's batch and KV budget kept for critical ticket types."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.headroom import CriticalHeadroom


def test_a_fifth_of_the_slots_and_at_least_one_are_kept() -> None:
    headroom = CriticalHeadroom(share=0.2)
    assert headroom.slots(30) == 6
    assert headroom.slots(4) == 1  # 0.8 rounds up to the minimum of one
    assert headroom.slots(2) == 1
    assert headroom.slots(1) == 0  # a single slot is never reserved: other work must still flow


def test_split_counts_everything_in_flight_against_the_normal_share() -> None:
    shares = CriticalHeadroom(share=0.2).split(limit=10, running=7, budget=5_000, usable_kv_tokens=20_000)
    assert (shares.count, shares.normal_count) == (3, 1)
    assert (shares.budget, shares.normal_budget) == (5_000, 1_000)
    full = CriticalHeadroom(share=0.2).split(limit=10, running=9, budget=3_000, usable_kv_tokens=20_000)
    assert (full.count, full.normal_count, full.normal_budget) == (1, 0, 0)


def test_no_budget_and_no_share_leave_the_claim_as_it_was() -> None:
    none = CriticalHeadroom(share=0.0).split(limit=8, running=3, budget=4_000, usable_kv_tokens=20_000)
    assert (none.count, none.normal_count, none.budget, none.normal_budget) == (5, 5, 4_000, 4_000)
    unknown = CriticalHeadroom(share=0.2).split(limit=8, running=3, budget=0, usable_kv_tokens=None)
    assert (unknown.budget, unknown.normal_budget) == (0, 0)


@pytest.mark.parametrize("share", [-0.1, 1.0, 1.5])
def test_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="share="):
        CriticalHeadroom(share=share)


@given(
    limit=st.integers(min_value=1, max_value=256),
    running=st.integers(min_value=0, max_value=300),
    share=st.floats(min_value=0, max_value=0.99),
    budget=st.integers(min_value=0, max_value=100_000),
    usable=st.integers(min_value=0, max_value=100_000),
)
def test_the_normal_share_never_exceeds_the_whole(
    limit: int, running: int, share: float, budget: int, usable: int
) -> None:
    shares = CriticalHeadroom(share=share).split(limit, running, budget, usable)
    assert 0 <= shares.normal_count <= shares.count
    assert 0 <= shares.normal_budget <= shares.budget
    if running == 0:
        assert shares.normal_count >= 1  # an idle worker always takes the head, whatever its type
