"""Reading the API's two streams into typed items, for both clients.

A ticket's stream (GET /v1/tickets/{id}/stream) gives `TicketEvent`s ending with `TicketEnd`; the
OpenAI front door's (`"stream": true`) gives `CompletionChunk`s ending with `data: [DONE]`. A
started stream that the server ends with an error object raises `StreamInterrupted`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from tidegate_client.errors import StreamInterrupted
from tidegate_client.models import CompletionChunk, ErrorDetail, TicketEvent, ticket_event
from tidegate_client.sse import ServerEvent

DEFAULT_STREAM_TIMEOUT_S = 300.0
"""Longest a stream may stay open: a ticket may wait in the queue before its first token."""
TICKET_HEADER = "X-Tidegate-Ticket-Id"
LAST_EVENT_ID = "Last-Event-ID"
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


def _data(event: ServerEvent) -> Any:
    payload = json.loads(event.data)
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        raise StreamInterrupted(ErrorDetail.from_json({"type": "", "message": "", **payload["error"]}))
    return payload


def ticket_item(event: ServerEvent) -> TicketEvent | None:
    """The typed event, or None for a kind this client does not know (a newer server's)."""
    payload = _data(event)
    return ticket_event(event.event, payload) if isinstance(payload, dict) else None


def chunk_item(event: ServerEvent, ticket_id: str | None) -> CompletionChunk | None:
    """The typed chunk; None at `[DONE]`, the stream's end."""
    if event.data.strip() == "[DONE]":
        return None
    return CompletionChunk.from_json(_data(event), ticket_id)


def streamed_body(body: Mapping[str, Any], include_usage: bool) -> dict[str, Any]:
    """An OpenAI request body with `stream` on (and the usage chunk when asked for)."""
    out = {**body, "stream": True}
    if include_usage:
        out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
    return out


class Resume:
    """Where a ticket's stream is, so a broken-off one reopens after its last event."""

    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.last_id: str | None = None

    def saw(self, event: ServerEvent) -> None:
        self.last_id = event.id or self.last_id

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def possible(self) -> bool:
        """Whether to reopen: an event id to resume after, and time left."""
        return self.last_id is not None and time.monotonic() < self.deadline
