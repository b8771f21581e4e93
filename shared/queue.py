"""TicketQueue: every state change of a ticket, each one atomic in Redis (see shared/lua/).

Producers call `enqueue`/`enqueue_many`/`cancel`; workers `claim`, `extend`,
`finish`, `retry`; any process may `reap` (lock-guarded) and read `get`/`stats`.

Submitting, claiming and reaping are here; the writes on a held ticket (`extend`, `finish`, `retry`,
`preempt`) are in shared/queue_leases.py and the reads in shared/queue_reads.py. TicketQueue inherits
both, so callers hold one object and import every name of the queue from this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from shared import clock, tracing
from shared.keys import WAKE_LIST_CAP, QueueKeys
from shared.models import Ticket, TicketRequest, TicketStatus
from shared.policy import Policy
from shared.queue_leases import FinishItemError, Outcome, QueueLeases
from shared.queue_reads import QueueHead, QueueReads, QueueStats
from shared.redis_conn import blocking_client
from shared.scripts import Scripts
from shared.shed import ShedCode
from shared.slot_server import on_slot_server
from shared.submission import EnqueueItemError, EnqueueResult, Submission
from shared.ticket_builder import EnqueueOptions

MAX_BLOCK_SECONDS = 10.0
"""The longest blocking wait for work, so a lost connection is noticed within it."""

__all__ = [
    "ClaimedTicket",
    "EnqueueItemError",
    "EnqueueOptions",
    "EnqueueResult",
    "FinishItemError",
    "Outcome",
    "QueueHead",
    "QueueStats",
    "ReapResult",
    "TicketQueue",
]


@dataclass(frozen=True)
class ClaimedTicket:
    ticket: Ticket
    token: str


@dataclass(frozen=True)
class _ClaimFrame:
    """What a claim sends that depends only on the queue and its policy (shared/lua/claim.lua's
    KEYS and the arguments around the per-call ones), built once per policy, not per claim."""

    policy: Policy
    keys: list[str]
    types: list[Any]
    """The retention spec, the number of types and their names."""
    tail: list[Any]
    """The fairness weights and the critical types."""

    @classmethod
    def build(cls, keys: QueueKeys, policy: Policy) -> _ClaimFrame:
        types = policy.type_names
        return cls(
            policy,
            [
                keys.pending,
                keys.delayed,
                keys.deadlines,
                keys.inflight,
                keys.counts,
                keys.token_seq,
                keys.outbox,
                keys.ticket_prefix,
                *[keys.waiting(t) for t in types],
                *[keys.branch_depth(t) for t in types],
                *[keys.branch_service(t) for t in types],
                *[keys.branch_tokens(t) for t in types],
            ],
            [policy.queue.retention_spec, len(types), *types],
            [*policy.fairness.cost_args(), *policy.critical_types],
        )


@dataclass(frozen=True)
class ReapResult:
    swept: bool
    requeued: int = 0
    failed: int = 0
    expired: int = 0
    promoted: int = 0


def _name_outcome(span: Any, results: Sequence[EnqueueResult]) -> None:
    """A one-ticket span names its ticket and outcome (None: tracing is off)."""
    if span is not None and len(results) == 1:
        span.set_attribute("tidegate.ticket_id", results[0].ticket_id)
        span.set_attribute("tidegate.outcome", results[0].outcome)


class TicketQueue(QueueLeases, QueueReads):
    def __init__(
        self, redis: Redis, policy: Policy, queue_name: str = "default", *, replica_acks: int = 0
    ) -> None:
        self.redis = redis
        self.policy = policy
        self.keys = QueueKeys(queue_name)
        self.scripts = Scripts.register(redis)
        self.submission = Submission(policy, self.keys, self.scripts)
        self._blocking: Redis | None = None
        self._claim_frame: _ClaimFrame | None = None
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
    ) -> list[ClaimedTicket]:
        """Lease up to `max_count` tickets in priority order, within `token_budget` (0 = none).

        `normal_count` and `normal_budget` (default: the whole count and budget) bound the tickets
        of types the policy does not mark `critical`; the rest is headroom only critical tickets at
        the head of the queue may take.
        """
        if max_count < 1:
            return []
        frame = self._claim_frame
        if frame is None or frame.policy is not self.policy:
            frame = self._claim_frame = _ClaimFrame.build(self.keys, self.policy)
        claimed, _expired = self.scripts.claim(
            keys=frame.keys,
            args=[
                repr(clock.now()),
                max_count,
                lease_seconds or self.policy.queue.lease_seconds,
                worker_id,
                token_budget,
                "1" if take_first_over_budget else "0",
                *frame.types,
                max_count if normal_count is None else min(normal_count, max_count),
                token_budget if normal_budget is None else min(normal_budget, token_budget),
                *frame.tail,
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
