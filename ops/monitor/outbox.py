"""Handing finished tickets' callbacks from the queue's outbox to rq, losing none.

Each id is first moved atomically (LMOVE) from the outbox to a processing list; its rq job and its
removal from that list are then written in one transaction. A monitor that dies between the two
leaves the id in the processing list, and the next drain hands it over again; the job id is stable,
so that re-handover replaces the job rather than delivering twice.
"""

from __future__ import annotations

from typing import cast

from redis import Redis
from rq import Queue

from ops.monitor.dispatch import JobOptions, callback_job
from shared.keys import QueueKeys

MOVE_BATCH = 100


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class OutboxDrainer:
    """Moves callback ids of one queue into the rq callbacks queue."""

    def __init__(
        self, rq_conn: Redis, queue_name: str, options: JobOptions, queue_conn: Redis | None = None
    ) -> None:
        self.rq_conn = rq_conn
        self.queue_conn = queue_conn
        """The queue's Redis when rq's is another one (a Cluster); None when they are the same."""
        self.queue_name = queue_name
        self.keys = QueueKeys(queue_name)
        self.options = options
        self.rq_queue = Queue(options.callbacks_queue, connection=rq_conn)

    def drain(self, limit: int = 500) -> int:
        """Hand over ids left by an earlier crash, then up to `limit` new ones; returns how many."""
        leftovers = [
            _text(v) for v in cast("list[bytes]", self._queue.lrange(self.keys.outbox_processing, 0, -1))
        ]
        handed = self._hand_over(leftovers) if leftovers else 0
        while handed < limit:
            pipe = self._queue.pipeline(transaction=False)
            for _ in range(min(MOVE_BATCH, limit - handed)):
                pipe.lmove(self.keys.outbox, self.keys.outbox_processing, "RIGHT", "LEFT")
            moved = [_text(v) for v in pipe.execute() if v is not None]
            if not moved:
                break
            handed += self._hand_over(moved)
        return handed

    @property
    def _queue(self) -> Redis:
        return self.queue_conn if self.queue_conn is not None else self.rq_conn

    def _hand_over(self, ticket_ids: list[str]) -> int:
        jobs = [callback_job(self.queue_name, ticket_id, self.options) for ticket_id in ticket_ids]
        if self.queue_conn is not None:
            # Two Redis, no shared transaction: the jobs first, then the ids leave the processing list;
            # a crash in between hands them over again, under the same job ids (rq replaces them).
            self.rq_queue.enqueue_many(jobs)
            pipe = self.queue_conn.pipeline(transaction=True)
        else:
            pipe = self.rq_conn.pipeline(transaction=True)
            self.rq_queue.enqueue_many(jobs, pipeline=pipe)
        for ticket_id in ticket_ids:
            pipe.lrem(self.keys.outbox_processing, 1, ticket_id)
        pipe.execute()
        return len(ticket_ids)
