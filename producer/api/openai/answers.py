"""Answering an admitted call: relay its tokens as SSE, or the whole answer once it is done.

Both run inside `LiveResponse`, which watches the connection while they wait: a caller that goes
away (cancels, disconnects, times out) while the ticket is queued or running gets it cancelled,
and the existing cancel path aborts its vLLM request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio
import redis
from fastapi.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from producer.api.errors import error_response
from producer.api.openai.call import Call
from producer.api.openai.waiting import Ending, Retry, TicketWait, Token
from producer.api.openai.wire import DONE_EVENT, SHED_FINISH_REASON, Shape, Usage, sse
from producer.api.schemas import ErrorObject
from shared.metrics import E2E_TIME_TO_FIRST_TOKEN_SECONDS
from shared.models import TicketStatus

log = logging.getLogger("tidegate.api")

TICKET_HEADER = "X-Tidegate-Ticket-Id"
QUEUE_MS_HEADER = "X-Tidegate-Queue-Ms"
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

Cancel = Callable[[], Awaitable[None]]


class LiveResponse(Response):
    """Runs `answer` while watching for the caller leaving; if it leaves first, awaits `on_leave`."""

    def __init__(self, answer: Callable[[Send], Awaitable[None]], on_leave: Cancel) -> None:
        super().__init__()
        self.answer = answer
        self.on_leave = on_leave

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        left = False
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                nonlocal left
                while (await receive())["type"] != "http.disconnect":
                    pass
                left = True
                group.cancel_scope.cancel()

            async def run() -> None:
                await self.answer(send)
                group.cancel_scope.cancel()

            group.start_soon(watch)
            group.start_soon(run)
        if left:
            with anyio.CancelScope(shield=True):
                await self.on_leave()


def guarded(
    answer: Callable[[Send], Awaitable[None]], ticket_id: str, on_exit: Callable[[], None]
) -> Callable[[Send], Awaitable[None]]:
    """`answer`, so that a failure while answering (Redis lost, a bug) still answers the caller."""

    async def run(send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await answer(tracked)
        except Exception as exc:
            await _answer_failure(tracked, exc, started, ticket_id)
        finally:
            on_exit()

    return run


async def _answer_failure(send: Send, exc: Exception, started: bool, ticket_id: str) -> None:
    if not isinstance(exc, redis.RedisError):
        log.exception("answering ticket %s failed", ticket_id)
    error = ErrorObject(
        message=f"the answer of ticket {ticket_id} could not be relayed ({type(exc).__name__}); "
        f"read it at GET /v1/tickets/{ticket_id}",
        type="service_unavailable",
        code="relay_failed",
        ticket_id=ticket_id,
    )
    if started:
        await send(
            {"type": "http.response.body", "body": sse({"error": error.model_dump(exclude_none=True)})}
        )
        return
    response = error_response(503, error, {TICKET_HEADER: ticket_id})
    await send({"type": "http.response.start", "status": 503, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def _ending_error(ending: Ending, ticket_id: str) -> ErrorObject:
    if ending.status == TicketStatus.EXPIRED:
        message = f"ticket {ticket_id} expired before its answer was complete ({ending.error})"
    else:
        message = f"ticket {ticket_id} ended {ending.status}: {ending.error or 'no answer'}"
    kind = "invalid_request_error" if ending.http_status < 500 else "server_error"
    return ErrorObject(message=message, type=kind, code=f"ticket_{ending.status}", ticket_id=ticket_id)


def _usage(ending: Ending) -> Usage:
    return Usage(ending.prompt_tokens or 0, ending.completion_tokens or 0)


async def _send_json(send: Send, response: JSONResponse) -> None:
    await send(
        {"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers}
    )
    await send({"type": "http.response.body", "body": response.body})


def whole_answer(wait: TicketWait, shape: Shape, cancel: Cancel) -> Callable[[Send], Awaitable[None]]:
    """The non-streamed answer: one JSON body once the ticket has ended."""

    async def answer(send: Send) -> None:
        ending: Ending | None = None
        async for event in wait.events():
            if isinstance(event, Ending):
                ending = event
        assert ending is not None
        headers = {TICKET_HEADER: shape.ticket_id}
        queue_ms = await wait.queue_ms()
        if queue_ms is not None:
            headers[QUEUE_MS_HEADER] = str(queue_ms)
        if ending.status == TicketStatus.DONE and ending.text is None:
            stored = await wait.read_ticket()
            ending = Ending.of_ticket(stored) if stored is not None else ending
        if ending.status != TicketStatus.DONE:
            await cancel()
            await _send_json(
                send, error_response(ending.http_status, _ending_error(ending, shape.ticket_id), headers)
            )
            return
        text = ending.text or ""
        body = shape.completion(text, ending.finish_reason, _usage(ending))
        await _send_json(send, JSONResponse(body, headers=headers))

    return answer


def streamed_answer(
    call: Call, wait: TicketWait, shape: Shape, cancel: Cancel, arrived: float
) -> Callable[[Send], Awaitable[None]]:
    """The streamed answer: SSE chunks as tokens arrive, then the finish, usage and [DONE]."""

    async def answer(send: Send) -> None:
        # Sent at once, as an OpenAI server does: the caller learns its ticket id while it is still
        # queued, and can close the stream to cancel it. The queue time is there only when the
        # ticket has already started; `GET /v1/tickets/{id}` always carries it once started.
        headers = [*SSE_HEADERS, (TICKET_HEADER.lower().encode(), shape.ticket_id.encode())]
        queue_ms = await wait.queue_ms()
        if queue_ms is not None:
            headers.append((QUEUE_MS_HEADER.lower().encode(), str(queue_ms).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def emit(payload: bytes) -> None:
            await send({"type": "http.response.body", "body": payload, "more_body": True})

        relayed: list[str] = []
        async for event in wait.events():
            if isinstance(event, Token) and event.text:
                if not relayed:
                    E2E_TIME_TO_FIRST_TOKEN_SECONDS.labels(type=call.ticket_type).observe(
                        time.monotonic() - arrived
                    )
                relayed.append(event.text)
                await emit(
                    sse(shape.chunk(event.text, first=len(relayed) == 1, usage_field=call.include_usage))
                )
            elif isinstance(event, Retry) and relayed:
                await cancel()  # the next attempt would start the answer over: end this one honestly
                error = ErrorObject(
                    message=f"the answer was interrupted ({event.error}); send the request again",
                    type="server_error",
                    code="answer_interrupted",
                    ticket_id=shape.ticket_id,
                )
                await emit(sse({"error": error.model_dump(exclude_none=True)}))
                break
            elif isinstance(event, Ending):
                await _finish_stream(call, shape, event, "".join(relayed), emit, cancel)
        await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})

    return answer


async def _finish_stream(
    call: Call,
    shape: Shape,
    ending: Ending,
    relayed: str,
    emit: Callable[[bytes], Awaitable[None]],
    cancel: Cancel,
) -> None:
    if ending.status != TicketStatus.DONE:
        await cancel()
        error = _ending_error(ending, shape.ticket_id)
        await emit(sse({"error": error.model_dump(exclude_none=True)}))
        return
    if ending.text and ending.text.startswith(relayed) and len(ending.text) > len(relayed):
        # Read from the ticket: the stream missed its tail (the worker could not publish it).
        await emit(
            sse(shape.chunk(ending.text[len(relayed) :], first=not relayed, usage_field=call.include_usage))
        )
    await emit(sse(shape.chunk(None, ending.finish_reason or "stop", usage_field=call.include_usage)))
    if call.include_usage:
        await emit(sse(shape.usage_chunk(_usage(ending))))


def shed_answer(call: Call, shape: Shape, text: str, headers: dict[str, str]) -> Response:
    """The degraded answer of a shed call: the policy's text, finish_reason load_shedding_fallback."""
    usage = Usage(0, 0)
    if not call.stream:
        return JSONResponse(shape.completion(text, SHED_FINISH_REASON, usage), headers=headers)
    chunks = [
        sse(shape.chunk(text, first=True, usage_field=call.include_usage)),
        sse(shape.chunk(None, SHED_FINISH_REASON, usage_field=call.include_usage)),
    ]
    if call.include_usage:
        chunks.append(sse(shape.usage_chunk(usage)))
    chunks.append(DONE_EVENT)
    return Response(b"".join(chunks), media_type="text/event-stream", headers=headers)
