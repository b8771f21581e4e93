"""GET /v1/models, POST /v1/chat/completions and /v1/completions: the OpenAI-compatible front door.

Every call is a ticket, submitted through the same `Producer` as POST /v1/tickets (admission,
priority, TTL, caps, accounting); its id comes back in `X-Tidegate-Ticket-Id`. Handlers are async
and wait on the live-stream hub, so an open call costs a coroutine, not a thread.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from producer.api.context import ApiContext, Caller, Context
from producer.api.errors import UNAUTHORIZED, ApiError, api_error, error_responses
from producer.api.openai.answers import (
    TICKET_HEADER,
    LiveResponse,
    guarded,
    shed_answer,
    streamed_answer,
    whole_answer,
)
from producer.api.openai.call import Call, Endpoint, bad_request, parse_call
from producer.api.openai.waiting import TicketWait
from producer.api.openai.wire import Shape
from producer.api.shed import shed_answer as shed_for
from producer.api.ticket_log import log_submitted
from producer.producer import SubmitResult
from shared.errors import TicketValidationError
from shared.models import TicketRequest

router = APIRouter(prefix="/v1", tags=["openai"])

_ERRORS = error_responses(
    {
        400: "a field OpenAI or tidegate cannot use; `param` names it",
        401: UNAUTHORIZED,
        404: "unknown model",
        429: "shed by admission control (the type's shed_answer is error)",
    }
)


def _body_doc(required: str, examples: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The OpenAI request body as documentation: handlers parse it themselves (call.py), so it is
    described here with examples rather than as a model FastAPI would validate first."""
    schema = {"type": "object", "required": ["model", required], "additionalProperties": True}
    content = {
        "schema": schema,
        "examples": {k.replace(" ", "_"): {"summary": k, "value": v} for k, v in examples.items()},
    }
    return {"requestBody": {"required": True, "content": {"application/json": content}}}


_CHAT_BODY = _body_doc(
    "messages",
    {
        "urgent loan approval, streamed": {
            "model": "tidegate",
            "messages": [{"role": "user", "content": "Approve a 25k loan for client 7781?"}],
            "stream": True,
            "tidegate": {"type": "loan_approval", "urgent_level": 3},
        },
        "complaint, whole answer": {
            "model": "tidegate",
            "messages": [{"role": "user", "content": "My card was charged twice on 3 May."}],
            "max_tokens": 200,
            "tidegate": {"type": "complaint", "vip_level": 2},
        },
    },
)
_COMPLETION_BODY = _body_doc(
    "prompt",
    {
        "archive query": {
            "model": "tidegate",
            "prompt": "List 2019 statements of account 55-1021.",
            "tidegate": {"type": "archive_query"},
        }
    },
)


@router.get("/models", responses=_ERRORS, summary="The models callers may name (OpenAI format)")
async def list_models(context: Context, principal: Caller) -> dict[str, Any]:
    models = await context.models.known()
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 0, "owned_by": "tidegate"} for m in models],
    }


@router.post(
    "/chat/completions", responses=_ERRORS, summary="A chat completion, as a ticket", openapi_extra=_CHAT_BODY
)
async def chat_completions(request: Request, context: Context, principal: Caller) -> Response:
    return await _serve(request, context, principal, Endpoint.CHAT)


@router.post(
    "/completions",
    responses=_ERRORS,
    summary="A text completion, as a ticket",
    openapi_extra=_COMPLETION_BODY,
)
async def completions(request: Request, context: Context, principal: Caller) -> Response:
    return await _serve(request, context, principal, Endpoint.COMPLETION)


async def _serve(request: Request, context: ApiContext, principal: Caller, endpoint: Endpoint) -> Response:
    arrived = time.monotonic()
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise bad_request("the request body is not valid JSON", None, "invalid_json") from None
    call = parse_call(body, request.headers, principal, context.policy, endpoint)
    await _check_model(context, call.model)
    ticket_request = _validated(context, call, principal.branch_id)
    result: SubmitResult = await run_in_threadpool(context.producer.submit, ticket_request)
    log_submitted(result, ticket_request)
    shape = Shape.of(endpoint, result.ticket_id, call.model)
    if result.outcome == "rejected":
        return _shed(context, call, result, shape)
    assert result.ticket is not None
    reader = context.hub.open(result.ticket_id)
    wait = TicketWait(context.hub.redis, context.producer.queue.keys, reader, result.ticket)

    async def cancel() -> None:
        wait.close()
        await run_in_threadpool(
            context.producer.queue.cancel, result.ticket_id, "its caller closed the connection"
        )

    answer = (
        streamed_answer(call, wait, shape, cancel, arrived)
        if call.stream
        else whole_answer(wait, shape, cancel)
    )
    return LiveResponse(guarded(answer, result.ticket_id, wait.close), cancel)


async def _check_model(context: ApiContext, model: str) -> None:
    known = await context.models.known()
    if model not in known:
        raise api_error(
            404,
            f"model {model!r} does not exist here; known models: {', '.join(known)}",
            code="model_not_found",
            param="model",
        )


def _validated(context: ApiContext, call: Call, branch_id: str | None) -> TicketRequest:
    if branch_id is None:
        raise api_error(
            403,
            "an operator key belongs to no branch; call the OpenAI endpoints with a branch key",
            code="branch_key_required",
        )
    try:
        return context.producer.validate({**call.ticket, "branch_id": branch_id})
    except TicketValidationError as exc:
        raise _as_bad_request(exc, call) from None


def _as_bad_request(exc: TicketValidationError, call: Call) -> ApiError:
    first = exc.errors[0]
    field = first.field
    if field == "body":  # a rule over the whole request: the prompt against the context limit
        field = call.endpoint.prompt_field
    elif field in ("type", "urgent_level", "vip_level", "is_bulk", "deadline_ms"):
        field = f"tidegate.{field}"
    code = "context_length_exceeded" if "context limit" in first.message else "invalid_value"
    return api_error(400, f"{field}: {first.message}", code=code, param=field)


def _shed(context: ApiContext, call: Call, result: SubmitResult, shape: Shape) -> Response:
    shed = shed_for(result, call.ticket_type, context.policy)
    headers = {**shed.headers, TICKET_HEADER: result.ticket_id}
    type_policy = context.policy.type_policy(call.ticket_type)
    if type_policy.shed_answer == "degraded":
        return shed_answer(call, shape, type_policy.shed_text, headers)
    body = {"error": shed.error.model_dump(mode="json")}
    return JSONResponse(body, status_code=429, headers=headers)
