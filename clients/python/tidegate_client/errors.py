"""The client's errors, built from the API's one error body `{"error": {...}}`."""

from __future__ import annotations

from typing import Any

import httpx

from tidegate_client.models import ErrorDetail, TicketView


class TidegateError(Exception):
    """Base of the client's errors."""


class ApiResponseError(TidegateError):
    """The API answered an error: `status`, and from its body `code`, `param` and `detail`."""

    def __init__(self, status: int, body: Any, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body
        error = body.get("error") if isinstance(body, dict) else None
        self.detail: ErrorDetail | None = None
        if isinstance(error, dict) and "message" in error:
            self.detail = ErrorDetail.from_json({"type": "", **error})
        self.code: str | None = self.detail.code if self.detail else None
        self.param: str | None = self.detail.param if self.detail else None


class RejectedError(ApiResponseError):
    """Still shed (429) when the retry deadline ran out; `retry_after` is the server's last advice."""

    def __init__(self, status: int, body: Any, message: str, retry_after: float | None) -> None:
        super().__init__(status, body, message)
        self.retry_after = retry_after


class ConnectionFailed(TidegateError):
    """No answer from the API before the retry deadline."""


class WaitTimeout(TidegateError):
    """The ticket had not ended when `wait` gave up; `last` is what was seen last."""

    def __init__(self, ticket_id: str, timeout: float, last: TicketView) -> None:
        super().__init__(f"ticket {ticket_id} still {last.status.value} after {timeout:g} s")
        self.last = last


class StreamTimeout(TidegateError):
    """A stream was still open, or quiet, when its `timeout` passed."""


class StreamInterrupted(TidegateError):
    """The server ended a started stream with an error event (`detail` is its error object)."""

    def __init__(self, detail: ErrorDetail) -> None:
        super().__init__(detail.message)
        self.detail = detail
        self.code = detail.code


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _message(status: int, body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
    return str(body)[:500] or f"HTTP {status}"


def error_of(response: httpx.Response, retry_after: float | None = None) -> ApiResponseError:
    status = response.status_code
    body = _body(response)
    if status == 429:
        return RejectedError(status, body, _message(status, body), retry_after)
    return ApiResponseError(status, body, _message(status, body))
