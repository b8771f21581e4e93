"""Error bodies and exception handlers: every failure answers JSON, and no input reaches a 500.

Every 4xx and 5xx uses one envelope in OpenAI's shape (`{"error": {message, type, param, code}}`)
so branch systems built on OpenAI clients already parse them. A 422 names its first bad field in
`param` and lists every one in `issues` (`[{loc, msg, type}]`), without echoing the input back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from producer.api.schemas import ErrorBody, ErrorObject, ValidationIssue
from shared.errors import FieldError
from shared.replica_acks import ReplicaAcksMissing

log = logging.getLogger("tidegate.api")

REDIS_DOWN_RETRY_AFTER = 1

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "internal_error",
    503: "service_unavailable",
}


ResponseDocs = dict[int | str, dict[str, Any]]

UNAUTHORIZED = "missing, unknown or revoked API key"
UNREADABLE = "body is not UTF-8 text"
TOO_LARGE = "body over TIDEGATE_API_MAX_BODY_BYTES"
_RETRY_AFTER_DOC = {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}


INVALID = "a field, header or parameter is invalid; `param` names the first, `issues` lists all"
REDIS_DOWN = "the queue's store is unreachable or full; nothing was changed, retry after the given seconds"


def error_responses(descriptions: Mapping[int, str], *, validated: bool = True) -> ResponseDocs:
    """OpenAPI entries for error statuses a route answers (all with the one error body). Routes
    taking input also answer 422, and every route that reads the queue may answer 503."""
    docs: ResponseDocs = {}
    extra = {422: INVALID} if validated else {}
    for status, description in {**extra, 503: REDIS_DOWN, **descriptions}.items():
        doc: dict[str, Any] = {"model": ErrorBody, "description": description}
        if status in (429, 503):
            doc["headers"] = {"Retry-After": _RETRY_AFTER_DOC}
        docs[status] = doc
    return docs


class ApiError(Exception):
    """Raised by a route to answer `status` with an OpenAI-style error body."""

    def __init__(self, status: int, error: ErrorObject, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(error.message)
        self.status = status
        self.error = error
        self.headers = dict(headers or {})


def api_error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    error_type = _STATUS_TYPES.get(status, "invalid_request_error")
    return ApiError(status, ErrorObject(message=message, type=error_type, param=param, code=code), headers)


def error_response(status: int, error: ErrorObject, headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=error).model_dump(mode="json", exclude_none=False)
    for optional in ("ticket_id", "issues"):
        if body["error"][optional] is None:
            body["error"].pop(optional)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def issues_from_pydantic(
    errors: Iterable[Mapping[str, Any]], prefix: Sequence[str | int] = ()
) -> list[ValidationIssue]:
    """pydantic/FastAPI error dicts as issues; `prefix` locates them (e.g. body, tickets, 3)."""
    out = []
    for item in errors:
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        loc = [*prefix, *(p if isinstance(p, int) else str(p) for p in item.get("loc", ()))]
        out.append(ValidationIssue(loc=loc, msg=message, type=str(item.get("type", "value_error"))))
    return out


def issues_from_fields(errors: Iterable[FieldError], prefix: Sequence[str | int]) -> list[ValidationIssue]:
    """The producer's FieldErrors (policy checks: known type, context limit) as 422 issues."""
    out = []
    for error in errors:
        parts: list[str | int] = []
        if error.field != "body":
            parts = [int(p) if p.isdigit() else p for p in error.field.split(".")]
        kind = "extra_forbidden" if error.message == "unknown field" else "value_error"
        out.append(ValidationIssue(loc=[*prefix, *parts], msg=error.message, type=kind))
    return out


_LOCATIONS = ("body", "query", "path", "header", "cookie")


def issue_param(issue: ValidationIssue) -> str:
    """The field an issue names, as a client spells it: `callback_url`, `messages.0.role`, a header
    or path parameter by its name; `body` for the body as a whole."""
    loc = list(issue.loc)
    if len(loc) > 1 and loc[0] in _LOCATIONS:
        loc = loc[1:]
    return ".".join(str(part) for part in loc) or "body"


def validation_error(issues: list[ValidationIssue]) -> ErrorObject:
    """The 422 error object: the first bad field in `param`, every one in `issues` and the message."""
    message = "; ".join(f"{'.'.join(str(p) for p in i.loc)}: {i.msg}" for i in issues) or "invalid request"
    return ErrorObject(
        message=message,
        type="invalid_request_error",
        param=issue_param(issues[0]) if issues else None,
        code="invalid_field",
        issues=issues,
    )


def validation_response(issues: list[ValidationIssue]) -> JSONResponse:
    return error_response(422, validation_error(issues))


async def _on_request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_response(issues_from_pydantic(exc.errors()))


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.error, exc.headers)


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error = ErrorObject(
        message=str(exc.detail), type=_STATUS_TYPES.get(exc.status_code, "invalid_request_error")
    )
    return error_response(exc.status_code, error, exc.headers)


def _redis_trouble(code: str, words: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """A 503 handler for one kind of Redis trouble: nothing was changed, so a retry is safe."""

    async def handler(request: Request, exc: Exception) -> JSONResponse:
        log.warning("Redis %s while serving %s %s: %s", words, request.method, request.url.path, exc)
        error = ErrorObject(
            message=f"the queue's Redis is {words}; nothing was changed, retry shortly",
            type="service_unavailable",
            code=code,
        )
        return error_response(503, error, {"Retry-After": str(REDIS_DOWN_RETRY_AFTER)})

    return handler


# The memory guard sheds non-critical intake well before Redis is full; reaching it means it is.
_on_redis_down = _redis_trouble("redis_unavailable", "unreachable")
_on_redis_full = _redis_trouble("redis_memory_full", "out of memory")


async def _on_acks_missing(request: Request, exc: Exception) -> JSONResponse:
    log.warning("replicas did not confirm %s %s: %s", request.method, request.url.path, exc)
    error = ErrorObject(
        message=f"{exc}; the ticket is not acknowledged: retry with the same Idempotency-Key",
        type="service_unavailable",
        code="replica_acks_missing",
    )
    return error_response(503, error, {"Retry-After": str(REDIS_DOWN_RETRY_AFTER)})


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Last resort only: the tests drive generated input through every route and expect none here.
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    error = ErrorObject(message="internal error; it has been logged", type="internal_error")
    return error_response(500, error)


_HANDLERS: dict[type[Exception], Callable[[Request, Exception], Awaitable[JSONResponse]]] = {
    RequestValidationError: _on_request_validation,
    ApiError: _on_api_error,
    StarletteHTTPException: _on_http_exception,
    redis.ConnectionError: _on_redis_down,
    redis.TimeoutError: _on_redis_down,
    redis.exceptions.OutOfMemoryError: _on_redis_full,
    ReplicaAcksMissing: _on_acks_missing,
    Exception: _on_unexpected,
}


def install_error_handlers(app: FastAPI) -> None:
    for kind, handler in _HANDLERS.items():
        app.add_exception_handler(kind, handler)


async def error_answer(request: Request, exc: Exception) -> JSONResponse:
    """The answer the app's handlers give `exc`, for code that runs outside them (a middleware)."""
    for kind in type(exc).__mro__:
        handler = _HANDLERS.get(kind)
        if handler is not None:
            return await handler(request, exc)
    raise exc  # a BaseException that is no Exception: not ours to answer
