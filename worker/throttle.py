"""The adaptive throttle: how many non-critical tickets may run beside critical ones.

A fuller batch makes every token slower. What tidegate promises is critical answers within their
SLO, so while critical answers are finishing their run times judge the batch: the 90th percentile
of recent ones, each over the share of its own type's SLO the run may use (the rest is the wait in
Redis and the client's poll). Above 1 the throttle cuts what is in force by a quarter; well within
its allowance it grows by a quarter of the distance to capacity (a sawtooth of one slot per verdict
held a surge's batch at half its slots) until it is back at three quarters of the ceiling its last
cut was made from, and from there a slot per verdict: the level where answers last ran late is
approached by probing, not leapt past (a leap there put loans past their SLO before the next verdict
could cut it); in between it holds. Each verdict is drawn from answers that ran under the ceiling
the previous verdict left. With no critical answer within the horizon there is nothing to protect
and nothing to judge by: the throttle is not in force.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable

from shared import clock

log = logging.getLogger(__name__)

RUN_SHARE = 0.6
"""Share of a critical ticket's SLO its run may use; the rest is the wait in Redis and the poll."""
RECENT_ANSWERS = 32
"""Critical answers whose run times make the percentile: a few seconds' worth under a surge."""
MIN_ANSWERS = 8
"""Fewer new answers than this say nothing of a 90th percentile: no verdict yet."""
GROW_BELOW = 0.8
SHRINK_FACTOR = 0.75
GROW_SHARE = 0.25
"""Share of the distance to capacity one verdict to grow takes back."""
HORIZON_SECONDS = 10.0
"""Critical answers older than this say nothing of the batch now."""


class Throttle:
    """Thread-safe: runners `observe` critical answers, the claim loop reads `ceiling(capacity)`."""

    def __init__(
        self, max_batch: int, *, run_share: float = RUN_SHARE, now: Callable[[], float] = clock.monotonic
    ) -> None:
        if not 0 < run_share <= 1:
            raise ValueError(f"run_share={run_share} is not accepted; use 0 < share ≤ 1")
        self.floor = max(1, max_batch // 4)
        self.run_share = run_share
        self._now = now
        self._lock = threading.Lock()
        self._recent: deque[float] = deque(maxlen=RECENT_ANSWERS)
        self._new = 0
        self._last_at: float | None = None
        self._ceiling: int | None = None
        self._cut_from: int | None = None
        """The ceiling the last cut was made from: from three quarters of it up, growth is a slot a verdict."""
        self.pressure: float | None = None
        """The last verdict's p90 over the allowance (1 = at it); None before the first."""

    def observe(self, *, run_seconds: float, slo_seconds: float) -> None:
        """One critical answer: from the request to vLLM to its last token, against its type's SLO."""
        if slo_seconds <= 0:
            return
        with self._lock:
            self._recent.append(max(run_seconds, 0.0) / (slo_seconds * self.run_share))
            self._new += 1
            self._last_at = self._now()

    def ceiling(self, capacity: int) -> int | None:
        """What non-critical tickets may fill out of `capacity` now; None while not in force.

        The throttle keeps its own ceiling, apart from capacity (which moves with every KV sample): a
        verdict cuts or grows what is in force, the smaller of the two, and a ceiling grown back to
        capacity no longer binds. A due verdict is applied here."""
        with self._lock:
            if self._last_at is None or self._now() - self._last_at > HORIZON_SECONDS:
                self._ceiling = self._cut_from = None
                return None
            before = capacity if self._ceiling is None else min(self._ceiling, capacity)
            pressure = None
            if self._new >= MIN_ANSWERS and len(self._recent) >= MIN_ANSWERS:
                self._new = 0
                ordered = sorted(self._recent)
                pressure = self.pressure = ordered[int(0.9 * (len(ordered) - 1))]
                if pressure > 1.0:
                    self._cut_from = before
                    self._ceiling = max(self.floor, int(before * SHRINK_FACTOR))
                    self._recent.clear()  # judge the cut by answers that ran under it
                elif pressure < GROW_BELOW and self._ceiling is not None:
                    step = max(1, math.ceil((capacity - before) * GROW_SHARE))
                    if self._cut_from is not None and before >= self._cut_from * SHRINK_FACTOR:
                        step = 1  # back where answers ran late last time: probe, do not leap
                    grown = before + step
                    self._ceiling = None if grown >= capacity else grown
            after = capacity if self._ceiling is None else min(self._ceiling, capacity)
        if pressure is not None and after != before:
            log.info(
                "throttle %d -> %d (critical answers run %.2f of their allowance at p90)",
                before,
                after,
                pressure,
                extra={
                    "event": "concurrency_limit",
                    "concurrency_limit": after,
                    "previous_limit": before,
                    "critical_pressure": pressure,
                },
            )
        return after
