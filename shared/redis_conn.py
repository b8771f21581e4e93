"""Connecting to Redis: an explicit URL, else a Redis on 127.0.0.1:6379 if one answers.

Every client has a connect and a read timeout, so a Redis that stops answering (paused VM,
network partition, SIGSTOP) fails each command within a known time instead of blocking a thread
until the kernel gives up. The bound, for a command on a stalled Redis: `READ_TIMEOUT_SECONDS`
(a timeout is not retried: the same stall would only multiply it); for a refused or reset
connection (a restart): the retries below, about `CONNECT_RETRY_SECONDS` in all. Blocking pops
get a client of their own whose read timeout is the pop's timeout plus `BLOCK_MARGIN_SECONDS`.
A `rediss://` URL connects over TLS, verified against the CA its query names (`with_ca_certs`).
"""

from __future__ import annotations

from typing import Any, Protocol, cast
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import redis
from redis import Redis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

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
    if _topology_client(client):
        return client  # its read timeout, TOPOLOGY_READ_TIMEOUT_SECONDS, covers the longest pop
    kwargs = dict(client.connection_pool.connection_kwargs)
    kwargs["socket_timeout"] = block_seconds + BLOCK_MARGIN_SECONDS
    kwargs.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_SECONDS)
    kwargs["health_check_interval"] = HEALTH_CHECK_SECONDS
    kwargs["retry"] = connection_retry()
    pool = client.connection_pool.__class__(
        connection_class=client.connection_pool.connection_class, **kwargs
    )
    return Redis(connection_pool=pool)


def with_ca_certs(url: str | None, ca_certs: str, field: str) -> str:
    """`url` (a `rediss://` URL) asking redis-py to verify the server with the CA file `ca_certs`.

    redis-py reads `ssl_ca_certs` from a URL's query, so the CA needs no option of its own on any
    client; a URL that names one already keeps it.
    """
    if not url or urlsplit(url).scheme != "rediss":
        raise ValueError(
            f"{field}: {url!r} is not a rediss:// URL; a Redis CA file (redis_ssl_ca_certs) is only "
            "used over TLS, e.g. rediss://redis.internal:6380/0"
        )
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "ssl_ca_certs" in query:
        return url
    query["ssl_ca_certs"] = [ca_certs]
    return urlunsplit(parts._replace(query=urlencode(query, doseq=True)))


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


# ---- more than one Redis: a Cluster or a Sentinel-managed primary --------------------------------

TOPOLOGY_CONNECT_TIMEOUT_SECONDS = 2.0
TOPOLOGY_READ_TIMEOUT_SECONDS = 12.0
"""The longest blocking pop on a wake list (10 s) plus its margin: these clients serve the pops too
(`blocking_client` returns them), so a stalled Cluster or Sentinel primary fails a command within
this, not within READ_TIMEOUT_SECONDS."""
FAILOVER_RETRIES = 10
"""Enough backed-off retries (about 7 s) to outlast a replica's promotion after its master died."""


def _failover_retry() -> Retry:
    return Retry(ExponentialBackoff(cap=1.0, base=0.1), retries=FAILOVER_RETRIES)


class FailoverCluster(RedisCluster):
    """RedisCluster whose "no node could be reached" while it re-reads the slots (mid-failover)
    is a `redis.ConnectionError`, so every caller's handling of a lost Redis applies to it."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisClusterException as exc:
            if "cannot be connected" not in str(exc):
                raise
            raise redis.ConnectionError(f"Redis Cluster unreachable: {exc}") from exc


def make_cluster_client(url: str, *, decode_responses: bool = True) -> Redis:
    """A Redis Cluster client seeded from any node's URL; it follows MOVED and re-reads the slots
    after a failover, and redis-py's scripts reload themselves per node on NOSCRIPT.

    Typed as `Redis`: the cluster client answers every command tidegate sends (each names keys of
    one hash tag), so callers stay written against one interface.
    """
    client = FailoverCluster.from_url(
        url,
        decode_responses=decode_responses,
        socket_connect_timeout=TOPOLOGY_CONNECT_TIMEOUT_SECONDS,
        socket_timeout=TOPOLOGY_READ_TIMEOUT_SECONDS,
        socket_keepalive=True,
        retry=_failover_retry(),
    )
    return cast("Redis", client)


def parse_sentinels(spec: str) -> list[tuple[str, int]]:
    """`host:port,host:port` → [(host, port)]; ValueError naming the part that is not one."""
    out: list[tuple[str, int]] = []
    for part in (p.strip() for p in spec.split(",")):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{part!r} is not host:port (e.g. 127.0.0.1:26379)")
        out.append((host.strip("[]"), int(port)))
    return out


def make_sentinel_client(
    sentinels: str, master: str, url: str | None = None, *, decode_responses: bool = True
) -> Redis:
    """A client of the primary the sentinels name now; after a promotion its next connection asks
    them again, so a command that failed on the dead primary is retried on the new one."""
    options: dict[str, Any] = {}
    if url:
        parsed = parse_url(url)  # type: ignore[no-untyped-call]
        options = {k: parsed[k] for k in ("db", "username", "password") if k in parsed}
    timeouts = {
        "socket_connect_timeout": TOPOLOGY_CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": TOPOLOGY_READ_TIMEOUT_SECONDS,
    }
    sentinel = Sentinel(parse_sentinels(sentinels), sentinel_kwargs=dict(timeouts), **timeouts)  # type: ignore[no-untyped-call]
    primary = sentinel.master_for(  # type: ignore[no-untyped-call]
        master,
        decode_responses=decode_responses,
        socket_keepalive=True,
        retry=_failover_retry(),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        **options,
    )
    return cast("Redis", primary)


class Topology(Protocol):
    """The settings that say where Redis is (shared/config.py `Settings`)."""

    redis_url: str | None
    redis_cluster: bool
    redis_sentinels: str | None
    redis_sentinel_master: str | None


def connect_from(settings: Topology, *, decode_responses: bool = True) -> Redis:
    """The client for this process's Redis: one server, a Cluster or a Sentinel-managed primary."""
    if settings.redis_sentinels:
        return make_sentinel_client(
            settings.redis_sentinels,
            settings.redis_sentinel_master or "",
            settings.redis_url,
            decode_responses=decode_responses,
        )
    url = resolve_redis_url(settings.redis_url)
    if settings.redis_cluster:
        return make_cluster_client(url, decode_responses=decode_responses)
    if decode_responses:
        return make_client(url)
    return Redis.from_url(
        url,
        socket_connect_timeout=TOPOLOGY_CONNECT_TIMEOUT_SECONDS,
        socket_timeout=TOPOLOGY_READ_TIMEOUT_SECONDS,
        retry=_failover_retry(),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)


def connect_async_from(settings: Topology, *, read_timeout: float) -> AsyncRedis:
    """The asyncio client for this process's Redis (`connect_async` on one server), whose read
    timeout outlasts the blocking reads made on it; on a Cluster each read names keys of one slot."""
    timeouts: dict[str, Any] = {
        "socket_connect_timeout": TOPOLOGY_CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": read_timeout,
    }
    if settings.redis_sentinels:
        sentinel = AsyncSentinel(parse_sentinels(settings.redis_sentinels), sentinel_kwargs=dict(timeouts))  # type: ignore[no-untyped-call]
        primary = sentinel.master_for(settings.redis_sentinel_master or "", decode_responses=True, **timeouts)
        return cast("AsyncRedis", primary)
    if settings.redis_cluster:
        url = resolve_redis_url(settings.redis_url)
        return cast("AsyncRedis", AsyncRedisCluster.from_url(url, decode_responses=True, **timeouts))
    return connect_async(settings.redis_url, read_timeout=read_timeout)


def _topology_client(client: object) -> bool:
    """A Cluster or Sentinel client: its pools are per node or per primary, not copied here."""
    return isinstance(client, RedisCluster) or isinstance(
        getattr(client, "connection_pool", None), SentinelConnectionPool
    )
