"""The one backoff curve: a doubling ceiling up to the cap, each wait drawn from all of [0, ceiling]."""

from __future__ import annotations

import random

import pytest

from shared import backoff


def test_the_ceiling_doubles_from_base_to_the_cap() -> None:
    assert [backoff.ceiling(n, 0.5, 3.0) for n in range(0, 6)] == [0.5, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_full_jitter_spreads_waits_over_the_whole_interval() -> None:
    rng = random.Random(7)
    waits = [backoff.full_jitter(4, 1.0, 30.0, rng) for _ in range(2000)]
    assert all(0 <= w <= 8.0 for w in waits)
    assert min(waits) < 0.5 and max(waits) > 7.5, "full jitter, not equal jitter's [ceiling/2, ceiling]"
    assert 3.6 < sum(waits) / len(waits) < 4.4


def test_a_negative_base_or_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="base=-1"):
        backoff.ceiling(1, -1, 1)
