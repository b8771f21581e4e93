"""GET /v1/tickets/{id}/stream: a ticket's answer as server-sent events while it is produced.

Tokens come from the ticket's live stream, which the worker writes when the ticket was submitted
with `"live": "tokens"` (`"end"` streams only the ending); without `live` the ending is still seen,
from the ticket itself. Events: `token` `{"text"}`, `retry` `{"error"}` (the attempt failed and the
answer starts over), then exactly one `end` `{"status", "finish_reason", "prompt_tokens",
"completion_tokens", "error"}`. Leaving the stream does not cancel the ticket: a reader is not its
owner, and may come back (the stream is read from its start each time).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from producer.api.context import ApiContext, Caller, Context
from producer.api.errors import UNAUTHORIZED, error_responses
from producer.api.openai.answers import SSE_HEADERS, TICKET_HEADER
from producer.api.openai.waiting import Ending, Retry, TicketWait, Token
from producer.api.routes_tickets import NOT_FOUND, TicketId, own_ticket
from shared.models import Ticket

router = APIRouter(prefix="/v1", tags=["tickets"])

STREAM_DOC = {
    "description": "`text/event-stream`: `token`, `retry`, then one `end` event (JSON `data`)",
    "content": {
        "text/event-stream": {
            "schema": {"type": "string"},
            "example": 'event: token\ndata: {"text":"Approved"}\n\n'
            'event: end\ndata: {"status":"done","finish_reason":"stop","prompt_tokens":12,'
            '"completion_tokens":1,"error":""}\n\n',
        }
    },
}


def event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def end_event(ending: Ending) -> bytes:
    return event(
        "end",
        {
            "status": ending.status,
            "finish_reason": ending.finish_reason,
            "prompt_tokens": ending.prompt_tokens,
            "completion_tokens": ending.completion_tokens,
            "error": ending.error,
        },
    )


async def relay(context: ApiContext, ticket: Ticket) -> AsyncIterator[bytes]:
    """The ticket's events; an ended ticket answers its `end` at once."""
    if ticket.status.terminal:
        yield end_event(Ending.of_ticket(ticket))
        return
    wait = TicketWait(context.hub.redis, context.producer.queue.keys, context.hub.open(ticket.id), ticket)
    try:
        async for item in wait.events():
            if isinstance(item, Token):
                if item.text:
                    yield event("token", {"text": item.text})
            elif isinstance(item, Retry):
                yield event("retry", {"error": item.error})
            else:
                yield end_event(item)
    finally:
        wait.close()


@router.get(
    "/tickets/{ticket_id}/stream",
    response_class=StreamingResponse,
    responses={200: STREAM_DOC, **error_responses({401: UNAUTHORIZED, 404: NOT_FOUND})},
    summary="Stream a ticket's answer as server-sent events while it is produced",
)
async def stream_ticket(ticket_id: TicketId, context: Context, principal: Caller) -> StreamingResponse:
    ticket = await run_in_threadpool(own_ticket, context, principal, ticket_id)
    headers = {k.decode(): v.decode() for k, v in SSE_HEADERS if k != b"content-type"}
    return StreamingResponse(
        relay(context, ticket),
        media_type="text/event-stream",
        headers={**headers, TICKET_HEADER: ticket.id},
    )
