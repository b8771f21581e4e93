"""The claim plan: how many tickets the next claim may take, of which classes, and what binds it.

Every bound on a claim is applied here, in one order, by one pure function of a snapshot of the
worker's world (as vLLM's scheduler returns one plan per step):

1. **capacity**: `max_batch`, free GPU memory and vLLM's KV cache (the batch sizer), and the KV
   tokens left for the next claim (the token budget); critical tickets are bounded by these alone,
   so a burst of loans never waits in Redis behind a throttle;
2. **the adaptive throttle** (`throttle.py`): non-critical tickets fill no more of the batch than
   critical answers' run times against their SLO allow;
3. **the critical reserve**: a share of the batch's slots and of the KV cache kept free of
   non-critical tickets, so a loan arriving a moment later still finds room;
4. **health** (the shared breaker, `breaker_gate.py`): after vLLM failed, nothing while the pause
   runs, then the one probe of all workers; a half-open circuit its one probe; an open one nothing;
5. **preemption**: at the limit, a critical ticket waiting at the head may take the slot of the
   newest non-critical one (`preemption.py` chooses it).

The plan names its binding bound as a code (`Bound`): the registry, `tidegate status` and the
page show it, so "why is the GPU not full" has an answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Bound(StrEnum):
    """What holds the next claim's non-critical tickets back."""

    MAX_BATCH = "max_batch"
    MEMORY = "memory"
    KV = "kv"
    KV_WATERMARK = "kv_watermark"
    KV_BUDGET = "kv_budget"
    ADAPTIVE = "adaptive"
    CRITICAL_RESERVE = "critical_reserve"
    FAILING = "failing"
    HALF_OPEN = "half_open"
    OPEN = "open"


class Gate(StrEnum):
    """What endpoint health lets through: all, one probe ticket, or nothing (why: a health `Bound`)."""

    GO = "go"
    PROBE = "probe"
    WAIT = "wait"


@dataclass(frozen=True)
class Snapshot:
    """The world one claim is planned from."""

    capacity: int
    """The batch the sizer allows (memory, KV cache, `max_batch`), at least 1."""
    capacity_bound: Bound
    running: int
    token_budget: int | None
    """KV tokens the next claim may take; None when vLLM's KV figures are unknown."""
    usable_kv_tokens: int | None
    throttle: int | None = None
    """The adaptive throttle's ceiling; None while it is not in force."""
    reserve_share: float = 0.0
    health: Gate = Gate.GO
    health_bound: Bound = Bound.OPEN
    """Why health holds the claim back when it does: `failing`, `half_open` or `open`."""


@dataclass(frozen=True)
class ClaimPlan:
    count: int
    """Tickets of any type the claim may take."""
    normal_count: int
    """Of those, non-critical ones."""
    budget: int
    """KV tokens the claim may take; 0 = no budget."""
    normal_budget: int
    bound: Bound
    preempt: bool
    """With no room, whether a critical ticket at the head may take a running ticket's slot."""

    @property
    def room(self) -> bool:
        return self.count > 0


def reserved_slots(limit: int, share: float) -> int:
    """Slots of `limit` kept for critical types: at least one while the share is set, never all."""
    if share <= 0 or limit <= 1:
        return 0
    return min(max(math.ceil(limit * share), 1), limit - 1)


def plan_claim(snap: Snapshot) -> ClaimPlan:
    """The next claim, from `snap`; see the module's docstring for the order of the bounds."""
    if snap.health is Gate.WAIT:
        return ClaimPlan(0, 0, 0, 0, snap.health_bound, preempt=False)
    healthy = snap.health is Gate.GO
    limit = snap.capacity if healthy else 1
    bound = snap.capacity_bound if healthy else snap.health_bound
    free = limit - snap.running
    budget = snap.token_budget
    if free <= 0:
        return ClaimPlan(0, 0, 0, 0, bound, preempt=healthy)
    if budget is not None and budget <= 0 and snap.running > 0:
        # The KV cache is as full as a full batch: a waiting loan preempts here too.
        return ClaimPlan(0, 0, 0, 0, Bound.KV_BUDGET, preempt=healthy)
    budget = 0 if budget is None else max(budget, 1)
    if not healthy:
        return ClaimPlan(free, free, budget, budget, bound, preempt=False)
    batch = limit
    if snap.throttle is not None and snap.throttle < limit:
        batch, bound = snap.throttle, Bound.ADAPTIVE
    normal_count = max(batch - reserved_slots(batch, snap.reserve_share) - snap.running, 0)
    reserve_tokens = int(max(snap.usable_kv_tokens or 0, 0) * snap.reserve_share)
    normal_budget = max(budget - reserve_tokens, 0) if budget > 0 else 0
    if normal_count == 0 and bound is not Bound.ADAPTIVE:
        bound = Bound.CRITICAL_RESERVE
    return ClaimPlan(free, normal_count, budget, normal_budget, bound, preempt=True)
