"""The worker registry: who is alive, on which GPU, with what batch limit and free memory.

Each heartbeat writes the worker's hash (with a TTL of a few heartbeats) and its deadline in the
`workers` sorted set in one round trip; a worker that stops removes both, one that dies simply
stops renewing and drops out when the deadline passes. `shared/live_workers.py` reads it.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from redis import Redis

from shared import clock
from shared.keys import KNOWN_QUEUES, QueueKeys
from shared.live_workers import WorkerView, read_live_workers

MISSED_HEARTBEATS = 3
"""A worker counts as dead after this many heartbeats in a row did not arrive."""


def default_worker_id(gpu: int) -> str:
    """`host-gpuN`: stable across restarts of one container, so `--check` and dashboards can name it."""
    return f"{socket.gethostname()}-gpu{gpu}"


class WorkerRegistry:
    def __init__(self, redis: Redis, keys: QueueKeys, worker_id: str, heartbeat_seconds: float) -> None:
        self.redis = redis
        self.keys = keys
        self.worker_id = worker_id
        self.ttl_seconds = heartbeat_seconds * MISSED_HEARTBEATS
        self._listed = False

    def heartbeat(self, info: Mapping[str, str | int | float | None]) -> None:
        now = clock.now()
        fields = {k: str(v) for k, v in info.items() if v is not None}
        fields["heartbeat_at"] = repr(now)
        key = self.keys.worker(self.worker_id)
        # A figure that became unknown (vLLM's metrics unreadable, the guard's cap lifted) leaves the
        # hash rather than standing there stale.
        unknown = [k for k, v in info.items() if v is None]
        pipe = self.redis.pipeline(transaction=True)
        if unknown:
            pipe.hdel(key, *unknown)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, max(int(self.ttl_seconds * 1000), 1))
        pipe.zadd(self.keys.workers, {self.worker_id: now + self.ttl_seconds})
        # Dead workers' entries are pruned by whoever is alive, so the set never grows unbounded.
        pipe.zremrangebyscore(self.keys.workers, "-inf", now - self.ttl_seconds)
        pipe.execute()
        if not self._listed:  # its own command: the set is in another Cluster slot than the queue
            self.redis.sadd(KNOWN_QUEUES, self.keys.queue)
            self._listed = True

    def deregister(self) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.worker(self.worker_id))
        pipe.zrem(self.keys.workers, self.worker_id)
        pipe.execute()


def live_workers(redis: Redis, keys: QueueKeys) -> list[WorkerView]:
    return read_live_workers(redis, keys, clock.now())


def check_alive(
    redis: Redis, keys: QueueKeys, *, worker_id: str | None, host: str | None, gpu: int | None
) -> list[WorkerView]:
    """Live workers matching the probe: the one named, else those on `host` (and `gpu` when given)."""
    workers = live_workers(redis, keys)
    if worker_id is not None:
        return [w for w in workers if w.worker_id == worker_id]
    matches = [w for w in workers if host is None or w.host == host]
    if gpu is not None:
        matches = [w for w in matches if w.gpu == str(gpu)]
    return matches
