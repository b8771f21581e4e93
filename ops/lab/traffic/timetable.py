"""The timetable behind both traffic players' dispatcher threads.

`ops.lab.traffic.player` (against the API) and `ops.lab.bench.baseline_player` (against the FIFO baseline)
each run one dispatcher thread that sleeps until its next action is due, while client or consumer
threads add actions from their side. This is the part they share: items kept in order of due time
(then push order), under a lock of their own, with a wake-up for the dispatcher.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class Timetable(Generic[T]):
    """Items due at `time.monotonic()` instants, safe to push from any thread; one dispatcher pops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()
        self._wake = threading.Event()
        self._closed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, due: float, item: T) -> bool:
        """Add `item`, due at `due`, and wake the dispatcher; False (item dropped) once closed."""
        with self._lock:
            if self._closed:
                return False
            heapq.heappush(self._heap, (due, next(self._seq), item))
        self._wake.set()
        return True

    def pop_due(self, now: float) -> list[T]:
        """Take the items due by `now`, earliest first, ties in push order."""
        with self._lock:
            self._wake.clear()  # a push or wake() from here on ends the next wait() at once
            due: list[T] = []
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[2])
            return due

    def wait(self, timeout: float) -> None:
        """Sleep until the earliest item is due, or a push or `wake()` since the last `pop_due`,
        or `timeout` seconds, whichever comes first."""
        with self._lock:
            if self._heap:
                timeout = min(timeout, max(self._heap[0][0] - time.monotonic(), 0.0))
        self._wake.wait(timeout)

    def wake(self) -> None:
        """End the dispatcher's wait without pushing (something it watches besides the items changed)."""
        self._wake.set()

    def close(self) -> None:
        """Drop the items still pending and refuse further pushes."""
        with self._lock:
            self._closed = True
            self._heap.clear()
