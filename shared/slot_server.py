"""Running a pipeline of scripts on the one server that holds a queue, on a Redis Cluster too.

redis-py's cluster pipeline refuses EVALSHA, yet every key of a queue carries the queue's hash tag,
so all of them live on the master of one slot: a plain pipeline to that master runs the scripts
(redis-py loads each one there on NOSCRIPT). After a failover that master is gone or answers
MOVED; the cluster client then re-reads who owns the slot and the pipeline is sent again. Each
script is atomic and one slot moves as a whole, so a pipeline refused by MOVED ran none of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from shared import backoff

T = TypeVar("T")

ATTEMPTS = 10
"""Sends of one pipeline while a slot changes hands; backed off to outlast a replica's promotion."""
RETRY_BASE_SECONDS = 0.1
RETRY_CAP_SECONDS = 1.0


def _moved(exc: redis.ResponseError) -> bool:
    return str(exc).startswith(("MOVED", "TRYAGAIN", "CLUSTERDOWN"))


def on_slot_server(client: Redis | Any, key: str, run: Callable[[Redis], T]) -> T:
    """`run(server)` with a client of the server that holds `key`: `client` itself on one Redis;
    on a Cluster, a client of the master of `key`'s slot, found again after a failover."""
    if not isinstance(client, RedisCluster):
        return run(client)
    for attempt in range(ATTEMPTS):
        node = client.get_node_from_key(key, replica=False)  # type: ignore[no-untyped-call]
        server = client.get_redis_connection(node)
        assert server is not None, "the cluster client makes a client for every node it knows"
        try:
            return run(server)
        except (redis.ConnectionError, redis.TimeoutError):
            if attempt == ATTEMPTS - 1:
                raise
        except redis.ResponseError as exc:
            if not _moved(exc) or attempt == ATTEMPTS - 1:
                raise
        # No jitter: one client waits on one promotion, and the whole curve must outlast it.
        time.sleep(backoff.ceiling(attempt + 1, RETRY_BASE_SECONDS, RETRY_CAP_SECONDS))
        try:
            client.nodes_manager.initialize()
        except RedisClusterException:  # no node answered yet; the next attempt asks again
            continue
    raise AssertionError("unreachable: the last attempt returns or raises")
