"""GET /v1/tickets/{id}/stream: a ticket's answer as server-sent events while it is produced.

Tokens come from the ticket's live stream, which the worker writes when the ticket was submitted
with `"live": "tokens"` (`"end"` streams only the ending); without `live` the ending is still seen,
from the ticket itself. Events: `token` `{"text"}`, `retry` `{"error"}` (the attempt failed and the
answer starts over), then exactly one `end` `{"status", "finish_reason", "prompt_tokens",
"completion_tokens", "error"}`. Leaving the stream does not cancel the ticket: a reader is not its
owner, and may come back. Each event read from the live stream carries the stream entry's id as its
`id`, so a reader that comes back with `Last-Event-ID` resumes after the last event it received
(else the stream is read from its start); one whose stream is gone (it lingers a while after the
answer) is told so, and reads the ticket instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from producer.api.context import ApiContext, Caller, Context
from producer.api.errors import UNAUTHORIZED, api_error, error_responses
from producer.api.openai.answers import SSE_HEADERS, TICKET_HEADER
from producer.api.openai.hub import START_ID, entry_order
from producer.api.openai.waiting import Ending, Event, Retry, TicketWait, Token, event_of
from producer.api.routes_tickets import NOT_FOUND, TicketId, own_ticket
from shared.live import LINGER_SECONDS
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


LAST_EVENT_ID = "Last-Event-ID"
_ENTRY_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")
STREAM_GONE = (
    f"`{LAST_EVENT_ID}` names an event the ticket's live stream no longer holds: the stream has "
    f"expired ({LINGER_SECONDS:g} s after the answer) or was trimmed; read the ticket instead"
)
UNKNOWN_EVENT = f"`{LAST_EVENT_ID}` names no event of this ticket's stream"


def event(name: str, payload: dict[str, Any], entry_id: str = "") -> bytes:
    """One server-sent event; `entry_id` (the live stream entry's) becomes its `id`."""
    head = f"id: {entry_id}\n" if entry_id else ""
    return f"{head}event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


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
        ending.entry_id,
    )


def encoded(item: Event) -> bytes | None:
    if isinstance(item, Token):
        return event("token", {"text": item.text}, item.entry_id) if item.text else None
    if isinstance(item, Retry):
        return event("retry", {"error": item.error}, item.entry_id)
    return end_event(item)


async def resume_point(context: ApiContext, ticket_id: str, last_event_id: str | None) -> str:
    """The live stream entry to read after: its start for a new reader, the named event for one
    that comes back (checked to be still held, so nothing it missed is skipped unnoticed)."""
    if last_event_id is None:
        return START_ID
    if not _ENTRY_ID.match(last_event_id):
        raise api_error(
            422,
            f"{LAST_EVENT_ID}: {last_event_id[:40]!r} is not an event id of this stream (e.g. 1733100000000-0)",
            code="invalid_field",
            param=LAST_EVENT_ID,
        )
    key = context.producer.queue.keys.live(ticket_id)
    pipe = context.hub.redis.pipeline(transaction=False)
    pipe.xrange(key, last_event_id, last_event_id, count=1)
    pipe.xrange(key, "-", "+", count=1)
    named, first = await pipe.execute()
    if named:
        return last_event_id
    if not first or entry_order(last_event_id) < entry_order(first[0][0]):
        raise api_error(410, STREAM_GONE, code="stream_expired", param=LAST_EVENT_ID)
    raise api_error(404, UNKNOWN_EVENT, code="unknown_event_id", param=LAST_EVENT_ID)


async def relay(context: ApiContext, ticket: Ticket, after: str) -> AsyncIterator[bytes]:
    """The ticket's events after entry `after`; an ended ticket answers its `end` at once (after
    the events a returning reader missed, when it comes back)."""
    if ticket.status.terminal:
        async for ended in _ended(context, ticket, after):
            yield ended
        return
    wait = TicketWait(
        context.hub.redis, context.producer.queue.keys, context.hub.open(ticket.id, after), ticket
    )
    try:
        async for item in wait.events():
            chunk = encoded(item)
            if chunk is not None:
                yield chunk
    finally:
        wait.close()


async def _ended(context: ApiContext, ticket: Ticket, after: str) -> AsyncIterator[bytes]:
    if after != START_ID:
        key = context.producer.queue.keys.live(ticket.id)
        for entry_id, entry in await context.hub.redis.xrange(key, f"({after}", "+"):
            item = event_of(entry_id, entry)
            chunk = encoded(item) if item is not None else None
            if chunk is not None:
                yield chunk
            if isinstance(item, Ending):
                return
    yield end_event(Ending.of_ticket(ticket))


@router.get(
    "/tickets/{ticket_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: STREAM_DOC,
        **error_responses({401: UNAUTHORIZED, 404: f"{NOT_FOUND}; or {UNKNOWN_EVENT}", 410: STREAM_GONE}),
    },
    summary="Stream a ticket's answer as server-sent events while it is produced",
)
async def stream_ticket(
    ticket_id: TicketId,
    context: Context,
    principal: Caller,
    last_event_id: Annotated[
        str | None,
        Header(
            alias=LAST_EVENT_ID,
            description="the `id` of the last event received: the stream resumes after it",
        ),
    ] = None,
) -> StreamingResponse:
    ticket = await run_in_threadpool(own_ticket, context, principal, ticket_id)
    after = await resume_point(context, ticket.id, last_event_id)
    headers = {k.decode(): v.decode() for k, v in SSE_HEADERS if k != b"content-type"}
    return StreamingResponse(
        relay(context, ticket, after),
        media_type="text/event-stream",
        headers={**headers, TICKET_HEADER: ticket.id},
    )
