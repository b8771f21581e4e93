"""The read side of a TicketQueue: tickets by id, the queue's sizes, stats and head.

Apart from the writes so each file holds one job; TicketQueue (shared/queue.py) inherits it and sets
the attributes declared here, so callers still read and write through one object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis import Redis

from shared import clock
from shared.keys import QueueKeys
from shared.models import Ticket
from shared.policy import Policy
from shared.rejected import read_rejected
from shared.scripts import Scripts
from shared.shed import ShedCode
from shared.slot_server import on_slot_server
from shared.submission import Submission


@dataclass(frozen=True)
class QueueStats:
    depth_by_type: dict[str, int]
    oldest_age_by_type: dict[str, float]
    pending: int
    delayed: int
    inflight: int
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        """Total queued tickets (ready plus waiting out a retry backoff)."""
        return self.pending + self.delayed

    def outcome_count(self, ticket_type: str, outcome: str) -> int:
        return self.counts.get(f"{ticket_type}:{outcome}", 0)


@dataclass(frozen=True)
class QueueHead:
    """The next ticket a claim would take: its type, and when it was submitted (Unix seconds)."""

    type: str
    created_at: float


class QueueReads:
    """Reads of one queue; a read that finds a ticket past its deadline ends it (see `get`)."""

    redis: Redis
    policy: Policy
    keys: QueueKeys
    scripts: Scripts
    submission: Submission

    def head(self) -> QueueHead | None:
        """The ticket at the head of the pending set (None when it is empty): a full worker reads it
        to tell whether a critical ticket is waiting, and since when. Advisory, not atomic."""
        head = cast("list[str]", self.redis.zrange(self.keys.pending, 0, 0))
        if not head:
            return None
        ticket_type, created_at = cast(
            "list[str | None]", self.redis.hmget(self.keys.ticket(head[0]), ["type", "created_at"])
        )
        if ticket_type is None:
            return None
        return QueueHead(str(ticket_type), float(created_at) if created_at else clock.now())

    def _read_call(self, ticket_id: str, client: Any) -> Any:
        types = self.policy.type_names
        return self.scripts.read(
            keys=[
                self.keys.ticket(ticket_id),
                self.keys.pending,
                self.keys.delayed,
                self.keys.deadlines,
                self.keys.counts,
                self.keys.outbox,
                *[self.keys.waiting(t) for t in types],
                *[self.keys.branch_depth(t) for t in types],
                *[self.keys.branch_tokens(t) for t in types],
            ],
            args=[ticket_id, repr(clock.now()), self.policy.queue.retention_spec, len(types), *types],
            client=client,
        )

    def _from_flat(self, flat: Sequence[Any]) -> Ticket | None:
        if not flat:
            return None
        text = [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
        return self._from_redis(dict(zip(text[::2], text[1::2], strict=True)))

    def get(self, ticket_id: str) -> Ticket | None:
        """The ticket as it truly stands: one still queued past its deadline is ended `expired` by
        this read (atomically, as the reaper would), so no reader is told a dead ticket is alive.
        A shed one is read from its bucket (shared/rejected.py)."""
        ticket = self._from_flat(self._read_call(ticket_id, self.redis))
        return ticket if ticket is not None else self._rejected([ticket_id])[0]

    def _rejected(self, ticket_ids: Sequence[str]) -> list[Ticket | None]:
        """Each id's rejected record from its bucket, None where it has none."""
        raws = on_slot_server(
            self.redis, self.keys.pending, lambda server: read_rejected(server, self.keys, ticket_ids)
        )
        return [self._from_redis(raw) if raw is not None else None for raw in raws]

    def get_many(self, ticket_ids: Sequence[str]) -> list[Ticket | None]:
        def send(server: Redis) -> list[Any]:
            pipe = server.pipeline(transaction=False)
            for ticket_id in ticket_ids:
                self._read_call(ticket_id, pipe)
            return pipe.execute()

        tickets = [self._from_flat(flat) for flat in on_slot_server(self.redis, self.keys.pending, send)]
        missing = [i for i, ticket in enumerate(tickets) if ticket is None]
        for i, ticket in zip(missing, self._rejected([ticket_ids[i] for i in missing]), strict=True):
            tickets[i] = ticket
        return tickets

    def _from_redis(self, raw: dict[str, str]) -> Ticket:
        ticket = Ticket.from_redis(raw)
        if ticket.shed_code is None or ticket.error is not None:
            return ticket
        words = self.submission.shed_words(ShedCode.parse(ticket.shed_code), ticket.type)
        return ticket.model_copy(
            update={"error": words, "finished_at": ticket.finished_at or ticket.created_at}
        )

    def stats(self) -> QueueStats:
        """Depth and oldest age per type, in-flight and outcome counts, in one round trip."""
        types = self.policy.type_names
        pipe = self.redis.pipeline(transaction=False)
        for t in types:
            pipe.zcard(self.keys.waiting(t))
            pipe.zrange(self.keys.waiting(t), 0, 0, withscores=True)
        pipe.zcard(self.keys.pending)
        pipe.zcard(self.keys.delayed)
        pipe.zcard(self.keys.inflight)
        pipe.hgetall(self.keys.counts)
        replies = pipe.execute()
        now = clock.now()
        depth: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for i, t in enumerate(types):
            depth[t] = int(replies[2 * i])
            head = replies[2 * i + 1]
            oldest[t] = max(now - float(head[0][1]), 0.0) if head else 0.0
        pending, delayed, inflight, counts = replies[2 * len(types) :]
        return QueueStats(
            depth_by_type=depth,
            oldest_age_by_type=oldest,
            pending=int(pending),
            delayed=int(delayed),
            inflight=int(inflight),
            counts={k: int(v) for k, v in counts.items()},
        )

    def sizes(self) -> tuple[int, int, int]:
        """(pending, delayed, in flight) in one round trip: what an idle worker decides on."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.pending)
        pipe.zcard(self.keys.delayed)
        pipe.zcard(self.keys.inflight)
        pending, delayed, inflight = (int(n) for n in pipe.execute())
        return pending, delayed, inflight

    def seconds_until_next_retry(self) -> float | None:
        head = cast("list[tuple[str, float]]", self.redis.zrange(self.keys.delayed, 0, 0, withscores=True))
        return max(float(head[0][1]) - clock.now(), 0.0) if head else None
