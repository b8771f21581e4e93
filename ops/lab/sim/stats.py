"""Counters and histograms one engine accumulates, read by the Prometheus collector at scrape time.

The engine advances many identical decode steps at once, so a histogram here can record one value many
times in a single call; prometheus_client's Histogram cannot, and observing token by token would cost
Python work per generated token.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field

# Bucket bounds as vLLM's metrics module declares them, so dashboards built for vLLM read these alike.
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass
class Histogram:
    """Cumulative-on-read bucket counts with a running sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        if times <= 0:
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def observe_series(self, first: float, step: float, times: int) -> None:
        """Observe `first`, `first + step`, ... (`times` values, `step` >= 0) without a loop over them."""
        if times <= 0:
            return
        if step <= 0:
            self.observe(first, times)
            return
        placed = 0
        for index, bound in enumerate(self.bounds):
            # Values up to `bound` land in this bucket or an earlier one.
            upto = 0 if bound < first else min(times, math.floor((bound - first) / step) + 1)
            self.counts[index] += upto - placed
            placed = upto
        self.counts[-1] += times - placed
        self.total += first * times + step * times * (times - 1) / 2
        self.count += times

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs ending with +Inf, as the exposition format wants them."""
        running = 0
        pairs: list[tuple[str, float]] = []
        for bound, bucket in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += bucket
            pairs.append((bound, float(running)))
        return pairs


@dataclass
class EngineStats:
    """What one simulated GPU has done since start; latencies in model seconds."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    aborted: int = 0
    oom_crashes: int = 0
    finished: Counter[str] = field(default_factory=Counter)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
