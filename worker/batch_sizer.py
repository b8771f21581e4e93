"""How many tickets a worker keeps in flight, from free GPU memory and vLLM's KV cache.

Two views are combined because neither is enough alone: vLLM pre-allocates its KV cache, so the
free memory NVML reports says nothing about how full that cache is, while vLLM's own metrics say
nothing about another process eating the GPU. The limit is the smaller of the two, clamped to
[1, max_batch], and shrinks multiplicatively while the KV cache is above its high watermark.
The KV view counts the worker's own tickets at their full size (prompt + max_tokens), not at what
they hold now: a cache that looks half free can still be exhausted by answers yet to be written.
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


def kv_limit(
    free_kv_tokens: int, per_ticket_tokens: int, safety_margin: float, own_inflight: int, max_batch: int
) -> int:
    """Tickets the KV cache can hold: those already running plus what fits in the free blocks.

    The worker's own running tickets keep their slots (they already hold their blocks); the free
    blocks, less the safety margin, add room for more of the average size.
    """
    more = int(max(free_kv_tokens, 0) * (1.0 - safety_margin) // per_ticket_tokens)
    return clamp(own_inflight + more, max_batch)


def reserved_kv_limit(
    kv_capacity_tokens: int,
    own_reserved_tokens: int,
    per_ticket_tokens: int,
    safety_margin: float,
    own_inflight: int,
    max_batch: int,
) -> int:
    """Tickets that fit when every running ticket is counted at its full size (prompt + max_tokens).

    Free blocks alone overstate the room: running tickets still grow by their answers, and tickets
    just sent hold no blocks until their prefill. Counting what this worker has reserved keeps the
    cache within the margin however long the answers get (the GPU's worker is its only client).
    """
    room = int(kv_capacity_tokens * (1.0 - safety_margin)) - own_reserved_tokens
    return clamp(own_inflight + max(room, 0) // per_ticket_tokens, max_batch)


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
    kv_limit: int | None
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
            kv = self._kv_limit(inputs, per_ticket)
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
                "batch limit %d -> %d (%s; memory limit %s, KV limit %s, %d tokens per ticket)",
                previous,
                new,
                reason,
                mem,
                kv,
                per_ticket,
            )
        return decision

    def _kv_limit(self, inputs: SizerInputs, per_ticket: int) -> int | None:
        """The limit vLLM's KV cache allows: free blocks, what this worker reserved, and no more than
        vLLM runs while it keeps queueing. None without vLLM figures."""
        vllm = inputs.vllm
        if vllm is None:
            return None
        kv = None
        if vllm.free_kv_tokens is not None:
            kv = kv_limit(
                vllm.free_kv_tokens, per_ticket, self.safety_margin, inputs.own_inflight, self.max_batch
            )
        if vllm.kv_capacity_tokens is not None:
            reserved = reserved_kv_limit(
                vllm.kv_capacity_tokens,
                inputs.own_reserved_tokens,
                per_ticket,
                self.safety_margin,
                inputs.own_inflight,
                self.max_batch,
            )
            kv = reserved if kv is None else min(kv, reserved)
        queueing = vllm.waiting > 0 and vllm.running > 0
        self._waiting_streak = self._waiting_streak + 1 if queueing else 0
        if self._waiting_streak >= WAITING_SAMPLES:
            # vLLM keeps queueing internally: tickets waiting there lose tidegate's priority
            # order, so hold them in Redis instead of sending more than vLLM runs.
            kv = min(kv if kv is not None else self.max_batch, clamp(vllm.running, self.max_batch))
        return kv

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
        candidates = {
            ("free GPU memory", Bound.MEMORY): mem,
            ("free KV cache", Bound.KV): kv,
            ("max_batch", Bound.MAX_BATCH): self.max_batch,
        }
        return min((v, k) for k, v in candidates.items() if v is not None)[1]
