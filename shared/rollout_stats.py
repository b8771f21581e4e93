"""What workers record per arm during a rollout, and the figures read back from it.

Per call: one counter per (wave, arm, outcome) in a hash, and the TTFT in a capped list per wave
and arm. Per shadowed ticket: one JSON record of both answers in a capped list. Every write also
renews the key's expiry, so a rollout's data is bounded in size and gone a retention period after
its last write. Outcomes: `ok`; `error` (5xx, timeouts, refused connections, broken streams: what
the breaker counts); `shed` (the endpoint answered 429 or 503 with Retry-After: it turned the
call away under load); `breaker` (a canary ticket the candidate's open breaker sent to the
primary instead); `client` (a 4xx the request caused, counted for neither arm's errors).
`error` and `breaker` are both the arm's failures: the breaker is the one judge of an endpoint's
health, so a ticket it keeps off the candidate counts against the candidate as a failed call would.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.keys import QueueKeys
from shared.policy import RolloutPolicy
from shared.rollout import ARMS

OUTCOMES = ("ok", "error", "shed", "breaker", "client")
FAILURES = ("error", "breaker")


def record_call(
    client: Any,
    keys: QueueKeys,
    policy: RolloutPolicy,
    *,
    rollout_id: str,
    wave: int,
    arm: str,
    outcome: str,
    ttft_seconds: float | None,
) -> None:
    """Count one call of `arm` in `wave` (and keep its TTFT), in one transaction."""
    arms_key = keys.rollout_arms(rollout_id)
    pipe = client.pipeline(transaction=True)
    pipe.hincrby(arms_key, f"{wave}:{arm}:{outcome}", 1)
    pipe.expire(arms_key, policy.retention_seconds)
    if ttft_seconds is not None:
        ttft_key = keys.rollout_ttft(rollout_id, wave, arm)
        pipe.lpush(ttft_key, repr(round(ttft_seconds, 6)))
        pipe.ltrim(ttft_key, 0, policy.latency_samples - 1)
        pipe.expire(ttft_key, policy.retention_seconds)
    pipe.execute()


def record_shadow(
    client: Any, keys: QueueKeys, policy: RolloutPolicy, rollout_id: str, record: dict[str, Any]
) -> None:
    key = keys.rollout_shadow(rollout_id)
    pipe = client.pipeline(transaction=True)
    pipe.lpush(key, json.dumps(record, separators=(",", ":")))
    pipe.ltrim(key, 0, policy.shadow_records - 1)
    pipe.expire(key, policy.retention_seconds)
    pipe.execute()


def read_shadow(client: Any, keys: QueueKeys, rollout_id: str, limit: int = -1) -> list[dict[str, Any]]:
    """The kept A/B records, newest first."""
    raw = client.lrange(keys.rollout_shadow(rollout_id), 0, limit)
    return [json.loads(item) for item in raw]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q` percentile (0..100) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


@dataclass(frozen=True)
class ArmStats:
    """One arm's calls in one wave."""

    arm: str
    counts: dict[str, int]
    ttft_samples: tuple[float, ...]

    @property
    def calls(self) -> int:
        """Calls that count for the rates: every outcome but the request's own 4xx."""
        return sum(n for outcome, n in self.counts.items() if outcome != "client")

    def rate(self, outcome: str) -> float:
        return self.counts.get(outcome, 0) / self.calls if self.calls else 0.0

    @property
    def error_rate(self) -> float:
        """The share of failures (FAILURES) among the calls: what the wave judge compares."""
        return sum(self.rate(outcome) for outcome in FAILURES)

    @property
    def ttft_p95(self) -> float | None:
        return percentile(self.ttft_samples, 95)

    def to_dict(self) -> dict[str, Any]:
        p95 = self.ttft_p95
        return {
            "arm": self.arm,
            "calls": self.calls,
            **{outcome: self.counts.get(outcome, 0) for outcome in OUTCOMES},
            "error_rate": round(self.error_rate, 4),
            "shed_rate": round(self.rate("shed"), 4),
            "ttft_p95_seconds": None if p95 is None else round(p95, 4),
            "ttft_samples": len(self.ttft_samples),
        }


def read_wave_stats(client: Any, keys: QueueKeys, rollout_id: str, wave: int) -> dict[str, ArmStats]:
    """Both arms' figures for one wave, in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.rollout_arms(rollout_id))
    for arm in ARMS:
        pipe.lrange(keys.rollout_ttft(rollout_id, wave, arm), 0, -1)
    counts_raw, *samples = pipe.execute()
    out: dict[str, ArmStats] = {}
    for arm, arm_samples in zip(ARMS, samples, strict=True):
        counts: dict[str, int] = {}
        for field, value in counts_raw.items():
            name = field.decode() if isinstance(field, bytes) else field
            field_wave, field_arm, outcome = name.split(":", 2)
            if field_wave == str(wave) and field_arm == arm:
                counts[outcome] = int(value)
        out[arm] = ArmStats(arm, counts, tuple(float(v) for v in arm_samples))
    return out
