"""One sample of a queue: depth and age per type, in-flight, drain and arrival rates, live workers.

Rates come from the growth of the outcome counters in Redis (`keys.counts`) over a sliding window,
so they measure what actually left the queue whoever did the work, and a monitor that takes over
needs only a few samples to know them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shared import clock
from shared.live_workers import WorkerView, min_kv_free, read_live_workers
from shared.queue import QueueStats, TicketQueue

DRAIN_OUTCOMES = ("done", "failed", "expired", "cancelled")
"""Outcomes that take a ticket out of the system; their growth is the drain rate."""
SERVED_OUTCOMES = ("done", "failed")
"""Outcomes of tickets a worker ran; their growth is the service rate the deadline rule divides by
(tickets that expire or are cancelled leave fast without GPU time, so they would flatter it)."""


class RateWindow:
    """Rate of change of an ever-growing count over the last `window_seconds`."""

    def __init__(self, window_seconds: float) -> None:
        if window_seconds <= 0:
            raise ValueError(f"window_seconds must be > 0, got {window_seconds}")
        self.window_seconds = window_seconds
        self._points: deque[tuple[float, int]] = deque()

    def add(self, at: float, count: int) -> float:
        """Record `count` at time `at`; returns the rate over the window (0 until two points exist)."""
        if self._points and (count < self._points[-1][1] or at < self._points[-1][0]):
            self._points.clear()  # counters were reset or the clock went back: start over
        self._points.append((at, count))
        while len(self._points) > 2 and at - self._points[1][0] >= self.window_seconds:
            self._points.popleft()
        first_at, first_count = self._points[0]
        elapsed = at - first_at
        return (count - first_count) / elapsed if elapsed > 0 else 0.0


@dataclass(frozen=True)
class Sample:
    at: float
    stats: QueueStats
    drain_rate: float
    """Tickets per second that reached done, failed, expired or cancelled."""
    service_rate: float
    """Tickets per second that workers ran to done or failed."""
    arrival_rate: float
    """Tickets per second admitted into the queue (submitted minus rejected)."""
    arrival_rate_by_type: dict[str, float] = field(default_factory=dict)
    """The same per type: the deadline rule subtracts the arrivals of better types from the
    service rate, as they will start ahead of a ticket already waiting."""
    service_peak: float = 0.0
    """The highest service rate of the last `PEAK_SECONDS`: what the workers can do, where the
    current rate is only what they were given (at a sudden step it lags the load)."""
    workers: list[WorkerView] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return self.stats.depth

    @property
    def workers_alive(self) -> int:
        return len(self.workers)

    @property
    def kv_free_min(self) -> float | None:
        return min_kv_free(self.workers)

    @property
    def free_slots(self) -> int:
        """Tickets the live workers would start at once: each one's batch, or its throttle while in
        force, less what it runs (as of its last heartbeat). The deadline rule counts a ticket that
        finds one of them as starting now, whatever the service rate says."""
        free = 0
        for worker in self.workers:
            if worker.batch_limit is None or worker.inflight is None:
                continue
            batch = worker.batch_limit
            if worker.concurrency_limit is not None:
                batch = min(batch, worker.concurrency_limit)
            free += max(batch - worker.inflight, 0)
        return free


def _total(stats: QueueStats, outcomes: tuple[str, ...]) -> int:
    return sum(value for key, value in stats.counts.items() if key.rpartition(":")[2] in outcomes)


PEAK_SECONDS = 300.0


class Sampler:
    """Takes samples of one queue and keeps the windows its rates need."""

    def __init__(self, queue: TicketQueue, window_seconds: float = 30.0) -> None:
        self.queue = queue
        self._drained = RateWindow(window_seconds)
        self._served = RateWindow(window_seconds)
        self._service_rates: deque[tuple[float, float]] = deque()
        self._arrived = RateWindow(window_seconds)
        self._arrived_by_type = {name: RateWindow(window_seconds) for name in queue.policy.type_names}

    def sample(self, now: float | None = None) -> Sample:
        at = clock.now() if now is None else now
        stats = self.queue.stats()
        workers = read_live_workers(self.queue.redis, self.queue.keys, at)
        admitted = _total(stats, ("submitted",)) - _total(stats, ("rejected",))
        service_rate = self._served.add(at, _total(stats, SERVED_OUTCOMES))
        self._service_rates.append((at, service_rate))
        while self._service_rates and at - self._service_rates[0][0] > PEAK_SECONDS:
            self._service_rates.popleft()
        return Sample(
            at=at,
            stats=stats,
            drain_rate=self._drained.add(at, _total(stats, DRAIN_OUTCOMES)),
            service_rate=service_rate,
            service_peak=max(rate for _, rate in self._service_rates),
            arrival_rate=self._arrived.add(at, admitted),
            arrival_rate_by_type={
                name: window.add(
                    at, stats.outcome_count(name, "submitted") - stats.outcome_count(name, "rejected")
                )
                for name, window in self._arrived_by_type.items()
            },
            workers=workers,
        )
