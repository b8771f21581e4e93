"""Recent sheds by code: per-minute counters, so operators can see what was refused lately and why.

One HASH per minute ("<type>:<code>" → count), incremented by the enqueue script in the same step
that writes the rejected record (so a shed still costs one round trip) and living as long as those
records (the policy's `rejected_retention_seconds`); a reader sums the minutes of its window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from redis import Redis

from shared import clock
from shared.keys import QueueKeys

BUCKET_SECONDS = 60
MAX_WINDOW_SECONDS = 15 * 60
DEFAULT_WINDOW_SECONDS = 5 * 60


@dataclass(frozen=True)
class RecentSheds:
    window_seconds: int
    by_code: dict[str, int]
    by_type_and_code: dict[str, dict[str, int]]
    """type → code → count."""

    @property
    def total(self) -> int:
        return sum(self.by_code.values())


def shed_minute(at: float) -> int:
    """The bucket a shed at `at` is counted in (the enqueue script increments it)."""
    return int(at // BUCKET_SECONDS)


def recent_sheds(
    redis: Redis, keys: QueueKeys, window_seconds: int = DEFAULT_WINDOW_SECONDS, now: float | None = None
) -> RecentSheds:
    """Sheds of the last `window_seconds` (whole minutes, the current one included)."""
    at = clock.now() if now is None else now
    window = min(max(window_seconds, BUCKET_SECONDS), MAX_WINDOW_SECONDS)
    last = int(at // BUCKET_SECONDS)
    minutes = range(last - window // BUCKET_SECONDS + 1, last + 1)
    pipe = redis.pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(keys.sheds(minute))
    by_code: dict[str, int] = {}
    by_type: dict[str, dict[str, int]] = {}
    for raw in cast("list[dict[str | bytes, str | bytes]]", pipe.execute()):
        for field, value in raw.items():
            name = field.decode() if isinstance(field, bytes) else field
            ticket_type, _, code = name.rpartition(":")
            count = int(value)
            by_code[code] = by_code.get(code, 0) + count
            per_type = by_type.setdefault(ticket_type, {})
            per_type[code] = per_type.get(code, 0) + count
    return RecentSheds(window, dict(sorted(by_code.items())), by_type)
