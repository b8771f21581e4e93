"""The Python producer: validate, admit, enqueue, read and cancel tickets directly on Redis.

Branch systems written in Python can use this in-process; the HTTP API and the CLI use it too, so
every path into the queue shares one validation and one admission rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from producer.admission import AdmissionController, Decision
from shared.config import Settings
from shared.errors import FieldError, TicketValidationError, field_errors
from shared.models import Ticket, TicketRequest, policy_problems
from shared.policy import Policy
from shared.queue import EnqueueResult, TicketQueue
from shared.redis_conn import connect_from
from shared.shed import ShedCode

SubmitOutcome = Literal["queued", "existing", "rejected"]


@dataclass(frozen=True)
class SubmitResult:
    outcome: SubmitOutcome
    ticket_id: str
    ticket: Ticket | None
    code: ShedCode | None = None
    """Why a rejected ticket was shed; its words are `reason`."""
    reason: str = ""
    retry_after: float | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome != "rejected"

    @property
    def shed_code(self) -> ShedCode | None:
        """The code a rejection answers with (HTTP, OpenAI and `enqueue --json` alike): its own; one
        recorded without a code answers as a type cap, as the HTTP answer always has."""
        if self.outcome != "rejected":
            return None
        return self.code or ShedCode.TYPE_CAP


class Producer:
    def __init__(
        self,
        redis: Redis,
        policy: Policy,
        queue_name: str = "default",
        *,
        fallback_configured: bool = False,
        admission_cache_seconds: float = 0.25,
        replica_acks: int = 0,
        async_redis: AsyncRedis | None = None,
    ) -> None:
        self.policy = policy
        self.async_redis = async_redis
        """The asyncio client `submit_async` sends on (its caller owns it); None: a thread instead."""
        self.queue = TicketQueue(redis, policy, queue_name, replica_acks=replica_acks)
        self.admission = AdmissionController(
            redis,
            policy,
            self.queue.keys,
            fallback_configured=fallback_configured,
            cache_seconds=admission_cache_seconds,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Producer:
        return cls(
            connect_from(settings),
            settings.policy,
            settings.queue_name,
            fallback_configured=bool(settings.fallback_vllm_url),
            replica_acks=settings.replica_acks,
        )

    def validate(self, data: Mapping[str, Any]) -> TicketRequest:
        """A request from untrusted data, or TicketValidationError naming each bad field."""
        try:
            return TicketRequest.model_validate(data, context={"policy": self.policy})
        except ValidationError as exc:
            raise TicketValidationError(field_errors(exc)) from None

    def check(self, request: TicketRequest) -> TicketRequest:
        """A request parsed without the policy (the HTTP body, one built in Python), checked against
        it without parsing it again; TicketValidationError names each rule it breaks."""
        problems = policy_problems(request, self.policy)
        if problems:
            raise TicketValidationError([FieldError(name, message) for name, message in problems])
        return request

    def submit(self, request: TicketRequest | Mapping[str, Any]) -> SubmitResult:
        """Admit and enqueue one ticket; a shed ticket is recorded as `rejected` with retry_after."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[TicketRequest | Mapping[str, Any]]) -> list[SubmitResult]:
        """Admit each ticket on its own merits, then submit all in one pipelined round trip: the
        enqueue script queues the admitted ones and records the shed ones (and any over its cap)."""
        validated = [self.check(r) if isinstance(r, TicketRequest) else self.validate(r) for r in requests]
        decisions = [self.admission.decide(r) for r in validated]
        enqueued = self.queue.enqueue_many(validated, [d.enqueue_options for d in decisions])
        for request, result, decision in zip(validated, enqueued, decisions, strict=True):
            self._note_cap(request, result, decision)
        return [_submit_result(e, d) for e, d in zip(enqueued, decisions, strict=True)]

    async def submit_async(self, request: TicketRequest) -> SubmitResult:
        """`submit` for a request handled on an event loop: the verdict comes from the cached
        control state and the ticket goes to Redis on the asyncio client, so a request costs no
        thread hop; a stale cache, or replicas to wait for, are dealt with on a thread instead."""
        validated = self.check(request)
        decision = self.admission.decide_cached(validated)
        if decision is None:
            decision = await asyncio.to_thread(self.admission.decide, validated)
        options = decision.enqueue_options
        if self.async_redis is None or self.queue.replica_acks:
            enqueued = await asyncio.to_thread(self.queue.enqueue, validated, options)
        else:
            enqueued = await self.queue.enqueue_async(self.async_redis, validated, options)
        self._note_cap(validated, enqueued, decision)
        return _submit_result(enqueued, decision)

    def _note_cap(self, request: TicketRequest, enqueued: EnqueueResult, decision: Decision) -> None:
        """Tell admission when the script refused, at the type's cap, a ticket admission had let
        through (never one admission refused itself, or the cap as last seen would renew itself)."""
        if decision.admitted and enqueued.code is ShedCode.TYPE_CAP:
            self.admission.saw_cap(request.type, request.branch_id)

    def get(self, ticket_id: str) -> Ticket | None:
        return self.queue.get(ticket_id)

    def cancel(self, ticket_id: str) -> str:
        """Cancel; returns the status before ("queued"/"running" → now cancelled) or "missing"."""
        return self.queue.cancel(ticket_id)


def _submit_result(enqueued: EnqueueResult, decision: Decision) -> SubmitResult:
    if enqueued.outcome != "rejected":
        return SubmitResult(enqueued.outcome, enqueued.ticket_id, enqueued.ticket)
    ticket = enqueued.ticket
    reason = ticket.error if ticket is not None and ticket.error else ""
    return SubmitResult(
        "rejected",
        enqueued.ticket_id,
        ticket,
        enqueued.code,
        reason,
        retry_after=decision.retry_after if enqueued.retry_after is None else enqueued.retry_after,
    )
