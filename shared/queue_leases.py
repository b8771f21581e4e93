"""What a worker writes on the tickets it holds: renew a lease, write an outcome, give a ticket back.

Apart from claiming and submitting so each file holds one job; every write here is fenced by the
claim's token. TicketQueue (shared/queue.py) inherits it and sets the attributes declared here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from redis import Redis

from shared import backoff, clock
from shared.keys import WAKE_LIST_CAP, QueueKeys
from shared.policy import Policy
from shared.replica_acks import run_acked
from shared.scripts import Scripts
from shared.slot_server import on_slot_server


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


class QueueLeases:
    """Lease renewals and ends of one queue's running tickets."""

    redis: Redis
    policy: Policy
    keys: QueueKeys
    scripts: Scripts
    replica_acks: int

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
