"""Connecting to Redis: an explicit URL, else a Redis on 127.0.0.1:6379 if one answers.

Every client has a connect and a read timeout, so a Redis that stops answering (paused VM,
network partition, SIGSTOP) fails each command within a known time instead of blocking a thread
until the kernel gives up. The bound, for a command on a stalled Redis: `READ_TIMEOUT_SECONDS`
(a timeout is not retried: the same stall would only multiply it); for a refused or reset
connection (a restart): the retries below, about `CONNECT_RETRY_SECONDS` in all. Blocking pops
get a client of their own whose read timeout is the pop's timeout plus `BLOCK_MARGIN_SECONDS`.
"""

from __future__ import annotations

import redis
from redis import Redis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio import Redis as AsyncRedis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

DEFAULT_LOCAL_URL = "redis://127.0.0.1:6379/0"

CONNECT_TIMEOUT_SECONDS = 2.0
READ_TIMEOUT_SECONDS = 2.0
"""Longest wait for one reply; Redis answers queue commands in well under a millisecond."""
HEALTH_CHECK_SECONDS = 10
"""A pooled connection idle this long is PINGed before use, so a dead one is replaced quietly."""
BLOCK_MARGIN_SECONDS = 2.0
"""Added to a blocking pop's own timeout: the reply may come at the very end of its wait."""
_RETRIES = 4
_BACKOFF = ExponentialBackoff(cap=1.0, base=0.1)
CONNECT_RETRY_SECONDS = 0.1 + 0.2 + 0.4 + 0.8 + _RETRIES * CONNECT_TIMEOUT_SECONDS
"""Worst case for a command while Redis restarts: each retry's backoff plus its connect timeout."""


class RedisUnavailable(RuntimeError):
    """No Redis answered where one was expected."""


def connection_retry() -> Retry:
    """Retry refused and reset connections (a restart); never a read timeout (a stall)."""
    return Retry(_BACKOFF, retries=_RETRIES, supported_errors=(redis.ConnectionError,))


def make_client(url: str, *, read_timeout: float = READ_TIMEOUT_SECONDS) -> Redis:
    """A client that survives a Redis restart and fails fast, within `read_timeout`, on a stall."""
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=read_timeout,
        socket_keepalive=True,
        health_check_interval=HEALTH_CHECK_SECONDS,
        retry=connection_retry(),
    )


def blocking_client(client: Redis, block_seconds: float) -> Redis:
    """A client to `client`'s server for blocking pops of up to `block_seconds`.

    Its read timeout is the pop's own plus a margin, so a stalled server still fails the pop
    within a bound, while a pop that simply waits its full time never trips it.
    """
    kwargs = dict(client.connection_pool.connection_kwargs)
    kwargs["socket_timeout"] = block_seconds + BLOCK_MARGIN_SECONDS
    kwargs.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_SECONDS)
    kwargs["health_check_interval"] = HEALTH_CHECK_SECONDS
    kwargs["retry"] = connection_retry()
    pool = client.connection_pool.__class__(
        connection_class=client.connection_pool.connection_class, **kwargs
    )
    return Redis(connection_pool=pool)


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
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=read_timeout,
        socket_keepalive=True,
        health_check_interval=HEALTH_CHECK_SECONDS,
    )
    return AsyncRedis(connection_pool=pool)
