"""The one source of wall-clock time, so tests can patch it and Lua gets `now` as an argument."""

from __future__ import annotations

import time

# Scores count seconds from this epoch rather than 1970 so a double keeps sub-microsecond
# resolution in the sorted-set score (see shared/scoring.py).
SCORE_EPOCH = 1_704_067_200.0  # 2024-01-01T00:00:00Z


def now() -> float:
    """Unix time in seconds."""
    return time.time()
