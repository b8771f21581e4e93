"""Waiting for replicas before a ticket is acknowledged (`TIDEGATE_REPLICA_ACKS=N`).

Redis replicates asynchronously: a primary that dies right after answering can take the last
writes with it, and the promoted replica never saw them. WAIT N blocks until N replicas have
every write sent earlier *on the same connection*, so it is sent in the submitting pipeline, on
the server that holds the queue (on a Cluster: the master of the queue's slot, shared/slot_server.py). A WAIT that times
out with fewer replicas raises `ReplicaAcksMissing`: the ticket may or may not survive a failover,
so it is not acknowledged, and a retry with the same idempotency key finds it if it did.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.commands.core import Script

from shared.slot_server import on_slot_server

WAIT_TIMEOUT_MS = 1000
"""Longest wait for the replicas; below every client's read timeout."""


class ReplicaAcksMissing(redis.RedisError):
    """Fewer replicas than asked confirmed the write before WAIT timed out."""

    def __init__(self, wanted: int, got: int) -> None:
        super().__init__(
            f"replica_acks: {got} of {wanted} replicas confirmed the write within {WAIT_TIMEOUT_MS} ms"
        )
        self.wanted = wanted
        self.got = got


def wait_command(replicas: int) -> list[Any]:
    """WAIT for `replicas`: sent last on a connection, it covers every write sent before it."""
    return ["WAIT", replicas, WAIT_TIMEOUT_MS]


def add_wait(pipe: Any, replicas: int) -> None:
    """End `pipe` with WAIT, so it covers every write queued before it."""
    pipe.execute_command(*wait_command(replicas))


def check_acks(reply: object, replicas: int) -> None:
    got = int(str(reply))
    if got < replicas:
        raise ReplicaAcksMissing(replicas, got)


def run_acked(client: Any, replicas: int, script: Script, keys: list[str], args: list[Any]) -> Any:
    """Run one script; with `replicas`, WAIT on its connection too (on the server holding its keys),
    so an outcome reported written survives the loss of the primary."""
    if not replicas:
        return script(keys=keys, args=args)

    def send(server: Any) -> Any:
        pipe = server.pipeline(transaction=False)
        script(keys=keys, args=args, client=pipe)
        add_wait(pipe, replicas)
        reply, acks = pipe.execute()
        check_acks(acks, replicas)
        return reply

    return on_slot_server(client, keys[0], send)
