"""TicketQueue: every state change of a ticket, each one atomic in Redis (see shared/lua/).

Producers call `enqueue`/`enqueue_many`/`cancel`; workers `claim`, `extend`,
`finish`, `retry`; any process may `reap` (lock-guarded) and read `get`/`stats`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from shared import backoff, clock, tracing
from shared.keys import WAKE_LIST_CAP, QueueKeys
from shared.models import Ticket, TicketRequest, TicketStatus
from shared.policy import Policy
from shared.redis_conn import blocking_client
from shared.rejected import read_rejected
from shared.replica_acks import run_acked
from shared.scripts import Scripts
from shared.shed import ShedCode
from shared.slot_server import on_slot_server
from shared.submission import EnqueueItemError, EnqueueOptions, EnqueueResult, Submission

MAX_BLOCK_SECONDS = 10.0
"""The longest blocking wait for work, so a lost connection is noticed within it."""

__all__ = [
    "ClaimedTicket",
    "EnqueueItemError",
    "EnqueueOptions",
    "EnqueueResult",
    "FinishItemError",
    "Outcome",
    "QueueStats",
    "ReapResult",
    "TicketQueue",
]


@dataclass(frozen=True)
class ClaimedTicket:
    ticket: Ticket
    token: str


@dataclass(frozen=True)
class Outcome:
    """A running ticket's end, as its worker writes it (fenced by the claim's token)."""

    ticket_id: str
    token: str
    status: Literal["done", "failed", "expired"]
    """`expired`: not started, its deadline could no longer be met (counted `<type>:deadline_passed`)."""
    result: str | None = None
    usage: dict[str, Any] | None = None
    error: str = ""
    extra: dict[str, str] | None = None

    def arguments(self) -> list[str]:
        """This ticket's values for the finish script: id, token, status, error, its fields."""
        fields: dict[str, str] = dict(self.extra or {})
        if self.result is not None:
            fields["result"] = self.result
        if self.usage is not None:
            fields["usage"] = json.dumps(self.usage, separators=(",", ":"))
        flat = [item for pair in fields.items() for item in pair]
        return [self.ticket_id, self.token, self.status, self.error, str(len(fields)), *flat]


class FinishItemError(ValueError):
    """One outcome of a batch cannot be written; nothing of the batch was."""

    def __init__(self, index: int, ticket_id: str, field: str, message: str) -> None:
        super().__init__(f"outcome {index} of the batch (ticket {ticket_id}): {field}: {message}")
        self.index = index
        self.ticket_id = ticket_id
        self.field = field


@dataclass(frozen=True)
class ReapResult:
    swept: bool
    requeued: int = 0
    failed: int = 0
    expired: int = 0
    promoted: int = 0


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


def _name_outcome(span: Any, results: Sequence[EnqueueResult]) -> None:
    """A one-ticket span names its ticket and outcome (None: tracing is off)."""
    if span is not None and len(results) == 1:
        span.set_attribute("tidegate.ticket_id", results[0].ticket_id)
        span.set_attribute("tidegate.outcome", results[0].outcome)


@dataclass(frozen=True)
class QueueHead:
    """The next ticket a claim would take: its type, and when it was submitted (Unix seconds)."""

    type: str
    created_at: float


class TicketQueue:
    def __init__(
        self, redis: Redis, policy: Policy, queue_name: str = "default", *, replica_acks: int = 0
    ) -> None:
        self.redis = redis
        self.policy = policy
        self.keys = QueueKeys(queue_name)
        self.scripts = Scripts.register(redis)
        self.submission = Submission(policy, self.keys, self.scripts)
        self._blocking: Redis | None = None
        self.replica_acks = replica_acks
        """Replicas that must hold a submission before it returns (shared/replica_acks.py)."""

    # ---- producer side --------------------------------------------------------------------
    def build_ticket(self, request: TicketRequest, *, now: float | None = None) -> Ticket:
        """The stored form of a validated request: priority, TTL, limits filled in from policy."""
        return self.submission.build_ticket(request, now=now)

    def shed_words(self, code: ShedCode, ticket_type: str) -> str:
        """The stored reason for a shed ticket: the words for its code (shared/shed.py)."""
        return self.submission.shed_words(code, ticket_type)

    def enqueue(self, request: TicketRequest, options: EnqueueOptions | None = None) -> EnqueueResult:
        """Queue one ticket, record it `rejected` when shed, or return the earlier one with its key."""
        return self.enqueue_many([request], [options or EnqueueOptions()])[0]

    def enqueue_many(
        self, requests: Sequence[TicketRequest], options: Sequence[EnqueueOptions] | None = None
    ) -> list[EnqueueResult]:
        """Submit many tickets in one round trip (shared/submission.py: chunks of one script call each,
        every ticket queued, existing or rejected on its own; EnqueueItemError names a refused one)."""
        opts = list(options) if options is not None else [EnqueueOptions()] * len(requests)
        with tracing.span(
            "tidegate.enqueue", kind="producer", attributes=self._span_attributes(requests)
        ) as span:
            results = on_slot_server(
                self.redis,
                self.keys.pending,
                lambda server: self.submission.submit_many(server, requests, opts, self.replica_acks),
            )
            _name_outcome(span, results)
        return results

    async def enqueue_async(
        self, client: AsyncRedis, request: TicketRequest, options: EnqueueOptions | None = None
    ) -> EnqueueResult:
        """`enqueue` on an asyncio client of this queue's Redis, for a request handled on an event loop."""
        with tracing.span(
            "tidegate.enqueue", kind="producer", attributes=self._span_attributes([request])
        ) as span:
            results = await self.submission.submit_many_async(
                client, [request], [options or EnqueueOptions()]
            )
            _name_outcome(span, results)
        return results[0]

    def _span_attributes(self, requests: Sequence[TicketRequest]) -> tracing.Attributes:
        return {"db.system": "redis", "tidegate.queue": self.keys.queue, "tidegate.tickets": len(requests)}

    def cancel(self, ticket_id: str, reason: str = "cancelled by its branch") -> str:
        """Cancel; returns the status before ("queued"/"running" → now cancelled) or "missing".
        A shed ticket has ended already: "rejected", and nothing changes."""
        previous = self._cancel_call(ticket_id, reason)
        if previous == "missing" and self._rejected([ticket_id])[0] is not None:
            return TicketStatus.REJECTED.value
        return previous

    def _cancel_call(self, ticket_id: str, reason: str) -> str:
        types = self.policy.type_names
        return str(
            self.scripts.cancel(
                keys=[
                    self.keys.ticket(ticket_id),
                    self.keys.pending,
                    self.keys.delayed,
                    self.keys.deadlines,
                    self.keys.inflight,
                    self.keys.counts,
                    self.keys.outbox,
                    *[self.keys.waiting(t) for t in types],
                    *[self.keys.branch_depth(t) for t in types],
                    *[self.keys.branch_tokens(t) for t in types],
                ],
                args=[
                    ticket_id,
                    repr(clock.now()),
                    self.policy.queue.retention_spec,
                    reason,
                    len(types),
                    *types,
                ],
            )
        )

    # ---- worker side ----------------------------------------------------------------------
    def claim(
        self,
        worker_id: str,
        max_count: int,
        *,
        lease_seconds: float | None = None,
        token_budget: int = 0,
        take_first_over_budget: bool = True,
        normal_count: int | None = None,
        normal_budget: int | None = None,
        normal_prompt_budget: int = 0,
        normal_prompt_first_over: bool = True,
    ) -> list[ClaimedTicket]:
        """Lease up to `max_count` tickets in priority order, within `token_budget` (0 = none).

        `normal_count` and `normal_budget` (default: the whole count and budget) bound the tickets
        of types the policy does not mark `critical`; the rest is headroom only critical tickets at
        the head of the queue may take. `normal_prompt_budget` (0 = none) bounds their prompt
        tokens (the prefill guard); `normal_prompt_first_over` lets the first of them exceed it.
        """
        if max_count < 1:
            return []
        types = self.policy.type_names
        critical = self.policy.critical_types
        claimed, _expired = self.scripts.claim(
            keys=[
                self.keys.pending,
                self.keys.delayed,
                self.keys.deadlines,
                self.keys.inflight,
                self.keys.counts,
                self.keys.token_seq,
                self.keys.outbox,
                self.keys.ticket_prefix,
                *[self.keys.waiting(t) for t in types],
                *[self.keys.branch_depth(t) for t in types],
                *[self.keys.branch_service(t) for t in types],
                *[self.keys.branch_tokens(t) for t in types],
            ],
            args=[
                repr(clock.now()),
                max_count,
                lease_seconds or self.policy.queue.lease_seconds,
                worker_id,
                token_budget,
                "1" if take_first_over_budget else "0",
                self.policy.queue.retention_spec,
                len(types),
                *types,
                max_count if normal_count is None else min(normal_count, max_count),
                token_budget if normal_budget is None else min(normal_budget, token_budget),
                max(normal_prompt_budget, 0),
                "1" if normal_prompt_first_over else "0",
                *self.policy.fairness.cost_args(),
                *critical,
            ],
        )
        out = []
        for flat in claimed:
            raw = dict(zip(flat[::2], flat[1::2], strict=True))
            out.append(ClaimedTicket(Ticket.from_redis(raw), raw["token"]))
        return out

    def wait_for_work(self, timeout: float) -> bool:
        """Block (no polling) until a producer signals new work or `timeout` seconds pass.

        At most `MAX_BLOCK_SECONDS`, on a client of its own whose read timeout covers that wait,
        so the pop neither trips the ordinary read timeout nor hangs on a stalled Redis.
        """
        if self._blocking is None:
            self._blocking = blocking_client(self.redis, MAX_BLOCK_SECONDS)
        wait = min(max(timeout, 0.01), MAX_BLOCK_SECONDS)
        return self._blocking.blpop([self.keys.wake], timeout=wait) is not None

    def close(self) -> None:
        """Close the blocking pop's client (the caller owns `redis`, which a Cluster or Sentinel
        client's pops share: that one is left open)."""
        if self._blocking is not None and self._blocking is not self.redis:
            self._blocking.close()
        self._blocking = None

    def wake_workers(self) -> None:
        """Leave one wake-up marker, as a new ticket does, so an idle worker looks at the queue now."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.lpush(self.keys.wake, "1")
        pipe.ltrim(self.keys.wake, 0, WAKE_LIST_CAP - 1)
        pipe.execute()

    def extend(self, ticket_id: str, token: str, lease_seconds: float | None = None) -> str:
        """Renew a lease; "ok", or "stale:<status>" when the caller must stop working on it."""
        return str(
            self.scripts.extend(
                keys=[self.keys.ticket(ticket_id), self.keys.inflight],
                args=[ticket_id, token, repr(clock.now()), lease_seconds or self.policy.queue.lease_seconds],
            )
        )

    def extend_many(
        self, leases: Sequence[tuple[str, str]], lease_seconds: float | None = None
    ) -> dict[str, str]:
        """Renew many leases in one round trip: {ticket id: "ok" | "stale:<status>"}."""
        if not leases:
            return {}
        now = repr(clock.now())
        seconds = lease_seconds or self.policy.queue.lease_seconds

        def send(server: Redis) -> list[Any]:
            pipe = server.pipeline(transaction=False)
            for ticket_id, token in leases:
                self.scripts.extend(
                    keys=[self.keys.ticket(ticket_id), self.keys.inflight],
                    args=[ticket_id, token, now, seconds],
                    client=pipe,
                )
            return pipe.execute()

        replies = on_slot_server(self.redis, self.keys.inflight, send)
        return {tid: str(r) for (tid, _), r in zip(leases, replies, strict=True)}

    def finish(
        self,
        ticket_id: str,
        token: str,
        status: Literal["done", "failed", "expired"],
        *,
        result: str | None = None,
        usage: dict[str, Any] | None = None,
        error: str = "",
        extra: dict[str, str] | None = None,
    ) -> bool:
        """Write the outcome; False when the lease was lost (the answer is then not written)."""
        outcome = Outcome(ticket_id, token, status, result=result, usage=usage, error=error, extra=extra)
        return self.finish_many([outcome])[0] == "ok"

    def finish_many(self, outcomes: Sequence[Outcome]) -> list[str]:
        """Write many outcomes in one round trip, each fenced by its own token: per ticket "ok", or
        "stale:<status>" when its lease was lost (that answer is not written; the others are).

        A bad value (a status other than done or failed) refuses the whole call before anything is
        written: FinishItemError names the ticket and the field.
        """
        if not outcomes:
            return []
        args: list[Any] = [repr(clock.now()), self.policy.queue.retention_spec]
        for index, outcome in enumerate(outcomes):
            if outcome.status not in ("done", "failed", "expired"):
                raise FinishItemError(
                    index, outcome.ticket_id, "status", f"{outcome.status!r} is not done, failed or expired"
                )
            args.extend(outcome.arguments())
        keys = [self.keys.inflight, self.keys.counts, self.keys.outbox, self.keys.ticket_prefix]
        reply = run_acked(self.redis, self.replica_acks, self.scripts.finish, keys, args)
        return [str(r) for r in reply]

    def backoff_seconds(self, attempts: int) -> float:
        """How long a ticket waits before its next attempt (shared/backoff.py), so retries of a
        failed vLLM spread out."""
        q = self.policy.queue
        return backoff.full_jitter(attempts, q.retry_backoff_seconds, q.retry_backoff_max_seconds)

    def retry(
        self,
        ticket_id: str,
        token: str,
        ticket_type: str,
        error: str,
        *,
        backoff: float | None = None,
        count_attempt: bool = True,
        attempts: int = 1,
    ) -> str:
        """Give a ticket back after a transient failure: "retry" | "failed" | "expired" | "stale:…"."""
        delay = self.backoff_seconds(attempts) if backoff is None else backoff
        return str(
            self.scripts.retry(
                keys=[
                    self.keys.ticket(ticket_id),
                    self.keys.inflight,
                    self.keys.delayed,
                    self.keys.deadlines,
                    self.keys.waiting(ticket_type),
                    self.keys.counts,
                    self.keys.outbox,
                    self.keys.pending,
                    self.keys.branch_depth(ticket_type),
                    self.keys.branch_tokens(ticket_type),
                ],
                args=[
                    ticket_id,
                    token,
                    repr(clock.now()),
                    repr(delay),
                    error,
                    self.policy.queue.retention_spec,
                    "0" if count_attempt else "1",
                ],
            )
        )

    def preempt(
        self, ticket_id: str, token: str, ticket_type: str, reason: str, *, max_preemptions: int
    ) -> str:
        """Put a running ticket back at its score to make room for a critical one (no attempt used):
        "requeued" | "exhausted" (preempted `max_preemptions` times: left running) | "expired" | "stale:…"."""
        return str(
            self.scripts.preempt(
                keys=[
                    self.keys.ticket(ticket_id),
                    self.keys.inflight,
                    self.keys.pending,
                    self.keys.deadlines,
                    self.keys.waiting(ticket_type),
                    self.keys.branch_depth(ticket_type),
                    self.keys.counts,
                    self.keys.outbox,
                    self.keys.wake,
                    self.keys.branch_tokens(ticket_type),
                ],
                args=[
                    ticket_id,
                    token,
                    repr(clock.now()),
                    max_preemptions,
                    reason,
                    self.policy.queue.retention_spec,
                    WAKE_LIST_CAP,
                ],
            )
        )

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

    # ---- maintenance ------------------------------------------------------------------------
    def reap(self, owner: str, interval_seconds: float = 1.0, limit: int = 1000) -> ReapResult:
        """Sweep dead leases, TTLs and due retries, at most once per `interval_seconds` overall."""
        types = self.policy.type_names
        swept, requeued, failed, expired, promoted = self.scripts.reap(
            keys=[
                self.keys.reaper_lock,
                self.keys.inflight,
                self.keys.pending,
                self.keys.delayed,
                self.keys.deadlines,
                self.keys.counts,
                self.keys.outbox,
                self.keys.wake,
                self.keys.ticket_prefix,
                *[self.keys.waiting(t) for t in types],
                *[self.keys.branch_depth(t) for t in types],
                *[self.keys.branch_tokens(t) for t in types],
            ],
            args=[
                repr(clock.now()),
                owner,
                max(int(interval_seconds * 1000), 1),
                self.policy.queue.retention_spec,
                limit,
                len(types),
                *types,
                WAKE_LIST_CAP,
            ],
        )
        return ReapResult(bool(swept), requeued, failed, expired, promoted)

    # ---- reading ----------------------------------------------------------------------------
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
        words = self.shed_words(ShedCode.parse(ticket.shed_code), ticket.type)
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
