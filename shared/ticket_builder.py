"""Building tickets: the stored form of a request, and the enqueue script's values for each one.

Apart from the script calls (shared/submission.py, whose Submission extends TicketBuilder) so that
what a ticket holds is decided in one file, with no Redis in it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared import clock, tracing
from shared.deadlines import ticket_deadline
from shared.ids import new_ticket_id
from shared.models import Ticket, TicketRequest, TicketStatus
from shared.policy import Policy, TypePolicy
from shared.scoring import effective_priority, queue_score
from shared.shed import ShedCode, shed_cause

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

COLUMNS = (
    *LEAN_FIELDS,
    "prompt",
    "messages",
    "urgent_level",
    "vip_level",
    "is_bulk",
    "callback_url",
    "live",
    "sampling",
    "prompt_tokens_estimate",
    "max_attempts",
    "route",
    "traceparent",
)
"""The ticket hash fields a submission writes (besides id, status and score). A field at its model
default (factor levels of 0, not bulk) or empty is not written: `Ticket.from_redis` restores the
default, and `attempts` (0) and the claim's token cost (prompt estimate + max_tokens) are derived."""

_AT_DEFAULT = {"urgent_level": 0, "vip_level": 0, "is_bulk": False}
_CONVERTED = frozenset({*_AT_DEFAULT, "messages", "sampling"})
"""The columns whose stored form is not simply `str(value)` (see `stored_value`)."""


@dataclass(frozen=True)
class EnqueueOptions:
    """What admission decided for one ticket: shed with a code, or admitted with degrade options."""

    route: str | None = None
    defer_seconds: float = 0.0
    shed: ShedCode | None = None
    retry_after: float = 0.0
    red_line: int = 0
    """Tickets queued beside which the enqueue script refuses this one with `queue_red` unless its
    type is critical; 0 = no line (admission draws it while the queue is busy)."""


def stored_value(name: str, value: Any) -> str:
    """One column's value as the ticket hash stores it ("" = not stored), as `Ticket.to_redis`."""
    if value is None or (name in _AT_DEFAULT and value == _AT_DEFAULT[name]):
        return ""
    if name == "messages":
        return json.dumps([m.model_dump(mode="json") for m in value], separators=(",", ":"))
    if name == "sampling":
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


_LEAN_AT = 15
"""Where a draft's values give the counts of its lean and of all its field pairs (enqueue.lua)."""


def _append_stored(values: list[str], stored: dict[str, Any], names: tuple[str, ...]) -> int:
    """Append the name, stored value pairs of the columns `names` that are stored (see
    `stored_value`) to `values`; returns how many pairs."""
    pairs = 0
    for name in names:
        value = stored[name]
        if value is None:
            continue
        text = stored_value(name, value) if name in _CONVERTED else str(value)
        if text:
            values += (name, text)
            pairs += 1
    return pairs


@dataclass(frozen=True)
class Draft:
    """A ticket ready to submit: its stored form and the script's per-ticket values."""

    ticket: Ticket
    options: EnqueueOptions
    values: list[str]


class TicketBuilder:
    """Builds tickets from requests, and the enqueue script's values for each, under one policy."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._priorities: dict[tuple[str, int, int, bool], float] = {}

    def _priority(self, request: TicketRequest, type_policy: TypePolicy) -> float:
        """Effective priority, remembered per (type, factors): a batch has few distinct ones."""
        key = (request.type, request.urgent_level, request.vip_level, request.is_bulk)
        priority = self._priorities.get(key)
        if priority is None:
            priority = effective_priority(
                type_policy,
                urgent_level=request.urgent_level,
                vip_level=request.vip_level,
                is_bulk=request.is_bulk,
            )
            self._priorities[key] = priority
        return priority

    def build_ticket(
        self, request: TicketRequest, *, now: float | None = None, route: str | None = None
    ) -> Ticket:
        """The stored form of a validated request: priority, TTL, limits filled in from policy."""
        created = clock.now() if now is None else now
        type_policy = self.policy.type_policy(request.type)
        ttl = float(request.ttl_seconds or type_policy.ttl_seconds)
        deadline = ticket_deadline(type_policy, created, request.deadline_ms)
        return Ticket(
            id=new_ticket_id(),
            type=request.type,
            branch_id=request.branch_id,
            status=TicketStatus.QUEUED,
            priority=self._priority(request, type_policy),
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
            first_seen_at=created,
            deadline=deadline,
            max_attempts=self.policy.queue.max_attempts,
            route=route,
            traceparent=tracing.current_traceparent(),
        )

    def shed_words(self, code: ShedCode, ticket_type: str) -> str:
        """The stored reason for a shed ticket: the words for its code (shared/shed.py)."""
        cap = self.policy.type_policy(ticket_type).cap
        return shed_cause(code, ticket_type, critical_types=self.policy.critical_types, cap=cap)

    def _draft(self, request: TicketRequest, options: EnqueueOptions, now: float) -> Draft:
        ticket = self.build_ticket(request, now=now, route=options.route)
        shed = options.shed
        # A ticket admission shed is recorded rejected whatever else the script finds, from its
        # lean fields alone: its prompt and the rest are not worth sending.
        values = [
            ticket.id,
            ticket.type,
            ticket.branch_id,
            str(ticket.priority),
            repr(queue_score(ticket.priority, now, self.policy.queue.aging_seconds)),
            repr(ticket.expires_at),
            ticket.idempotency_key or "",
            repr(now + max(options.defer_seconds, 0.0)),
            shed.value if shed else "",
            self.shed_words(shed, ticket.type) if shed else "",
            repr(options.retry_after),
            repr(ticket.deadline),
            str(ticket.prompt_tokens_estimate),
            str(ticket.max_tokens),
            str(options.red_line) if options.red_line > 0 else "",
            "",  # _LEAN_AT: the lean pairs, filled in below
            "",  # every pair
        ]
        stored = ticket.__dict__
        lean = _append_stored(values, stored, LEAN_FIELDS)
        rest = 0 if shed else _append_stored(values, stored, COLUMNS[len(LEAN_FIELDS) :])
        values[_LEAN_AT], values[_LEAN_AT + 1] = str(lean), str(lean + rest)
        return Draft(ticket, options, values)
