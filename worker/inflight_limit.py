"""The worker's in-flight limit and what one claim may take: one decision, in one place.

The limit is the smallest of what memory allows (the batch sizer: free GPU memory, vLLM's KV cache,
`max_batch`) and what latency allows (the adaptive limit, when on); critical tickets are bounded by
memory alone, so a burst of loans is never queued behind loans by the latency limit. Latency comes
from two sources, each judged against its own baseline by a limiter of its own: the worker's streams, and vLLM's
histograms. Their scales differ (the network and the stream's parsing are in one and not the other;
a simulator's histograms run on its simulated clock), so one average over both would take every
switch between them for a change in latency. Critical types keep a reserved
share of that limit and of the KV budget (`headroom.py`); the latency guard's cap, when in force,
bounds the others further; and the prefill guard bounds the prompt tokens of non-critical tickets
still in prefill, so a burst of long prompts cannot take every engine step. While critical answers
are flowing, their run times against their SLO move the adaptive limit instead of the per-token
gradient (`critical_pressure.py`). Whatever changes the adaptive limit is logged here with the
latencies that moved it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace

from worker.batch_sizer import BatchSizer
from worker.concurrency_limit import ConcurrencyLimit, LimiterSettings
from worker.critical_pressure import CriticalPressure
from worker.headroom import ClaimShares, CriticalHeadroom
from worker.latency_guard import LatencyGuard
from worker.vllm_client import Completion
from worker.vllm_metrics import VllmMetrics

log = logging.getLogger(__name__)

MIN_PROMPT_TOKENS = 256
"""Shorter prompts say nothing per prompt token: their first token takes about one engine step
(which the time per output token measures already) plus fixed overheads that would be noise."""


def adaptive_limiter(max_batch: int, tolerance: float = LimiterSettings.tolerance) -> ConcurrencyLimit:
    """The limiter for a worker of `max_batch`: its floor keeps a quarter of the batch busy."""
    return ConcurrencyLimit(
        LimiterSettings(min_limit=max(1, max_batch // 4), max_limit=max_batch, tolerance=tolerance)
    )


def answer_latency(completion: Completion) -> tuple[float | None, float | None]:
    """(time per output token, time to first token per prompt token) of one streamed answer."""
    ttft = completion.ttft_seconds
    if ttft is None:
        return None, None
    tpot = None
    if completion.completion_tokens > 1:
        tpot = max(completion.total_seconds - ttft, 0.0) / (completion.completion_tokens - 1)
    per_prompt = ttft / completion.prompt_tokens if completion.prompt_tokens >= MIN_PROMPT_TOKENS else None
    return tpot, per_prompt


@dataclass(frozen=True)
class EngineLatency:
    """Means over one sampling interval, from the growth of vLLM's histogram sums."""

    tpot_seconds: float | None
    ttft_per_prompt_token: float | None
    output_tokens: float = 1.0
    """Tokens the interval's time per output token is over (its weight)."""
    prompt_tokens: float = 1.0


def engine_latency(before: VllmMetrics | None, after: VllmMetrics) -> EngineLatency | None:
    """What vLLM's histograms say about the interval between two samples; None without them."""
    if before is None:
        return None

    def grew(name: str) -> float | None:
        old, new = before.sum_of(name), after.sum_of(name)
        return None if old is None or new is None or new < old else new - old

    itl_sum, itl_count = grew("itl_sum"), grew("itl_count")
    ttft_sum, ttft_count, prompts = grew("ttft_sum"), grew("ttft_count"), grew("prompt_tokens")
    tpot = itl_sum / itl_count if itl_sum is not None and itl_count else None
    per_prompt = None
    if ttft_sum is not None and ttft_count and prompts and prompts / ttft_count >= MIN_PROMPT_TOKENS:
        per_prompt = ttft_sum / prompts
    if tpot is None and per_prompt is None:
        return None
    return EngineLatency(tpot, per_prompt, itl_count or 1.0, prompts or 1.0)


class InflightLimit:
    """Thread-safe: runners call `observe_answer`, housekeeping `observe_engine`, the claim loop
    `limit` and `shares`."""

    def __init__(
        self,
        *,
        sizer: BatchSizer,
        headroom: CriticalHeadroom,
        adaptive: ConcurrencyLimit | None = None,
        engine_adaptive: ConcurrencyLimit | None = None,
        latency_guard: LatencyGuard | None = None,
        prefill_guard_tokens: int = 0,
        pressure: CriticalPressure | None = None,
    ) -> None:
        self.sizer = sizer
        self.headroom = headroom
        self.adaptive = adaptive
        """Fed by the worker's own answers."""
        self.engine_adaptive = engine_adaptive
        """Fed by vLLM's histograms."""
        self.latency_guard = latency_guard
        self.prefill_guard_tokens = prefill_guard_tokens
        self.pressure = pressure
        """Critical answers against their SLO; None = the per-token gradient always decides."""
        self._last_engine: VllmMetrics | None = None
        self._lock = threading.Lock()

    @property
    def adaptive_limit(self) -> int | None:
        """The smaller of what either latency source allows; None when both are off."""
        limits = [x.limit for x in (self.adaptive, self.engine_adaptive) if x is not None]
        return min(limits) if limits else None

    @property
    def limit(self) -> int:
        """min(memory sizer, KV cache, adaptive limit, max_batch): the batch the others fill."""
        adaptive = self.adaptive_limit
        return self.sizer.limit if adaptive is None else min(self.sizer.limit, adaptive)

    @property
    def critical_limit(self) -> int:
        """What critical tickets may fill: memory alone (the sizer, KV cache, max_batch) bounds them.

        Loans come in bursts; when the adaptive limit bounded them too, a burst filled every slot
        with loans and the next ones waited in Redis behind loans, where no preemption helps."""
        return self.sizer.limit

    def observe_answer(self, completion: Completion, critical_slo_seconds: float | None = None) -> None:
        """One finished answer; `critical_slo_seconds` is its type's SLO when the type is critical."""
        if self.pressure is not None and critical_slo_seconds is not None:
            self.pressure.observe(run_seconds=completion.total_seconds, slo_seconds=critical_slo_seconds)
        tpot, per_prompt = answer_latency(completion)
        weights = (max(completion.completion_tokens - 1, 1), max(completion.prompt_tokens, 1))
        self._observe(self.adaptive, tpot, per_prompt, "answer", weights)
        if critical_slo_seconds is not None:
            self._judge()

    @property
    def _judged(self) -> bool:
        return self.pressure is not None and self.pressure.flowing

    def _judge(self) -> None:
        """Apply the critical answers' verdict, when one is due, to both limiters."""
        verdict = self.pressure.verdict() if self.pressure is not None else None
        if verdict is None:
            return
        with self._lock:
            before = self.adaptive_limit
            for limiter in (self.adaptive, self.engine_adaptive):
                if limiter is not None:
                    limiter.apply_verdict(verdict, self.sizer.limit)
            changed = self.adaptive_limit
        _log_change(
            before,
            changed,
            "critical answers",
            f"run {verdict.pressure:.2f} of their SLO allowance at p90",
            critical_pressure=verdict.pressure,
        )

    def observe_engine(self, metrics: VllmMetrics | None) -> None:
        """Feed the means of vLLM's histograms since the last sample (they move while answers are
        still running, when no answer has finished to say so)."""
        if metrics is None or self.engine_adaptive is None:
            return
        with self._lock:
            before, self._last_engine = self._last_engine, metrics
        latency = engine_latency(before, metrics)
        if latency is not None:
            self._observe(
                self.engine_adaptive,
                latency.tpot_seconds,
                latency.ttft_per_prompt_token,
                "vLLM histograms",
                (latency.output_tokens, latency.prompt_tokens),
            )

    def _observe(
        self,
        limiter: ConcurrencyLimit | None,
        tpot: float | None,
        per_prompt: float | None,
        source: str,
        weights: tuple[float, float],
    ) -> None:
        """Feed one limiter; `weights` are the output and prompt tokens the two figures are over."""
        if limiter is None or (tpot is None and per_prompt is None):
            return
        with self._lock:  # so each change of the smaller of the two is logged once
            before = self.adaptive_limit
            limiter.observe(
                tpot_seconds=tpot,
                ttft_per_prompt_token=per_prompt,
                output_tokens=weights[0],
                prompt_tokens=weights[1],
                judged=self._judged,
            )
            changed = self.adaptive_limit
        _log_change(
            before,
            changed,
            source,
            ("-" if tpot is None else f"{tpot * 1000:.2f} ms")
            + " per output token, "
            + ("-" if per_prompt is None else f"{per_prompt * 1000:.3f} ms")
            + " to first token per prompt token",
            tpot_seconds=tpot,
            ttft_per_prompt_token_seconds=per_prompt,
        )

    def _normal_cap(self) -> int | None:
        """The most tickets in flight beside which a non-critical one may start: the adaptive
        limit less its critical share, and the latency guard's cap when in force."""
        adaptive = self.adaptive_limit
        caps = [
            self.latency_guard.cap if self.latency_guard is not None else None,
            adaptive - self.headroom.slots(adaptive) if adaptive is not None else None,
        ]
        known = [c for c in caps if c is not None]
        return min(known) if known else None

    def shares(self, limit: int, running: int, budget: int | None, prefill_tokens: int) -> ClaimShares:
        """What one claim may take with `running` tickets in flight out of `limit` (critical tickets
        fill it all), `budget` KV tokens left (None = unknown) and `prefill_tokens` of non-critical
        prompts still in prefill."""
        shares = self.headroom.split(
            limit,
            running,
            0 if budget is None else max(budget, 1),
            self.sizer.usable_kv_tokens(),
            normal_cap=self._normal_cap(),
        )
        guard = self.prefill_guard_tokens
        if guard <= 0:
            return shares
        left = guard - prefill_tokens
        if left <= 0:
            return replace(shares, normal_count=0)
        return replace(shares, normal_prompt_budget=left, normal_prompt_first_over=prefill_tokens == 0)


def _log_change(
    before: int | None, changed: int | None, source: str, why: str, **figures: float | None
) -> None:
    """One log line, with its figures as fields, for a change of the adaptive limit."""
    if changed == before or changed is None or before is None:
        return
    log.info(
        "concurrency limit %d -> %d (%s: %s)",
        before,
        changed,
        source,
        why,
        extra={
            "event": "concurrency_limit",
            "concurrency_limit": changed,
            "previous_limit": before,
            "source": source,
            **figures,
        },
    )
