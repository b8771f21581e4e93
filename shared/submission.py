"""Submitting tickets: the stored form of a request, and the enqueue script that queues it or records
it `rejected`. `TicketQueue.enqueue_many` is the way in; this module holds what it builds and returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from shared import clock, tracing
from shared.ids import new_ticket_id
from shared.keys import WAKE_LIST_CAP, QueueKeys
from shared.models import Ticket, TicketRequest, TicketStatus
from shared.policy import Policy, RetainedOutcome
from shared.replica_acks import add_wait, check_acks
from shared.scoring import effective_priority, queue_score
from shared.scripts import Scripts
from shared.shed import ShedCode, shed_cause
from shared.shed_log import shed_minute

EnqueueOutcome = Literal["queued", "existing", "rejected"]

LEAN_FIELDS = (
    "type",
    "branch_id",
    "priority",
    "max_tokens",
    "ttl_seconds",
    "idempotency_key",
    "prompt_chars",
    "prompt_digest",
    "created_at",
    "expires_at",
)
"""What a rejected record keeps: what its submitter and the books need, never the prompt. Every value
stays short, so Redis keeps the record in its compact hash encoding; its words are looked up from
its shed code when it is read."""


@dataclass(frozen=True)
class EnqueueResult:
    outcome: EnqueueOutcome
    ticket_id: str
    ticket: Ticket | None = None
    """The stored ticket for new and rejected tickets; None for `existing` (read it with `get`)."""
    code: ShedCode | None = None
    """Why a rejected ticket was shed."""


@dataclass(frozen=True)
class EnqueueOptions:
    """What admission decided for one ticket: shed with a code, or admitted with degrade options."""

    route: str | None = None
    defer_seconds: float = 0.0
    shed: ShedCode | None = None
    retry_after: float = 0.0


class Submission:
    """Builds tickets from requests and submits them through the enqueue script of one queue."""

    def __init__(self, policy: Policy, keys: QueueKeys, scripts: Scripts) -> None:
        self.policy = policy
        self.keys = keys
        self.scripts = scripts

    def build_ticket(self, request: TicketRequest, *, now: float | None = None) -> Ticket:
        """The stored form of a validated request: priority, TTL, limits filled in from policy."""
        created = clock.now() if now is None else now
        type_policy = self.policy.type_policy(request.type)
        ttl = request.ttl_seconds or type_policy.ttl_seconds
        return Ticket(
            id=new_ticket_id(),
            type=request.type,
            branch_id=request.branch_id,
            status=TicketStatus.QUEUED,
            priority=effective_priority(
                type_policy,
                urgent_level=request.urgent_level,
                vip_level=request.vip_level,
                is_bulk=request.is_bulk,
            ),
            prompt=request.prompt,
            messages=request.messages,
            max_tokens=request.max_tokens or self.policy.queue.default_max_tokens,
            urgent_level=request.urgent_level,
            vip_level=request.vip_level,
            is_bulk=request.is_bulk,
            ttl_seconds=ttl,
            idempotency_key=request.idempotency_key,
            callback_url=str(request.callback_url) if request.callback_url else None,
            live=request.live,
            sampling=request.sampling,
            prompt_tokens_estimate=request.prompt_tokens_estimate,
            prompt_chars=request.prompt_chars,
            prompt_digest=request.prompt_digest,
            created_at=created,
            expires_at=created + ttl,
            max_attempts=self.policy.queue.max_attempts,
            traceparent=tracing.current_traceparent(),
        )

    def shed_words(self, code: ShedCode, ticket_type: str) -> str:
        """The stored reason for a shed ticket: the words for its code (shared/shed.py)."""
        cap = self.policy.type_policy(ticket_type).cap
        return shed_cause(code, ticket_type, critical_types=self.policy.critical_types, cap=cap)

    def _enqueue_call(self, ticket: Ticket, options: EnqueueOptions, client: Any) -> Any:
        fields = ticket.to_redis()
        del fields["id"], fields["status"]
        fields["cost"] = str(ticket.cost_tokens)
        lean = [item for name in LEAN_FIELDS if name in fields for item in (name, fields.pop(name))]
        rest = [item for pair in fields.items() for item in pair]
        idem_key = ticket.idempotency_key or ""
        queue = self.policy.queue
        return self.scripts.enqueue(
            keys=[
                self.keys.ticket(ticket.id),
                self.keys.pending,
                self.keys.deadlines,
                self.keys.waiting(ticket.type),
                self.keys.idempotency(ticket.branch_id, idem_key or "-"),
                self.keys.counts,
                self.keys.wake,
                self.keys.delayed,
                self.keys.ticket_prefix,
                self.keys.branch_depth(ticket.type),
                self.keys.sheds(shed_minute(ticket.created_at)),
            ],
            args=[
                ticket.id,
                ticket.type,
                repr(queue_score(ticket.priority, ticket.created_at, queue.aging_seconds)),
                repr(ticket.created_at),
                repr(ticket.expires_at),
                idem_key,
                self.policy.type_policy(ticket.type).cap,
                self._idempotency_seconds,
                repr(ticket.created_at + max(options.defer_seconds, 0.0)),
                options.shed.value if options.shed else "",
                self.shed_words(options.shed, ticket.type) if options.shed else "",
                self.shed_words(ShedCode.TYPE_CAP, ticket.type),
                queue.rejected_retention_seconds,
                repr(options.retry_after),
                WAKE_LIST_CAP,
                len(lean) // 2,
                *lean,
                *rest,
            ],
            client=client,
        )

    def _result(self, ticket: Ticket, options: EnqueueOptions, raw: Sequence[str]) -> EnqueueResult:
        outcome, ticket_id = raw[0], raw[1]
        if outcome == "existing":
            return EnqueueResult("existing", ticket_id)
        if outcome == "rejected":  # what the script stored: the lean record, its code and words
            code = ShedCode.parse(raw[2])
            words = raw[3] or self.shed_words(code, ticket.type)  # the fair-share rule leaves them to us
            update = {
                "id": ticket_id,
                "status": TicketStatus.REJECTED,
                "error": words,
                "shed_code": code.value,
                "retry_after": options.retry_after,
                "finished_at": ticket.created_at,
                "prompt_tokens_estimate": 0,
                "urgent_level": 0,
                "vip_level": 0,
                "is_bulk": False,
                "prompt": None,
                "messages": None,
            }
            return EnqueueResult("rejected", ticket_id, ticket.model_copy(update=update), code)
        queued = ticket if ticket_id == ticket.id else ticket.model_copy(update={"id": ticket_id})
        return EnqueueResult("queued", ticket_id, queued)

    def _prepared(self, request: TicketRequest, options: EnqueueOptions) -> Ticket:
        ticket = self.build_ticket(request)
        return ticket.model_copy(update={"route": options.route}) if options.route else ticket

    @cached_property
    def _idempotency_seconds(self) -> int:
        outcomes: tuple[RetainedOutcome, ...] = ("done", "failed", "expired", "cancelled")
        return max(self.policy.queue.retention_for(o) for o in outcomes)

    def submit_many(
        self,
        client: Any,
        requests: Sequence[TicketRequest],
        options: Sequence[EnqueueOptions],
        replica_acks: int = 0,
    ) -> list[EnqueueResult]:
        """Submit many tickets in one pipelined round trip; each is still atomic on its own.

        With `replica_acks` the pipeline ends with WAIT (shared/replica_acks.py) and raises
        ReplicaAcksMissing unless that many replicas hold the writes.
        """
        tickets = [self._prepared(r, o) for r, o in zip(requests, options, strict=True)]
        pipe = client.pipeline(transaction=False)
        for ticket, o in zip(tickets, options, strict=True):
            self._enqueue_call(ticket, o, pipe)
        if replica_acks:
            add_wait(pipe, replica_acks)
        raws = pipe.execute()
        if replica_acks:
            check_acks(raws.pop(), replica_acks)
        return [self._result(t, o, raw) for t, o, raw in zip(tickets, options, raws, strict=True)]
