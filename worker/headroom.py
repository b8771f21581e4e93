"""Room kept for critical tickets: a share of the batch limit and of the KV token budget.

Without it a busy worker fills every slot and every reserved KV token with whatever is at the head
of the queue, and a loan arriving a moment later waits in Redis for a departure, often behind a
long-prompt ticket that holds its reservation for seconds. With it, tickets of non-critical types
stop at the normal share and a critical ticket at the head of the queue still finds a slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimShares:
    """What one claim may take: all of it for critical types, the normal part for the others."""

    count: int
    normal_count: int
    budget: int
    normal_budget: int
    normal_prompt_budget: int = 0
    """Prompt tokens the non-critical tickets of this claim may bring (the prefill guard); 0 = any."""
    normal_prompt_first_over: bool = True
    """Whether the first of them may exceed it (none is in prefill, so one long prompt still runs)."""


@dataclass(frozen=True)
class CriticalHeadroom:
    share: float = 0.2
    """Fraction of the batch limit and of the usable KV cache kept for critical types; 0 = none."""
    min_slots: int = 1
    """Slots kept however small the share makes them, while the limit is above 1."""

    def __post_init__(self) -> None:
        if not 0 <= self.share < 1:
            raise ValueError(f"share={self.share!r} is not accepted; use 0 ≤ share < 1")
        if self.min_slots < 0:
            raise ValueError(f"min_slots={self.min_slots!r} is not accepted; use 0 or more")

    def slots(self, limit: int) -> int:
        """Slots of `limit` kept for critical types; never all of them, so other work still runs."""
        if self.share == 0 or limit <= 1:
            return 0
        return min(max(math.ceil(limit * self.share), self.min_slots), limit - 1)

    def tokens(self, usable_kv_tokens: int | None) -> int:
        """KV tokens kept for critical types out of the cache less the safety margin (0 unknown)."""
        if usable_kv_tokens is None or usable_kv_tokens <= 0:
            return 0
        return int(usable_kv_tokens * self.share)

    def split(
        self,
        limit: int,
        running: int,
        budget: int,
        usable_kv_tokens: int | None,
        normal_cap: int | None = None,
    ) -> ClaimShares:
        """The claim's count and budget (0 = no budget) for a worker running `running` tickets.

        Everything in flight counts against the normal share, critical tickets included, so the
        headroom is what is left above the normal share whoever holds the slots below it.
        `normal_cap` (the latency guard's) bounds the normal share further; critical tickets may
        still fill the batch up to `limit`.
        """
        count = max(limit - running, 0)
        normal_share = limit - self.slots(limit)
        if normal_cap is not None:
            normal_share = min(normal_share, normal_cap)
        normal_count = max(normal_share - running, 0)
        normal_budget = budget - self.tokens(usable_kv_tokens) if budget > 0 else 0
        return ClaimShares(count, normal_count, budget, max(normal_budget, 0) if budget > 0 else 0)
