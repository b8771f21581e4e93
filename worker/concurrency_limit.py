"""An adaptive in-flight limit from per-token latency (a Gradient2-style limiter).

Every sequence a worker keeps in flight shares each engine step, so once the GPU is saturated one
more ticket makes every token slower without making the GPU any busier. The limiter watches two
figures of each finished answer — time per output token, and time to first token per prompt token
— as a short and a long moving average, each weighted by the answer's tokens: a short answer that
shared its few steps with a long prompt's prefill says little about the engine, and unweighted it
swung the limit from floor to ceiling within seconds. While the short one stays near the long one
the limit grows towards `max_limit`; when it rises (the engine has started to queue) the limit shrinks by
the ratio, within the short window, and never below `min_limit`. The long average follows the
short one only slowly (slower still while congested) and is pulled down at once when latency
falls, so a lasting slowdown is not mistaken for the new normal.

While critical answers are flowing their run times against their SLO judge the limit instead
(`critical_pressure.py`, `apply_verdict`): the averages are still kept, so the gradient takes over
with a current baseline when they stop.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from worker.critical_pressure import Verdict
from worker.latency_guard import SHRINK_FACTOR


@dataclass(frozen=True)
class LimiterSettings:
    min_limit: int = 2
    max_limit: int = 32
    short_window: int = 8
    """Answers in the short average: the limit reacts within about this many."""
    long_window: int = 200
    """Answers in the long average, the baseline."""
    tolerance: float = 1.25
    """Short over long latency tolerated before the limit shrinks."""
    smoothing: float = 0.5
    """How far each answer moves the limit towards its target (0 < s ≤ 1)."""

    def __post_init__(self) -> None:
        checks = {
            "min_limit": (self.min_limit >= 1, "1 or more"),
            "max_limit": (self.max_limit >= self.min_limit, "at least min_limit"),
            "short_window": (self.short_window >= 1, "1 or more"),
            "long_window": (self.long_window > self.short_window, "more than short_window"),
            "tolerance": (self.tolerance >= 1, "1 or more"),
            "smoothing": (0 < self.smoothing <= 1, "0 < smoothing ≤ 1"),
        }
        for name, (ok, accepted) in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is not accepted; use {accepted}")


class _Averages:
    """Short and long moving averages of one latency figure per token, weighted by tokens: each
    is moving seconds over moving tokens, so an answer counts by its size."""

    def __init__(self, settings: LimiterSettings) -> None:
        self.short_alpha = 2 / (settings.short_window + 1)
        self.long_alpha = 2 / (settings.long_window + 1)
        self.short: float | None = None
        self.long: float | None = None
        self._short_sums = (0.0, 0.0)
        self._long_sums = (0.0, 0.0)

    def add(self, value: float, tolerance: float, tokens: float = 1.0) -> None:
        """One answer's seconds per token, over `tokens` of its tokens."""
        tokens = max(tokens, 1.0)
        if self.short is None or self.long is None:
            self._short_sums = self._long_sums = (value * tokens, tokens)
            self.short = self.long = value
            return
        self._short_sums = _moved(self._short_sums, self.short_alpha, value, tokens)
        self.short = self._short_sums[0] / self._short_sums[1]
        # While latency is above the tolerance the baseline moves ten times slower still, so a
        # congested engine is not taken for the normal one; a faster engine is the new baseline at once.
        congested = self.short > self.long * tolerance
        alpha = self.long_alpha / 10 if congested else self.long_alpha
        self._long_sums = _moved(self._long_sums, alpha, value, tokens)
        self.long = min(self._long_sums[0] / self._long_sums[1], self.short)
        self._long_sums = (self.long * self._long_sums[1], self._long_sums[1])

    @property
    def ratio(self) -> float:
        """Short over long: 1 at the baseline, 2 when tokens take twice as long."""
        if self.short is None or self.long is None or self.long <= 0:
            return 1.0
        return self.short / self.long


def _moved(sums: tuple[float, float], alpha: float, value: float, tokens: float) -> tuple[float, float]:
    """(seconds, tokens) moved `alpha` of the way towards one answer's."""
    seconds, weight = sums
    return seconds + alpha * (value * tokens - seconds), weight + alpha * (tokens - weight)


class ConcurrencyLimit:
    """The adaptive limit; `observe` each finished answer, read `limit` before each claim."""

    def __init__(self, settings: LimiterSettings | None = None) -> None:
        self.settings = settings or LimiterSettings()
        self._per_token = _Averages(self.settings)
        self._prefill = _Averages(self.settings)
        self._estimate = float(self.settings.max_limit)
        self._lock = threading.Lock()
        self.changes = 0

    @property
    def limit(self) -> int:
        with self._lock:
            return self._rounded()

    def _rounded(self) -> int:
        return max(self.settings.min_limit, min(self.settings.max_limit, math.floor(self._estimate)))

    def observe(
        self,
        *,
        tpot_seconds: float | None,
        ttft_per_prompt_token: float | None,
        output_tokens: float = 1.0,
        prompt_tokens: float = 1.0,
        judged: bool = False,
    ) -> int | None:
        """Feed one answer's latency (and the tokens each figure is over, its weight); returns the
        new limit when it changed, else None. `judged`: critical answers' verdicts move the limit
        now, so this answer only updates the averages."""
        with self._lock:
            before = self._rounded()
            if tpot_seconds is not None and tpot_seconds > 0:
                self._per_token.add(tpot_seconds, self.settings.tolerance, output_tokens)
            if ttft_per_prompt_token is not None and ttft_per_prompt_token > 0:
                self._prefill.add(ttft_per_prompt_token, self.settings.tolerance, prompt_tokens)
            if judged:
                return None
            ratio = max(self._per_token.ratio, self._prefill.ratio)
            gradient = max(0.5, min(1.0, self.settings.tolerance / ratio))
            # Full gradient: room to grow by about the square root of the limit, as Gradient2 does.
            target = self._estimate * gradient + (math.sqrt(self._estimate) if gradient >= 1.0 else 0.0)
            return self._settle(before, self._estimate + self.settings.smoothing * (target - self._estimate))

    def apply_verdict(self, verdict: Verdict, ceiling: int) -> int | None:
        """Move the limit by one verdict of the critical answers: down by a quarter of what is in
        force (`ceiling` is the limit memory allows) when they run over their allowance, up by one
        when well within it and the adaptive limit is what binds. Returns the new limit when it
        changed, else None."""
        with self._lock:
            before = self._rounded()
            estimate = self._estimate
            if verdict.shrink:
                estimate = min(estimate, float(max(ceiling, self.settings.min_limit))) * SHRINK_FACTOR
            elif verdict.grow and estimate < ceiling:
                estimate += 1
            return self._settle(before, estimate)

    def _settle(self, before: int, estimate: float) -> int | None:
        """Take `estimate` within the bounds (the lock held); the new limit when it moved, else None."""
        self._estimate = max(float(self.settings.min_limit), min(float(self.settings.max_limit), estimate))
        after = self._rounded()
        if after == before:
            return None
        self.changes += 1
        return after
