"""/v1/tickets: submit (one or a batch), read and cancel, each scoped to the caller's branch.

Submission goes through `Producer`, so the API admits exactly as the Python producer and the CLI do.
A ticket of another branch answers 404 like an unknown one, so ids leak nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from producer.api.auth import Principal
from producer.api.context import ApiContext, Caller, Context
from producer.api.errors import (
    TOO_LARGE,
    UNAUTHORIZED,
    UNREADABLE,
    ApiError,
    api_error,
    error_responses,
    issues_from_fields,
    issues_from_pydantic,
    validation_error,
)
from producer.api.schemas import (
    BATCH_BODY_EXAMPLES,
    TICKET_BODY_EXAMPLES,
    TICKET_ID_PATTERN,
    BatchBody,
    BatchItemResult,
    BatchResult,
    CancelResult,
    TicketAccepted,
    TicketBody,
    TicketView,
    ValidationIssue,
)
from producer.api.shed import Shed, shed_answer
from producer.api.ticket_log import log_submitted
from producer.producer import SubmitResult
from shared.errors import TicketValidationError
from shared.models import Ticket, TicketRequest, TicketStatus

router = APIRouter(prefix="/v1", tags=["tickets"])

NOT_FOUND = "no such ticket for this key"
REPLAYED_HEADER = "Idempotent-Replayed"
DEADLINE_HEADER = "X-Tidegate-Deadline-Ms"
DEADLINE_MS_MAX = 7 * 86_400_000
"""A week: the longest deadline a caller may set, in milliseconds from now."""
IDEMPOTENCY_KEY_MAX = 128
QUEUE_MS_HEADER = "X-Tidegate-Queue-Ms"
DeadlineMs = Annotated[
    int,  # not `int | None`: documented as an integer header, absent when not sent
    Header(
        alias=DEADLINE_HEADER,
        ge=1,
        le=DEADLINE_MS_MAX,
        description="the caller's deadline in milliseconds from now; the smaller of it and the body's "
        "deadline_ms wins",
    ),
]

TicketId = Annotated[str, Path(pattern=TICKET_ID_PATTERN, description="id returned at submission")]


class Invalid(Exception):
    """Bad fields found after FastAPI's own checks (the operator's branch, the policy's rules)."""

    def __init__(self, issues: list[ValidationIssue]) -> None:
        self.issues = issues


def _branch_for(principal: Principal, given: str | None, loc: list[str | int]) -> str:
    """The branch a ticket is submitted for: the key's own; an operator must name one."""
    if principal.branch_id is not None:
        if given is not None and given != principal.branch_id:
            raise api_error(
                403,
                f"branch_id {given!r} is not this key's branch {principal.branch_id!r}; "
                "omit branch_id or send your own",
                code="branch_mismatch",
                param="branch_id",
            )
        return principal.branch_id
    if given is None:
        raise Invalid(
            [
                ValidationIssue(
                    loc=[*loc, "branch_id"],
                    msg="required with an operator key: the branch the ticket is for",
                    type="missing",
                )
            ]
        )
    return given


def _request(
    context: ApiContext,
    body: TicketBody,
    branch: str,
    loc: list[str | int],
    idempotency_key: str | None = None,
    deadline_ms: int | None = None,
) -> TicketRequest:
    """The parsed body as the request it is, for `branch`, checked against the policy without
    parsing it again."""
    update: dict[str, Any] = {"branch_id": branch}
    if idempotency_key is not None:
        update["idempotency_key"] = idempotency_key
    if deadline_ms is not None:
        update["deadline_ms"] = min(deadline_ms, body.deadline_ms or deadline_ms)
    try:
        return context.producer.check(body.model_copy(update=update))
    except TicketValidationError as exc:
        raise Invalid(issues_from_fields(exc.errors, loc)) from None


def _shed(context: ApiContext, result: SubmitResult, ticket_type: str) -> Shed:
    return shed_answer(result, ticket_type, context.policy)


def _accepted(result: SubmitResult, ticket: Ticket | None) -> TicketAccepted:
    if ticket is None:  # an idempotency key outliving its ticket: the key's TTL is the ticket's retention
        raise api_error(
            409,
            f"idempotency key names ticket {result.ticket_id}, which is past its retention; use a new key",
            code="idempotency_key_stale",
            param="Idempotency-Key",
        )
    return TicketAccepted.from_ticket(ticket)


@router.post(
    "/tickets",
    status_code=202,
    response_model=TicketAccepted,
    responses=error_responses(
        {
            400: UNREADABLE,
            401: UNAUTHORIZED,
            403: "branch_id is not the key's branch",
            409: "Idempotency-Key header and body disagree, or the key names a ticket past its retention",
            413: TOO_LARGE,
            429: "shed by admission control (overload); retry after the given seconds",
        }
    ),
    summary="Submit one ticket",
)
async def submit_ticket(
    body: Annotated[TicketBody, Body(openapi_examples=TICKET_BODY_EXAMPLES)],
    context: Context,
    principal: Caller,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=IDEMPOTENCY_KEY_MAX,
            description="a retry with the same key returns the same ticket",
        ),
    ] = None,
    deadline_ms: DeadlineMs = None,  # type: ignore[assignment]
) -> JSONResponse:
    """202 with the ticket's id, status, priority and expiry; 429 with Retry-After when shed."""
    try:
        request = submission_request(context, principal, body, idempotency_key, deadline_ms)
    except Invalid as exc:
        raise RequestValidationError([issue.model_dump() for issue in exc.issues]) from None
    return await answer_submission(context, request)


def submission_request(
    context: ApiContext,
    principal: Principal,
    body: TicketBody,
    idempotency_key: str | None,
    deadline_ms: int | None = None,
) -> TicketRequest:
    """The request a POSTed body makes for this caller, checked against the policy; ApiError (403,
    409) or Invalid (422) otherwise. The submit shortcut (producer/api/submit_shortcut.py) builds its
    request here too, so both paths submit the same ticket."""
    branch = _branch_for(principal, body.branch_id, ["body"])
    if idempotency_key is not None and body.idempotency_key not in (None, idempotency_key):
        raise api_error(
            409,
            f"Idempotency-Key header {idempotency_key!r} differs from the body's idempotency_key "
            f"{body.idempotency_key!r}; send one of them, or the same value in both",
            code="idempotency_key_conflict",
            param="Idempotency-Key",
        )
    return _request(context, body, branch, ["body"], idempotency_key, deadline_ms)


async def answer_submission(context: ApiContext, request: TicketRequest) -> JSONResponse:
    """Submit and answer: 202 (or a replay of an earlier ticket), ApiError 429 when shed. The route
    and the submit shortcut both answer here."""
    # On the event loop, with the ticket sent on the asyncio client (Producer.submit_async): the
    # hottest route pays no threadpool hop. A ready JSONResponse (the model is documented via
    # response_model) spares FastAPI validating the returned model again.
    result = await context.producer.submit_async(request)
    log_submitted(result, request)
    if result.outcome == "rejected":
        shed = _shed(context, result, request.type)
        raise ApiError(429, shed.error, shed.headers)
    headers = {}
    ticket = result.ticket
    if result.outcome == "existing":
        headers[REPLAYED_HEADER] = "true"
        ticket = await run_in_threadpool(context.producer.get, result.ticket_id)
    accepted = _accepted(result, ticket)
    return JSONResponse(accepted.model_dump(mode="json"), status_code=202, headers=headers)


def _batch_item(
    index: int, result: SubmitResult, ticket: Ticket | None, shed: Shed | None
) -> BatchItemResult:
    if shed is not None:
        return BatchItemResult(
            index=index,
            status_code=429,
            outcome="rejected",
            id=result.ticket_id,
            status=TicketStatus.REJECTED,
            retry_after=shed.retry_after,
            error=shed.error,
        )
    return BatchItemResult(
        index=index,
        status_code=202,
        outcome=result.outcome,
        id=result.ticket_id,
        status=ticket.status if ticket else None,
        priority=ticket.priority if ticket else None,
        expires_at=ticket.expires_at if ticket else None,
    )


@router.post(
    "/tickets/batch",
    response_model=BatchResult,
    responses=error_responses({400: UNREADABLE, 401: UNAUTHORIZED, 413: TOO_LARGE}),
    summary="Submit up to 500 tickets; each item succeeds or fails on its own",
)
def submit_batch(
    body: Annotated[BatchBody, Body(openapi_examples=BATCH_BODY_EXAMPLES)],
    context: Context,
    principal: Caller,
) -> BatchResult:
    """Per-item results in request order; each item answers what a single POST would have."""
    items: dict[int, BatchItemResult] = {}
    valid: list[tuple[int, TicketRequest]] = []
    for index, raw in enumerate(body.tickets):
        loc: list[str | int] = ["body", "tickets", index]
        try:
            try:
                parsed = TicketBody.model_validate(raw)
            except ValidationError as exc:
                raise Invalid(issues_from_pydantic(exc.errors(include_url=False), loc)) from None
            branch = _branch_for(principal, parsed.branch_id, loc)
            valid.append((index, _request(context, parsed, branch, loc)))
        except Invalid as exc:
            items[index] = BatchItemResult(
                index=index, status_code=422, outcome="invalid", error=validation_error(exc.issues)
            )
        except ApiError as exc:
            items[index] = BatchItemResult(index=index, status_code=403, outcome="forbidden", error=exc.error)
    results = context.producer.submit_many([request for _, request in valid]) if valid else []
    replayed = [r.ticket_id for r in results if r.outcome == "existing"]
    stored = dict(zip(replayed, context.producer.queue.get_many(replayed), strict=True)) if replayed else {}
    for (index, request), result in zip(valid, results, strict=True):
        ticket = stored.get(result.ticket_id) if result.outcome == "existing" else result.ticket
        log_submitted(result, request)
        shed = _shed(context, result, request.type) if result.outcome == "rejected" else None
        items[index] = _batch_item(index, result, ticket, shed)
    ordered = [items[i] for i in sorted(items)]
    return BatchResult(
        queued=sum(r.outcome == "queued" for r in results),
        existing=len(replayed),
        rejected=sum(r.outcome == "rejected" for r in results),
        invalid=sum(item.status_code in (403, 422) for item in ordered),
        results=ordered,
    )


def _not_found(ticket_id: str) -> ApiError:
    return api_error(
        404,
        f"no ticket {ticket_id!r} for this key (unknown, another branch's, or past its retention)",
        code="ticket_not_found",
        param="ticket_id",
    )


def own_ticket(context: ApiContext, principal: Principal, ticket_id: str) -> Ticket:
    ticket = context.producer.get(ticket_id)
    if ticket is None or not principal.may_see(ticket.branch_id):
        raise _not_found(ticket_id)
    return ticket


@router.get(
    "/tickets/{ticket_id}",
    response_model=TicketView,
    responses=error_responses({401: UNAUTHORIZED, 404: NOT_FOUND}),
    summary="Read a ticket: status, result, error, timings",
)
def read_ticket(ticket_id: TicketId, context: Context, principal: Caller) -> JSONResponse:
    """The ticket; once a worker started it, `X-Tidegate-Queue-Ms` says how long it was queued."""
    ticket = own_ticket(context, principal, ticket_id)
    view = TicketView.from_ticket(ticket)
    headers = {}
    if ticket.queue_wait_seconds is not None:
        headers[QUEUE_MS_HEADER] = str(max(round(ticket.queue_wait_seconds * 1000), 0))
    return JSONResponse(view.model_dump(mode="json"), headers=headers)


@router.delete(
    "/tickets/{ticket_id}",
    response_model=CancelResult,
    responses=error_responses({401: UNAUTHORIZED, 404: NOT_FOUND}),
    summary="Cancel a ticket; a running one has its inference aborted",
)
def cancel_ticket(ticket_id: TicketId, context: Context, principal: Caller) -> CancelResult:
    """Cancelling an ended ticket changes nothing and says so (`cancelled: false`), so retries are safe."""
    ticket = own_ticket(context, principal, ticket_id)
    previous = context.producer.cancel(ticket.id)
    if previous == "missing":  # its retention ran out between the read and the cancel
        raise _not_found(ticket_id)
    before = TicketStatus(previous)
    cancelled = not before.terminal
    return CancelResult(
        id=ticket.id,
        status=TicketStatus.CANCELLED if cancelled else before,
        previous_status=before,
        cancelled=cancelled,
    )
