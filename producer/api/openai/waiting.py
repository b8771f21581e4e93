"""Waiting for a ticket's answer on its live stream, without polling and without a thread.

The hub delivers the stream's entries; when none comes for a while (a worker that died before it
could publish, a ticket that expired in the queue, a Redis hiccup on the publishing side) the
ticket itself is read once, so every ticket's ending is seen even when its stream never says so.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis
from redis.asyncio import Redis as AsyncRedis

from producer.api.openai.hub import LiveReader
from shared import clock
from shared.keys import QueueKeys
from shared.live import LiveKind
from shared.models import Ticket, TicketStatus

CHECK_SECONDS = 5.0
"""Longest wait for a stream entry before the ticket itself is read (each call draws a little less,
so calls that arrived together do not all read their tickets in the same instant)."""
CHECK_JITTER = 0.2
OVERDUE_SECONDS = 30.0
"""Past its expiry plus this, a ticket nobody ended (no reaper running) is given up on."""
_REJECTED_BY_VLLM = re.compile(r"^vLLM rejected the request \((4\d\d)\)")


@dataclass(frozen=True)
class Ending:
    """How the ticket ended, as the caller is told."""

    status: str
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str = ""
    text: str | None = None
    """The stored answer, when it was read from the ticket."""

    @property
    def http_status(self) -> int:
        """The status a non-streamed call answers for an ending other than `done`."""
        if self.status == TicketStatus.FAILED:
            match = _REJECTED_BY_VLLM.match(self.error)
            return int(match.group(1)) if match else 502
        return {TicketStatus.EXPIRED: 504, TicketStatus.CANCELLED: 410}.get(TicketStatus(self.status), 502)

    @classmethod
    def of_ticket(cls, ticket: Ticket) -> Ending:
        usage = ticket.usage or {}
        return cls(
            status=ticket.status.value,
            finish_reason=usage.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            error=ticket.error or "",
            text=ticket.result,
        )


def _number(raw: str | None) -> int | None:
    return int(raw) if raw is not None and raw.isdigit() else None


@dataclass(frozen=True)
class Token:
    text: str


@dataclass(frozen=True)
class Retry:
    error: str


Event = Token | Retry | Ending


class TicketWait:
    """The events of one ticket's answer: tokens, retries, then exactly one Ending."""

    def __init__(self, client: AsyncRedis, keys: QueueKeys, reader: LiveReader, ticket: Ticket) -> None:
        self.client = client
        self.keys = keys
        self.reader = reader
        self.ticket_id = ticket.id
        self.give_up_at = ticket.expires_at + OVERDUE_SECONDS
        self.check_seconds = CHECK_SECONDS * (1 - random.uniform(0, CHECK_JITTER))

    async def read_ticket(self) -> Ticket | None:
        raw = await self.client.hgetall(self.keys.ticket(self.ticket_id))  # type: ignore[misc]
        return Ticket.from_redis(raw) if raw else None

    async def queue_ms(self) -> int | None:
        """Milliseconds the ticket spent queued before a worker started it; None while unstarted."""
        try:
            created, started = await self.client.hmget(  # type: ignore[misc]
                self.keys.ticket(self.ticket_id), ["created_at", "started_at"]
            )
        except redis.RedisError:
            return None
        if not created or not started:
            return None
        return max(round((float(started) - float(created)) * 1000), 0)

    async def events(self) -> AsyncIterator[Event]:
        while True:
            entry = await self.reader.next(self.check_seconds)
            if entry is None:
                ending = await self._check()
                if ending is not None:
                    yield ending
                    return
                continue
            kind = entry.get("kind")
            if kind == LiveKind.TOKEN:
                yield Token(entry.get("text", ""))
            elif kind == LiveKind.RETRY:
                yield Retry(entry.get("error", ""))
            elif kind == LiveKind.END:
                yield Ending(
                    status=entry.get("status", TicketStatus.FAILED.value),
                    finish_reason=entry.get("finish_reason"),
                    prompt_tokens=_number(entry.get("prompt_tokens")),
                    completion_tokens=_number(entry.get("completion_tokens")),
                    error=entry.get("error", ""),
                )
                return

    async def _check(self) -> Ending | None:
        try:
            ticket = await self.read_ticket()
        except redis.RedisError:
            return None  # Redis away: keep waiting, the hub reconnects
        if ticket is None:
            return Ending(TicketStatus.FAILED.value, error="the ticket is gone (past its retention)")
        if ticket.status.terminal:
            return Ending.of_ticket(ticket)
        if clock.now() > self.give_up_at:
            return Ending(
                TicketStatus.EXPIRED.value, error="the ticket outlived its TTL with nobody to end it"
            )
        return None

    def close(self) -> None:
        self.reader.close()
