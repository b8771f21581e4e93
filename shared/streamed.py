"""Sending a run of commands on one connection while the later ones are still being built.

A redis-py pipeline sends nothing until every command is packed; here each command goes out as soon
as it is ready, so Redis runs the first while the client builds the next, and the replies are read
at the end: one round trip in all, as with a pipeline, but the client's and the server's work
overlap. A connection error is retried as redis-py retries a non-transactional pipeline (the whole
run again on a fresh connection); error replies come back in place, as exceptions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import hiredis
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ResponseError


def send_streamed(server: Redis, commands: Iterable[Sequence[Any]]) -> list[Any]:
    """Each command's reply (or its ResponseError), in order; `commands` is consumed once."""
    source = iter(commands)
    built: list[Sequence[Any]] = []
    pool = server.connection_pool
    connection: Any = pool.get_connection()  # redis-py's connections are untyped

    def run() -> list[Any]:
        for command in built:
            connection.send_command(*command)
        for command in source:
            built.append(command)
            connection.send_command(*command)
        replies: list[Any] = []
        for _ in built:
            try:
                replies.append(connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies

    try:
        replies: list[Any] = connection.retry.call_with_retry(run, lambda _error: connection.disconnect())
        return replies
    finally:
        pool.release(connection)


async def call_packed(client: AsyncRedis, command: Sequence[Any]) -> Any:
    """One command on an asyncio client, packed by hiredis (C) rather than redis.asyncio's
    Python packer, which costs more than the rest of a submission for a script call's many
    arguments. Retried on a connection error as the client itself would; an error reply raises.
    A Cluster client (a pool per node, no one pool) sends it the ordinary way."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return await cast("Any", client).execute_command(*command)
    packed = hiredis.pack_command(tuple(command))
    connection: Any = await pool.get_connection()

    async def send() -> Any:
        await connection.send_packed_command(packed)
        return await connection.read_response()

    async def failed(_error: Exception) -> None:
        await connection.disconnect()

    try:
        return await connection.retry.call_with_retry(send, failed)
    finally:
        await pool.release(connection)
