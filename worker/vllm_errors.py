"""How a failed vLLM call is classified: transient (the ticket goes back) or permanent (4xx, vLLM's
own message), with the `kind` label of `tidegate_vllm_errors_total`."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import requests


class ErrorKind(StrEnum):
    """The `kind` label of `tidegate_vllm_errors_total`."""

    CONNECT = "connection"
    TIMEOUT = "timeout"
    SERVER = "http_5xx"
    OOM = "oom"
    PROTOCOL = "protocol"
    CLIENT = "http_4xx"


TRANSIENT_KINDS = frozenset(
    {ErrorKind.CONNECT, ErrorKind.TIMEOUT, ErrorKind.SERVER, ErrorKind.OOM, ErrorKind.PROTOCOL}
)


class VllmError(Exception):
    """A failed call; `transient` tells whether another attempt may succeed."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status_code = status_code
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT_KINDS


def error_message(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
    return fallback


def classify_status(status: int, message: str, retry_after: float | None) -> VllmError:
    if "out of memory" in message.lower():
        return VllmError(ErrorKind.OOM, message, status_code=status, retry_after=retry_after)
    if status >= 500 or status in (408, 429):
        return VllmError(ErrorKind.SERVER, message, status_code=status, retry_after=retry_after)
    return VllmError(ErrorKind.CLIENT, message, status_code=status)


def retry_after_seconds(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    try:
        return float(value) if value else None
    except ValueError:
        return None
