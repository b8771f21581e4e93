"""The rollout as shown to operators: `tidegate status`, `/v1/queues`, metrics and `rollout report`."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from shared.keys import QueueKeys
from shared.rollout import ARMS, WAVES
from shared.rollout_stats import OUTCOMES, percentile, read_shadow, read_wave_stats
from shared.rollout_store import read_rollout

SHADOW_ARMS = {"primary": "control", "candidate": "candidate"}
"""A shadow record's keys and the arm names the report prints."""


def rollout_summary(client: Any, keys: QueueKeys) -> dict[str, Any] | None:
    """The rollout's state with both arms' figures in its current wave; None when none was started."""
    state = read_rollout(client, keys)
    if state is None:
        return None
    doc = state.to_dict()
    wave = min(state.wave, WAVES - 1)
    stats = read_wave_stats(client, keys, state.id, wave)
    doc["arms"] = {arm: stats[arm].to_dict() for arm in ARMS}
    return doc


def _stat(values: Sequence[float], q: float | None) -> float | None:
    if not values:
        return None
    value = fmean(values) if q is None else percentile(values, q)
    return None if value is None else round(value, 4)


def _arm_row(records: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    answers = [r[key] for r in records if isinstance(r.get(key), dict)]
    ok = [a for a in answers if not a.get("error")]

    def values(name: str) -> list[float]:
        return [float(a[name]) for a in ok if a.get(name) is not None]

    ttft, tpot, total = values("ttft_seconds"), values("tpot_seconds"), values("total_seconds")
    return {
        "arm": SHADOW_ARMS[key],
        "answers": len(answers),
        "errors": len(answers) - len(ok),
        "error_rate": round((len(answers) - len(ok)) / len(answers), 4) if answers else 0.0,
        "ttft_p50_seconds": _stat(ttft, 50),
        "ttft_p95_seconds": _stat(ttft, 95),
        "tpot_p50_seconds": _stat(tpot, 50),
        "total_p50_seconds": _stat(total, 50),
        "total_p95_seconds": _stat(total, 95),
        "completion_tokens_mean": _stat(values("completion_tokens"), None),
        "prompt_tokens_mean": _stat(values("prompt_tokens"), None),
    }


def ab_report(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Control beside candidate over the kept shadow records, with the answers' text similarity."""
    similarity = [float(r["similarity"]) for r in records if r.get("similarity") is not None]
    return {
        "records": len(records),
        "arms": [_arm_row(records, key) for key in SHADOW_ARMS],
        "similarity_mean": _stat(similarity, None),
        "similarity_p50": _stat(similarity, 50),
    }


def rollout_report(client: Any, keys: QueueKeys) -> dict[str, Any] | None:
    """Everything `tidegate rollout report` shows: state, per-wave arms, the shadow A/B table and
    the latency samples the plot draws."""
    state = read_rollout(client, keys)
    if state is None:
        return None
    records = read_shadow(client, keys, state.id)
    waves = []
    for wave in range(min(state.wave, WAVES - 1) + 1):
        stats = read_wave_stats(client, keys, state.id, wave)
        waves.append({"wave": wave, **{arm: stats[arm].to_dict() for arm in ARMS}})
    samples = {
        SHADOW_ARMS[key]: [
            {
                "at": r["at"],
                "ttft_seconds": r[key].get("ttft_seconds"),
                "total_seconds": r[key].get("total_seconds"),
            }
            for r in reversed(records)
            if isinstance(r.get(key), dict) and not r[key].get("error")
        ]
        for key in SHADOW_ARMS
    }
    return {"rollout": state.to_dict(), "waves": waves, "shadow": ab_report(records), "samples": samples}


def rollout_metric_families(client: Any, keys: QueueKeys) -> list[Metric]:
    """`tidegate_rollout_wave` (-1 with no rollout) and the current rollout's calls per arm and outcome."""
    wave = GaugeMetricFamily(
        "tidegate_rollout_wave",
        "Canary wave of the model rollout: 0-9 running or paused, 10 complete, -1 none.",
        labels=["version", "status"],
    )
    calls = CounterMetricFamily(
        "tidegate_rollout_calls",
        "Calls of the current rollout by arm (candidate, primary) and outcome (ok, error, shed, breaker, client).",
        labels=["arm", "outcome"],
    )
    state = read_rollout(client, keys)
    if state is None:
        wave.add_metric(["", "none"], -1)
        return [wave, calls]
    wave.add_metric([state.version, state.status.value], state.wave)
    totals = {(arm, outcome): 0 for arm in ARMS for outcome in OUTCOMES}
    for field, value in client.hgetall(keys.rollout_arms(state.id)).items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        _wave, arm, outcome = name.split(":", 2)
        totals[(arm, outcome)] = totals.get((arm, outcome), 0) + int(value)
    for (arm, outcome), value in sorted(totals.items()):
        calls.add_metric([arm, outcome], value)
    return [wave, calls]
