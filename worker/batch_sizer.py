"""How many tickets a worker keeps in flight (its capacity), and the KV tokens the next claim may take.

Two views are combined because neither is enough alone: vLLM pre-allocates its KV cache, so the
free memory NVML reports says nothing about how full that cache is, while vLLM's own metrics say
nothing about another process eating the GPU. The count comes from free GPU memory (clamped to
[1, max_batch]), capped at what vLLM runs while it keeps queueing, and shrinks multiplicatively
while the KV cache is above its high watermark. The KV cache itself is decided once, in tokens: the
token budget counts the worker's own tickets at their full size (prompt + max_tokens), not at what
they hold now, so a cache that looks half free cannot be exhausted by answers yet to be written. (A
count from the cache, by an average ticket size, swung between a few and `max_batch` from one
sample to the next and held the batch back while the budget had room.)
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from worker.claim_plan import Bound
from worker.vllm_metrics import VllmMetrics

log = logging.getLogger(__name__)

DEFAULT_PROMPT_TOKENS = 512
"""Prompt size assumed before any ticket has been seen (a short loan file), replaced by real ones."""
RECENT_TICKETS = 64
"""Tickets whose prompt + max_tokens make the running average: enough to smooth, quick to adapt."""
SHRINK_FACTOR = 0.75
WAITING_SAMPLES = 2
"""Consecutive samples vLLM must report waiting requests before the batch is capped at its running
count: it reports a few waiting at almost every step boundary while admitting them, and one sample
alone swung the limit between ~9 and ~30 in the overload benchmark."""
GROW_FACTOR = 1.5


def memory_limit(free_bytes: int, per_ticket_bytes: int, safety_margin: float, max_batch: int) -> int:
    """`min(int(free × (1 − margin) / per_ticket), max_batch)`, never below 1 so work still flows."""
    usable = max(free_bytes, 0) * (1.0 - safety_margin)
    return clamp(int(usable // per_ticket_bytes), max_batch)


def clamp(value: int, max_batch: int) -> int:
    return max(1, min(value, max_batch))


@dataclass(frozen=True)
class SizerInputs:
    """One sample of the world: GPU memory (None without a provider) and vLLM's metrics (None
    when /metrics could not be read), taken while `own_inflight` tickets reserving
    `own_reserved_tokens` were running."""

    gpu_free_bytes: int | None
    gpu_total_bytes: int | None
    vllm: VllmMetrics | None
    own_inflight: int
    own_reserved_tokens: int


@dataclass(frozen=True)
class SizerDecision:
    limit: int
    memory_limit: int | None
    engine_cap: int | None
    """What vLLM runs, while it keeps queueing requests of its own; None otherwise."""
    per_ticket_tokens: int
    kv_usage: float | None
    free_kv_tokens: int | None
    reason: str
    bound: Bound


class BatchSizer:
    """The batch limit and token budget, recomputed from each `SizerInputs` sample.

    Thread-safe: the claim loop reads `limit` and `token_budget` while the housekeeping thread
    calls `update` and the runners call `observe`. Its settings are validated where they are
    declared (`WorkerConfig`).
    """

    def __init__(
        self,
        *,
        kv_bytes_per_token: int,
        max_batch: int = 32,
        safety_margin: float = 0.15,
        kv_high_watermark: float = 0.85,
        initial_ticket_tokens: int = DEFAULT_PROMPT_TOKENS + 256,
    ) -> None:
        self.kv_bytes_per_token = kv_bytes_per_token
        self.max_batch = max_batch
        self.safety_margin = safety_margin
        self.kv_high_watermark = kv_high_watermark
        self._initial_tokens = initial_ticket_tokens
        self._recent: deque[int] = deque(maxlen=RECENT_TICKETS)
        self._lock = threading.Lock()
        self._limit = max_batch
        self._recovering = False
        self._free_kv_tokens: int | None = None
        self._kv_capacity_tokens: int | None = None
        self._reserved_at_sample = 0
        self._waiting_streak = 0
        self._bound = Bound.MAX_BATCH
        self.last: SizerDecision | None = None

    @property
    def limit(self) -> int:
        with self._lock:
            return self._limit

    @property
    def bound(self) -> Bound:
        """What the limit is bounded by at the last sample."""
        with self._lock:
            return self._bound

    def observe(self, cost_tokens: int) -> None:
        """Record a claimed ticket's prompt + max_tokens for the running average."""
        with self._lock:
            self._recent.append(max(cost_tokens, 1))

    def per_ticket_tokens(self) -> int:
        with self._lock:
            return self._per_ticket_tokens()

    def _per_ticket_tokens(self) -> int:
        if not self._recent:
            return self._initial_tokens
        return max(1, round(sum(self._recent) / len(self._recent)))

    def usable_kv_tokens(self) -> int | None:
        """The KV cache less the safety margin at the last sample; None when vLLM's is unknown."""
        with self._lock:
            if self._kv_capacity_tokens is None:
                return None
            return int(self._kv_capacity_tokens * (1.0 - self.safety_margin))

    def token_budget(self, own_reserved_tokens: int) -> int | None:
        """Tokens the next claim may take: free KV tokens (less the margin) at the last sample,
        less what was claimed since and plus what has left since, and never more than the cache
        (less the margin) minus the full size of every ticket in flight. None when vLLM's metrics
        are unknown (no budget). Crediting departures before the next sample lets a departure's
        slot be refilled at once; the full-size bound alone keeps the cache within its margin."""
        with self._lock:
            if self._free_kv_tokens is None:
                return None
            usable = int(self._free_kv_tokens * (1.0 - self.safety_margin))
            budget = usable - (own_reserved_tokens - self._reserved_at_sample)
            if self._kv_capacity_tokens is not None:
                reserved_room = (
                    int(self._kv_capacity_tokens * (1.0 - self.safety_margin)) - own_reserved_tokens
                )
                budget = min(budget, reserved_room)
            return budget

    def update(self, inputs: SizerInputs) -> SizerDecision:
        """Recompute the limit from a fresh sample; logs when it changes."""
        with self._lock:
            per_ticket = self._per_ticket_tokens()
            mem = None
            if inputs.gpu_free_bytes is not None:
                mem = memory_limit(
                    inputs.gpu_free_bytes,
                    per_ticket * self.kv_bytes_per_token,
                    self.safety_margin,
                    self.max_batch,
                )
            kv = self._engine_cap(inputs)
            vllm = inputs.vllm
            usage = vllm.kv_usage if vllm is not None else None
            previous = self._limit
            new, reason, bound = self._next_limit(
                min(x for x in (mem, kv, self.max_batch) if x is not None), usage, mem, kv
            )
            self._limit, self._bound = new, bound
            self._free_kv_tokens = vllm.free_kv_tokens if vllm is not None else None
            self._kv_capacity_tokens = vllm.kv_capacity_tokens if vllm is not None else None
            self._reserved_at_sample = inputs.own_reserved_tokens
            decision = SizerDecision(new, mem, kv, per_ticket, usage, self._free_kv_tokens, reason, bound)
            self.last = decision
        if new != previous:
            log.info(
                "batch limit %d -> %d (%s; memory limit %s, engine cap %s, %d tokens per ticket)",
                previous,
                new,
                reason,
                mem,
                kv,
                per_ticket,
            )
        return decision

    def _engine_cap(self, inputs: SizerInputs) -> int | None:
        """No more than vLLM runs while it keeps queueing; None otherwise (or without its figures)."""
        vllm = inputs.vllm
        queueing = vllm is not None and vllm.waiting > 0 and vllm.running > 0
        self._waiting_streak = self._waiting_streak + 1 if queueing else 0
        if vllm is None or self._waiting_streak < WAITING_SAMPLES:
            return None
        # vLLM keeps queueing internally: tickets waiting there lose tidegate's priority order, so
        # hold them in Redis instead of sending more than vLLM runs.
        return clamp(vllm.running, self.max_batch)

    def _next_limit(
        self, target: int, usage: float | None, mem: int | None, kv: int | None
    ) -> tuple[int, str, Bound]:
        """The new limit, why, and its bound: shrink above the KV watermark, grow back gradually."""
        previous = self._limit
        if usage is not None and usage > self.kv_high_watermark:
            self._recovering = True
            reason = f"KV cache {usage:.0%} above the {self.kv_high_watermark:.0%} watermark"
            new = clamp(min(target, int(previous * SHRINK_FACTOR)), self.max_batch)
            return new, reason, Bound.KV_WATERMARK
        name, bound = self._binding(mem, kv)
        if self._recovering and target > previous:
            # Grow back gradually after a shrink, so the limit does not bounce at the watermark.
            new = clamp(min(target, max(previous + 1, int(previous * GROW_FACTOR))), self.max_batch)
            self._recovering = new < target
            return new, f"recovering after KV pressure; bounded by {name}", Bound.KV_WATERMARK
        self._recovering = False
        return clamp(target, self.max_batch), f"bounded by {name}", bound

    def _binding(self, mem: int | None, kv: int | None) -> tuple[str, Bound]:
        """The smallest bound; on a tie `max_batch`, then memory: the one a change would not move."""
        candidates = [
            (self.max_batch, ("max_batch", Bound.MAX_BATCH)),
            (mem, ("free GPU memory", Bound.MEMORY)),
            (kv, ("what vLLM runs while it queues", Bound.KV)),
        ]
        least = min(v for v, _ in candidates if v is not None)
        return next(name for v, name in candidates if v == least)
