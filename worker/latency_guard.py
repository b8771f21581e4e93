"""A cap on non-critical tickets in flight that keeps critical answers within their SLO.

Every running sequence decodes in every engine step, and each step also carries the prefill of new
arrivals, so the time per output token grows with the batch. Under a backlog the memory and KV
limits keep the GPU as full as it can be, which is right for throughput; but then a full batch can
use most of a critical answer's SLO before its wait in Redis counts. While service is degraded (orange and red, when
other types are already shed), the guard watches how long critical answers run, from the request to
the last token, and lowers the cap by a quarter while their 90th percentile exceeds the share of the
SLO the run may use; it raises the cap by one while it fits with room to spare. The cap bounds the
claim's normal share only (`worker/headroom.py`): critical tickets may still fill the batch up to
its limit, so a smaller batch never makes them wait in Redis (capping the whole batch did). The floor keeps most of the throughput (a quarter of `max_batch`); back at
normal service the cap is lifted. Off by default (`--slo-guard` turns it on): in the overload
benchmark it lowered loans' p95 but cost throughput, and their p99 stayed within run-to-run noise
(`ops/lab/bench/RESULTS.md`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from worker.headroom import CriticalHeadroom

log = logging.getLogger(__name__)

RECENT_CRITICAL_ANSWERS = 32
"""Critical answers whose run times make the percentile: a few seconds' worth under a surge."""
MIN_ANSWERS = 8
"""Fewer answers than this say nothing about a 90th percentile: the cap is left as it is."""
RUN_SHARE = 0.5
"""Share of the SLO the run itself may use; the rest is the wait in Redis and the client's poll."""
GROW_BELOW = 0.8
"""The cap grows only while the percentile is under this fraction of the run's share."""
SHRINK_FACTOR = 0.75


class LatencyGuard:
    """Thread-safe: runner threads call `observe`, the housekeeping thread calls `update`."""

    def __init__(
        self,
        *,
        slo_seconds: float | None,
        max_batch: int,
        headroom: CriticalHeadroom | None = None,
        run_share: float = RUN_SHARE,
    ) -> None:
        if slo_seconds is not None and slo_seconds <= 0:
            raise ValueError(f"slo_seconds={slo_seconds} must be positive")
        if not 0 < run_share <= 1:
            raise ValueError(f"run_share={run_share} is not accepted; use 0 < share ≤ 1")
        self.target_seconds = None if slo_seconds is None else slo_seconds * run_share
        self.max_batch = max_batch
        self.floor = max(1, max_batch // 4)
        self.headroom = headroom or CriticalHeadroom(share=0.0)
        """The claim's headroom: the cap is cut from the normal share it leaves, not from the limit."""
        self._lock = threading.Lock()
        self._run_seconds: deque[float] = deque(maxlen=RECENT_CRITICAL_ANSWERS)
        self._fresh = 0
        self._active = False
        self._cap: int | None = None

    @property
    def cap(self) -> int | None:
        """The cap on the normal share now; None while inactive or with nothing to say."""
        with self._lock:
            return self._cap

    def set_active(self, degraded: bool) -> None:
        """Follow the monitor's degrade flag; leaving degraded service lifts the cap at once."""
        with self._lock:
            if self._active and not degraded and self._cap is not None:
                log.info("latency guard: service no longer degraded; normal-share cap %d lifted", self._cap)
                self._cap = None
            self._active = degraded

    def observe(self, *, run_seconds: float, critical: bool) -> None:
        """Record one finished answer: from the request to vLLM to its last token."""
        if not critical:
            return
        with self._lock:
            self._run_seconds.append(max(run_seconds, 0.0))
            self._fresh += 1

    def run_p90_seconds(self) -> float | None:
        """The 90th percentile of recent critical answers' run times; None with too few of them."""
        with self._lock:
            return self._p90()

    def _p90(self) -> float | None:
        if len(self._run_seconds) < MIN_ANSWERS:
            return None
        ordered = sorted(self._run_seconds)
        return ordered[int(0.9 * (len(ordered) - 1))]

    def update(self, current_limit: int) -> int | None:
        """Recompute the cap once per sizing round, from answers finished since the last one."""
        with self._lock:
            if not self._active or self.target_seconds is None or self._fresh == 0:
                return self._cap
            self._fresh = 0
            estimate = self._p90()
            if estimate is None:
                return self._cap
            previous = cap = self._cap
            if estimate > self.target_seconds:
                normal_share = current_limit - self.headroom.slots(current_limit)
                base = normal_share if previous is None else min(previous, normal_share)
                cap = max(self.floor, int(base * SHRINK_FACTOR))
                # Judge the new cap by answers that ran under it, not by the slow ones before it.
                self._run_seconds.clear()
            elif previous is not None and estimate < self.target_seconds * GROW_BELOW:
                cap = None if previous + 1 >= self.max_batch else previous + 1
            self._cap = cap
        if cap != previous:
            log.info(
                "latency guard: normal-share cap %s -> %s (critical answers run %.2f s at p90; target %.2f s)",
                previous,
                cap,
                estimate,
                self.target_seconds,
            )
        return cap
