"""The Python producer: validate, admit, enqueue, read and cancel tickets directly on Redis.

Branch systems written in Python can use this in-process; the HTTP API and the CLI use it too, so
every path into the queue shares one validation and one admission rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from redis import Redis

from producer.admission import AdmissionController, Decision
from shared.config import Settings
from shared.errors import TicketValidationError, field_errors
from shared.models import Ticket, TicketRequest
from shared.policy import Policy
from shared.queue import EnqueueOptions, TicketQueue
from shared.redis_conn import connect

SubmitOutcome = Literal["queued", "existing", "rejected"]


@dataclass(frozen=True)
class SubmitResult:
    outcome: SubmitOutcome
    ticket_id: str
    ticket: Ticket | None
    reason: str = ""
    retry_after: float | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome != "rejected"


class Producer:
    def __init__(
        self,
        redis: Redis,
        policy: Policy,
        queue_name: str = "default",
        *,
        fallback_configured: bool = False,
        admission_cache_seconds: float = 0.25,
    ) -> None:
        self.policy = policy
        self.queue = TicketQueue(redis, policy, queue_name)
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
            connect(settings.redis_url),
            settings.policy,
            settings.queue_name,
            fallback_configured=bool(settings.fallback_vllm_url),
        )

    def validate(self, data: Mapping[str, Any]) -> TicketRequest:
        """A request from untrusted data, or TicketValidationError naming each bad field."""
        try:
            return TicketRequest.model_validate(data, context={"policy": self.policy})
        except ValidationError as exc:
            raise TicketValidationError(field_errors(exc)) from None

    def _revalidated(self, request: TicketRequest) -> TicketRequest:
        # A request built in Python skipped the policy checks (type known, context limit).
        return self.validate(request.model_dump(exclude_unset=True))

    def submit(self, request: TicketRequest | Mapping[str, Any]) -> SubmitResult:
        """Admit and enqueue one ticket; a shed ticket is recorded as `rejected` with retry_after."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[TicketRequest | Mapping[str, Any]]) -> list[SubmitResult]:
        """Admit each ticket on its own merits; the admitted ones go in one pipelined round trip."""
        validated = [
            self._revalidated(r) if isinstance(r, TicketRequest) else self.validate(r) for r in requests
        ]
        decisions = [self.admission.decide(r) for r in validated]
        admitted = [
            (i, r, d) for i, (r, d) in enumerate(zip(validated, decisions, strict=True)) if d.admitted
        ]
        results: list[SubmitResult | None] = [None] * len(validated)
        if admitted:
            enqueued = self.queue.enqueue_many(
                [r for _, r, _ in admitted], [d.options for _, _, d in admitted]
            )
            for (i, _, _), res in zip(admitted, enqueued, strict=True):
                if res.outcome == "rejected":
                    results[i] = SubmitResult(
                        "rejected",
                        res.ticket_id,
                        res.ticket,
                        reason=res.ticket.error if res.ticket and res.ticket.error else "queue cap reached",
                        retry_after=self.admission.retry_after(),
                    )
                else:
                    results[i] = SubmitResult(res.outcome, res.ticket_id, res.ticket)
        for i, (request, decision) in enumerate(zip(validated, decisions, strict=True)):
            if not decision.admitted:
                results[i] = self._reject(request, decision)
        return [r for r in results if r is not None]

    def _reject(self, request: TicketRequest, decision: Decision) -> SubmitResult:
        ticket = self.queue.record_rejected(request, decision.reason)
        return SubmitResult("rejected", ticket.id, ticket, decision.reason, decision.retry_after)

    def get(self, ticket_id: str) -> Ticket | None:
        return self.queue.get(ticket_id)

    def cancel(self, ticket_id: str) -> str:
        """Cancel; returns the status before ("queued"/"running" → now cancelled) or "missing"."""
        return self.queue.cancel(ticket_id)

    def enqueue_options(self, request: TicketRequest) -> EnqueueOptions:
        return self.admission.decide(request).options
