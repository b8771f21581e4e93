"""The operator's view of a queue as one JSON document: what `tidegate status --json` prints and what
the status page (`GET /v1/status`, drawn by `/ui`) polls, so the terminal and the page never disagree.

Everything is read from Redis in a few pipelined round trips; nothing is kept in the process.
"""

from __future__ import annotations

from typing import Any

from redis import Redis

from shared import clock
from shared.breaker_store import BreakerStore
from shared.class_counts import class_counts
from shared.control import read_control_state, read_events
from shared.depth_history import read_depth_history
from shared.keys import QueueKeys
from shared.live_workers import WorkerView, read_live_workers
from shared.policy import Policy
from shared.queue import TicketQueue
from shared.rollout_report import rollout_summary
from shared.shed_log import DEFAULT_WINDOW_SECONDS, recent_sheds

EVENT_SCAN = 200
"""Action events outnumber alarm transitions, so transitions are picked from a longer stretch."""
TRANSITIONS = 8
EVENTS = 8


def worker_doc(worker: WorkerView) -> dict[str, Any]:
    return {
        "worker_id": worker.worker_id,
        "host": worker.host,
        "gpu": worker.gpu,
        "model": worker.model,
        "state": worker.state,
        "inflight": worker.inflight,
        "batch_limit": worker.batch_limit,
        "bound": worker.bound,
        "concurrency_limit": worker.concurrency_limit,
        "kv_usage": worker.kv_usage,
        "gpu_free_bytes": worker.gpu_free_bytes,
        "gpu_total_bytes": worker.gpu_total_bytes,
    }


def _breakers(redis: Redis, keys: QueueKeys, policy: Policy) -> dict[str, Any] | None:
    """Each endpoint's breaker by endpoint; None until a worker has recorded one."""
    views = BreakerStore(redis, keys, policy.breaker).views()
    return {v.endpoint: {k: x for k, x in v.as_dict().items() if k != "endpoint"} for v in views} or None


def operator_status(redis: Redis, policy: Policy, queue_name: str) -> dict[str, Any]:
    """Depth per type (now, and the monitor's samples of the last minutes), alarm level and its
    transitions, mode, workers, recent sheds, breakers, rollout."""
    queue = TicketQueue(redis, policy, queue_name)
    keys = QueueKeys(queue_name)
    stats = queue.stats()
    state, _ = read_control_state(redis, keys, policy.alarms)
    workers = sorted(read_live_workers(redis, keys), key=lambda w: w.worker_id)
    events = read_events(redis, keys, EVENT_SCAN)
    # Shed counts live as long as the rejected records they count.
    sheds = recent_sheds(redis, keys, min(DEFAULT_WINDOW_SECONDS, policy.queue.rejected_retention_seconds))
    alarms = policy.alarms
    return {
        "queue": queue_name,
        "generated_at": clock.now(),
        "level": state.level.label,
        "level_source": "monitor" if state.level_is_published else "derived from depth (no live monitor)",
        "level_since": state.level_since,
        "thresholds": {"yellow": alarms.yellow, "orange": alarms.orange, "red": alarms.red},
        "mode": state.mode.value,
        "critical_types": [name for name, tp in policy.types.items() if tp.critical],
        "depth": stats.depth,
        "depth_by_type": stats.depth_by_type,
        "caps": {name: tp.cap for name, tp in policy.types.items()},
        "oldest_wait_seconds": {t: round(a, 3) for t, a in stats.oldest_age_by_type.items()},
        "inflight": stats.inflight,
        "delayed": stats.delayed,
        "workers_alive": len(workers),
        "workers": [worker_doc(w) for w in workers],
        "drain_rate": state.drain_rate,
        "desired_workers": state.desired_workers,
        "memory_guard": state.memory_guard,
        "redis_used_memory": state.redis_used_memory,
        "redis_memory_budget": state.redis_memory_budget,
        "outcomes": stats.counts,
        "by_class": {
            name: counts.as_dict() for name, counts in class_counts(stats.counts, policy.type_names).items()
        },
        "sheds": {
            "window_seconds": sheds.window_seconds,
            "total": sheds.total,
            "by_code": sheds.by_code,
            "by_type": sheds.by_type_and_code,
        },
        "breakers": _breakers(redis, keys, policy),
        "rollout": rollout_summary(redis, keys),
        "history": read_depth_history(redis, keys),
        "events": events[:EVENTS],
        "transitions": [e for e in events if e.get("kind") == "alarm"][:TRANSITIONS],
    }
