"""When to retry and how long to wait: full-jitter backoff, the server's Retry-After, one deadline.

Shared by the sync and async clients, so both retry by the same rules; only their sleeping differs.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx

from tidegate_client.errors import ConnectionFailed, error_of

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header, in either form RFC 9110 allows: delay-seconds
    (`"3"`) or an HTTP date (`"Wed, 21 Oct 2026 07:28:00 GMT"`); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT
        when = when.replace(tzinfo=dt.UTC)
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


@dataclass(frozen=True)
class RetryEvent:
    """One retry about to happen: why, and how long the client sleeps first."""

    method: str
    path: str
    attempt: int
    status: int | None
    error: str | None
    sleep_seconds: float


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff of `base × 2^attempt` capped at `cap`, drawn uniformly from [0, that] (full jitter,
    so many branches retrying after one outage spread out), all within `deadline` seconds a call."""

    deadline: float = 60.0
    base: float = 0.25
    cap: float = 10.0

    def backoff(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.cap, self.base * 2**attempt))


class Retrier:
    """The retry state of one call: each failed try asks `pause` how long to sleep, or raises."""

    def __init__(
        self,
        policy: RetryPolicy,
        rng: random.Random,
        method: str,
        url: str,
        on_retry: Callable[[RetryEvent], None] | None,
    ) -> None:
        self.policy = policy
        self.rng = rng
        self.method = method
        self.url = url
        self.on_retry = on_retry
        self.deadline = time.monotonic() + policy.deadline
        self.attempt = 0

    def pause(self, response: httpx.Response | None, error: BaseException | None) -> float:
        """Seconds before the next try; raises the final error when the answer is not worth retrying
        or the wait would pass the deadline (a Retry-After longer than what is left ends it now)."""
        retry_after: float | None = None
        if response is not None:
            if response.status_code not in RETRY_STATUSES:
                raise error_of(response)
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
        pause = retry_after if retry_after is not None else self.policy.backoff(self.attempt, self.rng)
        if time.monotonic() + pause > self.deadline:
            if response is None:
                raise ConnectionFailed(
                    f"{self.method} {self.url}: no answer within the {self.policy.deadline:g} s "
                    f"retry deadline ({type(error).__name__}: {error})"
                )
            raise error_of(response, retry_after)
        self.attempt += 1
        if self.on_retry is not None:
            status = None if response is None else response.status_code
            text = None if error is None else f"{type(error).__name__}: {error}"
            self.on_retry(RetryEvent(self.method, self.url, self.attempt, status, text, pause))
        return pause
