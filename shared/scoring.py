"""The ordering rule: who runs next.

effective priority = base − Σ weight × factor (CONTRACT.md). Aging makes one priority point worth
`aging_seconds` of waiting. Comparing two tickets at any time t, ticket a runs before b when

    p_a − (t − e_a) / A  <  p_b − (t − e_b) / A    ⇔    p_a · A + e_a  <  p_b · A + e_b

so t cancels and a *static* sorted-set score `priority × A + arrival` orders the queue correctly at
every instant: one ZPOPMIN returns the right ticket. Equal priority degenerates to arrival order
(FIFO). Strict priority (A = 0) uses a weight so large that no realistic wait outranks one
hundredth of a priority point.
"""

from __future__ import annotations

from shared.clock import SCORE_EPOCH
from shared.policy import TypePolicy

STRICT_PRIORITY_WEIGHT = 1e8
"""Seconds one priority point is worth in strict mode: ~3 years, so 0.01 outranks 11 days of waiting."""


def effective_priority(
    type_policy: TypePolicy, *, urgent_level: int = 0, vip_level: int = 0, is_bulk: bool = False
) -> float:
    """base − Σ weight × factor, rounded to keep float noise out of equal priorities."""
    values = {"urgent_level": float(urgent_level), "vip_level": float(vip_level), "is_bulk": float(is_bulk)}
    boost = sum(weight * values[name] for name, weight in type_policy.factors.items())
    return round(type_policy.base - boost, 6)


def aging_weight(aging_seconds: float) -> float:
    return aging_seconds if aging_seconds > 0 else STRICT_PRIORITY_WEIGHT


def queue_score(priority: float, arrival: float, aging_seconds: float) -> float:
    """Sorted-set score: lower is served first. `arrival` is Unix time in seconds."""
    return priority * aging_weight(aging_seconds) + (arrival - SCORE_EPOCH)
