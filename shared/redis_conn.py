"""Connecting to Redis: an explicit URL, else a Redis on 127.0.0.1:6379 if one answers."""

from __future__ import annotations

import redis
from redis import Redis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio import Redis as AsyncRedis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

DEFAULT_LOCAL_URL = "redis://127.0.0.1:6379/0"


class RedisUnavailable(RuntimeError):
    """No Redis answered where one was expected."""


def make_client(url: str) -> Redis:
    """A client that retries a few times on connection errors, so a Redis restart is survived."""
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=5,
        socket_keepalive=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=6),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


def local_redis_answers(url: str = DEFAULT_LOCAL_URL) -> bool:
    try:
        client = Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def resolve_redis_url(url: str | None) -> str:
    """`url` when given; else the local default if it answers; else a clear error."""
    if url:
        return url
    if local_redis_answers():
        return DEFAULT_LOCAL_URL
    raise RedisUnavailable(
        "no Redis: TIDEGATE_REDIS_URL is unset and nothing answers on 127.0.0.1:6379 "
        "(set TIDEGATE_REDIS_URL, start redis-server, or use `tidegate demo`, which embeds one)"
    )


def connect(url: str | None) -> Redis:
    return make_client(resolve_redis_url(url))


def connect_async(url: str | None, *, read_timeout: float, max_connections: int = 32) -> AsyncRedis:
    """An asyncio client (same URL rules) whose read timeout outlasts the blocking reads made on it.

    Its pool is bounded and blocking: many waiting calls reading at once queue for a connection
    rather than opening one each.
    """
    pool = BlockingConnectionPool.from_url(
        resolve_redis_url(url),
        max_connections=max_connections,
        timeout=read_timeout,
        decode_responses=True,
        socket_connect_timeout=5,
        socket_timeout=read_timeout,
        socket_keepalive=True,
        health_check_interval=30,
    )
    return AsyncRedis(connection_pool=pool)
