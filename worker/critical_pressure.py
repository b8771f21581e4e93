"""How close critical answers run to their SLO: the judge of the adaptive limit while they flow.

A fuller batch makes every token slower, so under load the per-token gradient reads every full
batch as congestion and holds the limit at its floor, leaving the GPU part idle while loans have
time to spare. What tidegate promises is critical answers within their SLO, so while critical
answers are finishing their run times decide instead: the 90th percentile of recent ones, as a
fraction of the share of each one's SLO the run may use (the latency guard's share; the rest is the
wait in Redis and the client's poll). Above 1 the limit shrinks; well below 1 it grows; in between
it holds. Each verdict is drawn from answers that ran under the limit the previous verdict left.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from worker.latency_guard import GROW_BELOW, MIN_ANSWERS, RECENT_CRITICAL_ANSWERS, RUN_SHARE

HORIZON_SECONDS = 10.0
"""Critical answers older than this say nothing of the batch now: with none newer, the per-token
gradient decides again."""


@dataclass(frozen=True)
class Verdict:
    pressure: float
    """p90 of recent critical run times over their allowance: 1 = at it."""

    @property
    def shrink(self) -> bool:
        return self.pressure > 1.0

    @property
    def grow(self) -> bool:
        return self.pressure < GROW_BELOW


class CriticalPressure:
    """Thread-safe: runner threads `observe` critical answers, the limit asks `verdict` and `flowing`."""

    def __init__(self, run_share: float = RUN_SHARE, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < run_share <= 1:
            raise ValueError(f"run_share={run_share} is not accepted; use 0 < share ≤ 1")
        self.run_share = run_share
        self._clock = clock
        self._lock = threading.Lock()
        self._recent: deque[float] = deque(maxlen=RECENT_CRITICAL_ANSWERS)
        self._new = 0
        self._last_at: float | None = None

    def observe(self, *, run_seconds: float, slo_seconds: float) -> None:
        """One critical answer: from the request to vLLM to its last token, against its type's SLO."""
        if slo_seconds <= 0:
            return
        with self._lock:
            self._recent.append(max(run_seconds, 0.0) / (slo_seconds * self.run_share))
            self._new += 1
            self._last_at = self._clock()

    @property
    def flowing(self) -> bool:
        """Whether a critical answer finished within the horizon (then its SLO judges the limit)."""
        with self._lock:
            return self._last_at is not None and self._clock() - self._last_at <= HORIZON_SECONDS

    def verdict(self) -> Verdict | None:
        """A verdict over the recent critical answers once enough finished since the last one; None
        until then. After a verdict to shrink only answers that run under the smaller limit count."""
        with self._lock:
            if self._new < MIN_ANSWERS or len(self._recent) < MIN_ANSWERS:
                return None
            self._new = 0
            ordered = sorted(self._recent)
            verdict = Verdict(ordered[int(0.9 * (len(ordered) - 1))])
            if verdict.shrink:
                self._recent.clear()
        return verdict
