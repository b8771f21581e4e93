"""The one source of time, so tests patch it instead of sleeping, and Lua gets `now` as an argument.

`now` is wall-clock time (it is stored and compared across processes); `monotonic` measures
intervals within one process (caches, pauses) and never jumps when the wall clock is set. Call
them through the module (`clock.now()`), never import the functions, so a patch reaches every caller.
"""

from __future__ import annotations

import time

# Scores count seconds from this epoch rather than 1970 so a double keeps sub-microsecond
# resolution in the sorted-set score (see shared/scoring.py).
SCORE_EPOCH = 1_704_067_200.0  # 2024-01-01T00:00:00Z


def now() -> float:
    """Unix time in seconds."""
    return time.time()


def monotonic() -> float:
    """Seconds from an arbitrary start, for intervals within this process."""
    return time.monotonic()
