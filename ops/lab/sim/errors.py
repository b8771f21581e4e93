"""Error bodies in the form vLLM's OpenAI-compatible server returns them (see ops/lab/vllm_cpu/OBSERVED.md).

vLLM answers `{"error": {"message", "type", "param", "code"}}` with `code` the HTTP status. A check in
vLLM's own code is a `BadRequestError` whose message ends `(parameter=…, value=…)`; a body that fails
schema validation is a `Bad Request` listing pydantic's errors, with `param` the first error's location.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

ERROR_TYPES: dict[int, str] = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}
SCHEMA_ERROR_TYPE = "Bad Request"
_UNSET = object()


def error_body(
    status: int, message: str, param: str | None = None, err_type: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": err_type or ERROR_TYPES.get(status, HTTPStatus(status).phrase.replace(" ", "") + "Error"),
            "param": param,
            "code": status,
        }
    }


class ApiError(Exception):
    """Raised by request handling; turned into a vLLM-shaped JSON error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        err_type: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.err_type)

    def response(self) -> JSONResponse:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return JSONResponse(self.body(), self.status, headers=headers)


def invalid(message: str, parameter: str | None = None, value: object = _UNSET) -> ApiError:
    """A 400 from one of vLLM's own checks, naming the parameter and the value it refused."""
    if parameter is not None and value is not _UNSET:
        message = f"{message} (parameter={parameter}, value={value})"
    elif parameter is not None:
        message = f"{message} (parameter={parameter})"
    return ApiError(HTTPStatus.BAD_REQUEST, message, param=parameter)


def schema_error(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    """A 400 for a body that fails validation, listing each error the way vLLM prints pydantic's."""
    entries = [_entry(error) for error in errors]
    plural = "" if len(entries) == 1 else "s"
    message = f"{len(entries)} validation error{plural}:\n" + "\n".join(f"  {entry}" for entry in entries)
    first = entries[0]["loc"] if entries else None
    return ApiError(HTTPStatus.BAD_REQUEST, message, param=first, err_type=SCHEMA_ERROR_TYPE)


def _entry(error: Mapping[str, Any]) -> dict[str, Any]:
    loc = ".".join(str(part) for part in ("body", *error.get("loc", ())))
    entry: dict[str, Any] = {
        "type": error["type"],
        "loc": loc,
        "msg": error["msg"],
        "input": _brief(error.get("input")),
    }
    if error.get("ctx"):
        entry["ctx"] = {key: str(value) for key, value in error["ctx"].items()}
    return entry


def _brief(value: object) -> object:
    """Inputs as vLLM shows them: containers summarised, long text cut."""
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list) and len(value) > 8:
        return f"<list of {len(value)} items>"
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    return value
