"""The same requests as tidegate recorded them: each OpenAI call's ticket, read from Redis.

A ticket's times are tidegate's wall clock: `created_at` when the API built it (the HTTP request
already read, its key checked), `first_token_at` when the worker read the first token from vLLM,
`finished_at` when the worker wrote the answer. So its time to first token and its latency leave out
the request's way in before the ticket exists and the answer's way out (worker → Redis stream →
API → client): they are tidegate's own view, not the caller's.

A shed call leaves no ticket hash but a record in a bucket (shared/rejected.py); it reads as a
`rejected` ticket with its shed code. With `shed_answer = "degraded"` its caller got a 200 with the
policy's text, which a load generator counts as answered and tidegate counts as shed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from redis import Redis

from ops.lab.chaos.books import stored_ticket_ids
from shared.keys import QueueKeys
from shared.rejected import read_rejected

FIELDS = ("status", "created_at", "first_token_at", "finished_at", "deadline", "usage")


@dataclass(frozen=True)
class TicketTimes:
    """One ticket's status and times (Unix seconds), and the tokens its answer had."""

    id: str
    status: str
    created_at: float
    first_token_at: float | None
    finished_at: float | None
    deadline: float | None
    completion_tokens: int | None
    shed_code: str | None = None

    @property
    def answered(self) -> bool:
        return self.status == "done"

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.created_at

    @property
    def latency(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.created_at

    @property
    def in_time(self) -> bool:
        """Answered by its deadline: the type's SLO from its first sighting, tidegate's own rule."""
        return (
            self.answered
            and self.finished_at is not None
            and (self.deadline is None or self.finished_at <= self.deadline)
        )


def _float(raw: str | None) -> float | None:
    return None if raw is None or raw == "" else float(raw)


def _completion_tokens(raw: str | None) -> int | None:
    if not raw:
        return None
    usage = json.loads(raw)
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return int(tokens) if isinstance(tokens, int) else None


def parse_ticket(ticket_id: str, fields: Sequence[str | None]) -> TicketTimes | None:
    """A ticket from its FIELDS' values; None when its hash is gone (a shed ticket's lean record)."""
    status, created, first, finished, deadline, usage = fields
    if status is None or created is None:
        return None
    return TicketTimes(
        id=ticket_id,
        status=status,
        created_at=float(created),
        first_token_at=_float(first),
        finished_at=_float(finished),
        deadline=_float(deadline),
        completion_tokens=_completion_tokens(usage),
    )


def read_tickets(
    redis: Redis, keys: QueueKeys, named: Iterable[str] = ()
) -> tuple[list[TicketTimes], list[str]]:
    """Every ticket the queue holds, and those `named` (by their callers' answers) that were shed;
    also the named ids tidegate has no record of at all."""
    ids = sorted(stored_ticket_ids(redis, keys) | set(named))
    pipe = redis.pipeline(transaction=False)
    for ticket_id in ids:
        pipe.hmget(keys.ticket(ticket_id), list(FIELDS))
    tickets: list[TicketTimes] = []
    hashless: list[str] = []
    for ticket_id, values in zip(ids, pipe.execute(), strict=True):
        ticket = parse_ticket(ticket_id, cast("list[str | None]", values))
        if ticket is None:
            hashless.append(ticket_id)
        else:
            tickets.append(ticket)
    missing: list[str] = []
    for ticket_id, record in zip(hashless, read_rejected(redis, keys, hashless), strict=True):
        if record is None:
            missing.append(ticket_id)
        else:
            tickets.append(_rejected(ticket_id, record))
    return tickets, missing


def _rejected(ticket_id: str, record: dict[str, str]) -> TicketTimes:
    return TicketTimes(
        id=ticket_id,
        status=record["status"],
        created_at=float(record.get("created_at") or 0.0),
        first_token_at=None,
        finished_at=None,
        deadline=None,
        completion_tokens=None,
        shed_code=record.get("shed_code"),
    )


def outcome_counts(redis: Redis, keys: QueueKeys, ticket_type: str) -> dict[str, int]:
    """The queue's own counters for `ticket_type` (`submitted`, `done`, `rejected`, ...)."""
    counts = cast("dict[str, str]", redis.hgetall(keys.counts))
    prefix = ticket_type + ":"
    return {k[len(prefix) :]: int(v) for k, v in counts.items() if k.startswith(prefix)}
