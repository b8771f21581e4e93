"""Exponential backoff with full jitter: the one curve every retry and pause in tidegate follows.

After the n-th failure in a row the ceiling is `min(cap, base × 2^(n−1))`, and the wait is drawn
uniformly from [0, ceiling] ("full jitter"). Waiters that failed together (every worker when one
vLLM crashed, every ticket of its batch) then spread over the whole interval instead of retrying in
step; equal jitter ([ceiling/2, ceiling]) keeps half of each wait fixed and so keeps them bunched.
A caller that must wait at least some time (a `Retry-After`) takes the larger of the two.
"""

from __future__ import annotations

import random


def ceiling(failures: int, base: float, cap: float) -> float:
    """The longest wait after `failures` failures in a row (the first waits up to `base`)."""
    if base < 0 or cap < 0:
        raise ValueError(f"backoff base={base} and cap={cap} must both be >= 0")
    return min(cap, base * 2.0 ** max(failures - 1, 0))


def full_jitter(failures: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """A wait drawn uniformly from [0, ceiling(failures, base, cap)]."""
    top = ceiling(failures, base, cap)
    return (rng or _RNG).uniform(0, top)


_RNG = random.Random()
