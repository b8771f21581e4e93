"""Back off from a vLLM that keeps failing, instead of spinning through the queue.

Each ticket that fails goes back with its own backoff, but without this a worker would at once
claim the next ticket and fail it too, burning every ticket's attempts against a dead server.
After a transient failure the worker pauses claiming (shared/backoff.py, or as long as vLLM's
`Retry-After` asks, whichever is longer) and then probes with one ticket until a call succeeds.
"""

from __future__ import annotations

import threading

from shared import backoff, clock


class VllmHealth:
    def __init__(self, *, base_seconds: float = 0.5, max_seconds: float = 30.0) -> None:
        if base_seconds <= 0 or max_seconds < base_seconds:
            raise ValueError(
                f"backoff base_seconds={base_seconds}, max_seconds={max_seconds}: need 0 < base ≤ max"
            )
        self.base_seconds = base_seconds
        self.max_seconds = max_seconds
        self._lock = threading.Lock()
        self._failures = 0
        self._paused_until = 0.0

    @property
    def failing(self) -> bool:
        """True after a transient failure until a call succeeds: claim one ticket at a time."""
        with self._lock:
            return self._failures > 0

    @property
    def consecutive_failures(self) -> int:
        with self._lock:
            return self._failures

    def success(self) -> None:
        with self._lock:
            self._failures = 0
            self._paused_until = 0.0

    def failure(self, retry_after: float | None = None) -> float:
        """Record a transient failure; returns the pause before the next claim.

        Failures while a pause is already running are the same outage (a crashed vLLM fails every
        request in flight at once) and do not lengthen it.
        """
        with self._lock:
            now = clock.monotonic()
            if now < self._paused_until:
                return self._paused_until - now
            self._failures += 1
            pause = backoff.full_jitter(self._failures, self.base_seconds, self.max_seconds)
            if retry_after is not None:
                pause = max(pause, min(retry_after, self.max_seconds))
            self._paused_until = now + pause
            return pause

    def pause_remaining(self) -> float:
        with self._lock:
            return max(self._paused_until - clock.monotonic(), 0.0)
