"""The Redis memory guard: shed non-critical intake before Redis refuses writes.

Redis runs with `maxmemory` and `noeviction`, so at its limit every write fails, loan approvals
included. The monitor reads `used_memory` each sample; above the policy's high-water mark of the
budget it turns the guard on (admission then sheds non-critical types with code `redis_memory`)
and turns it off once memory falls below the clear line, so it does not flap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from shared.policy import MemoryPolicy


@dataclass(frozen=True)
class MemoryReading:
    used_bytes: int
    budget_bytes: int | None
    """The policy's budget, else Redis's maxmemory; None when neither is set (guard off)."""

    @property
    def ratio(self) -> float | None:
        return self.used_bytes / self.budget_bytes if self.budget_bytes else None


def read_memory(redis: Any, policy: MemoryPolicy) -> MemoryReading:
    """One `INFO memory` round trip."""
    info = cast("dict[str, Any]", redis.info("memory"))
    limit = policy.budget_bytes or int(info.get("maxmemory", 0) or 0)
    return MemoryReading(int(info["used_memory"]), limit or None)


class MemoryGuard:
    """The guard's state with hysteresis; `observe` says whether it is on after a reading."""

    def __init__(self, policy: MemoryPolicy, active: bool = False) -> None:
        self.policy = policy
        self.active = active

    def observe(self, reading: MemoryReading) -> bool:
        ratio = reading.ratio
        if ratio is None:
            self.active = False
        elif ratio >= self.policy.high_water:
            self.active = True
        elif ratio < self.policy.clear_below:
            self.active = False
        return self.active
