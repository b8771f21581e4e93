"""Reading the worker registry: which workers are alive and what they report about their GPU.

Workers write `keys.workers` (id → heartbeat deadline) and one TTL'd hash each; the monitor, the
metrics collector and the API read them here, so "alive" means the same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from redis import Redis

from shared import clock
from shared.keys import QueueKeys


@dataclass(frozen=True)
class WorkerView:
    """One live worker as its registry hash describes it; figures it has not reported are None."""

    worker_id: str
    gpu: str
    host: str
    model: str
    inflight: int | None
    batch_limit: int | None
    kv_usage: float | None
    gpu_free_bytes: int | None
    gpu_total_bytes: int | None
    heartbeat_deadline: float
    bound: str | None = None
    """What binds the worker's next claim (worker/claim_plan.py `Bound`: kv, adaptive, half_open...)."""
    state: str = ""
    concurrency_limit: int | None = None
    """The adaptive throttle's limit on the batch beside critical tickets, while it is in force."""

    @property
    def kv_free(self) -> float | None:
        """Free fraction of the KV cache (1 − usage), clamped to [0, 1]."""
        return None if self.kv_usage is None else min(max(1.0 - self.kv_usage, 0.0), 1.0)


def _number(raw: dict[str, str], name: str) -> float | None:
    value = raw.get(name)
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _int(raw: dict[str, str], name: str) -> int | None:
    value = _number(raw, name)
    return None if value is None else int(value)


def _view(worker_id: str, deadline: float, raw: dict[str, str]) -> WorkerView:
    return WorkerView(
        worker_id=worker_id,
        gpu=raw.get("gpu", ""),
        host=raw.get("host", ""),
        model=raw.get("model", ""),
        inflight=_int(raw, "inflight"),
        batch_limit=_int(raw, "batch_limit"),
        kv_usage=_number(raw, "kv_usage"),
        gpu_free_bytes=_int(raw, "gpu_free_bytes"),
        gpu_total_bytes=_int(raw, "gpu_total_bytes"),
        heartbeat_deadline=deadline,
        bound=raw.get("bound") or None,
        state=raw.get("state", ""),
        concurrency_limit=_int(raw, "concurrency_limit"),
    )


def read_live_workers(redis: Redis, keys: QueueKeys, now: float | None = None) -> list[WorkerView]:
    """Workers whose heartbeat deadline has not passed and whose hash still exists (two round trips)."""
    at = clock.now() if now is None else now
    entries = cast("list[tuple[Any, float]]", redis.zrangebyscore(keys.workers, at, "+inf", withscores=True))
    if not entries:
        return []
    pipe = redis.pipeline(transaction=False)
    for worker_id, _ in entries:
        pipe.hgetall(keys.worker(_text(worker_id)))
    hashes = pipe.execute()
    return [
        _view(_text(worker_id), float(deadline), {_text(k): _text(v) for k, v in raw.items()})
        for (worker_id, deadline), raw in zip(entries, hashes, strict=True)
        if raw
    ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def min_kv_free(workers: list[WorkerView]) -> float | None:
    """The lowest free KV-cache fraction among workers that report one (None when none do)."""
    figures = [w.kv_free for w in workers if w.kv_free is not None]
    return min(figures) if figures else None
