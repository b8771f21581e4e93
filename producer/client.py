"""TidegateClient: the branch-office HTTP API from Python, with safe retries.

Retries 429, 5xx and connection errors with exponential backoff and full jitter (or exactly the
server's Retry-After when it gives one), all bounded by one deadline per call. Every submission
carries an Idempotency-Key, generated when the caller gives none, so a retry after a lost response
can never queue a ticket twice.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from pydantic import BaseModel

from producer.api.schemas import BatchResult, CancelResult, QueuesView, TicketAccepted, TicketView

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_RETRY_DEADLINE_S = 60.0
BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 10.0


class TidegateError(Exception):
    """Base of the client's errors."""


class ApiResponseError(TidegateError):
    """The API answered an error; `status`, `code` and `body` say which."""

    def __init__(self, status: int, body: Any, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body
        error = body.get("error") if isinstance(body, dict) else None
        self.code: str | None = error.get("code") if isinstance(error, dict) else None


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


@dataclass(frozen=True)
class RetryEvent:
    """One retry about to happen: why, and how long the client sleeps first."""

    method: str
    path: str
    attempt: int
    status: int | None
    error: str | None
    sleep_seconds: float


def _message(status: int, body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "detail" in body:
            detail = body["detail"]
            if isinstance(detail, list):
                return "; ".join(
                    f"{'.'.join(str(p) for p in item.get('loc', []))}: {item.get('msg')}"
                    for item in detail
                    if isinstance(item, dict)
                )
            return str(detail)
    return str(body)[:500] or f"HTTP {status}"


def _json(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _error_of(response: requests.Response, retry_after: float | None = None) -> ApiResponseError:
    status = response.status_code
    body = _json(response)
    if status == 429:
        return RejectedError(status, body, _message(status, body), retry_after)
    return ApiResponseError(status, body, _message(status, body))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delay-seconds form); None when absent or not a number."""
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None


class TidegateClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry_deadline: float = DEFAULT_RETRY_DEADLINE_S,
        backoff_base: float = BACKOFF_BASE_S,
        backoff_cap: float = BACKOFF_CAP_S,
        session: requests.Session | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry_deadline = retry_deadline
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.on_retry = on_retry
        self.rng = rng or random.Random()
        self.sleep = sleep

    def __enter__(self) -> TidegateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    # ---- the API ----------------------------------------------------------------------------
    def submit(
        self, ticket: Mapping[str, Any] | BaseModel, *, idempotency_key: str | None = None
    ) -> TicketAccepted:
        """Queue one ticket; retried safely (same Idempotency-Key) until accepted or the deadline."""
        body = (
            ticket.model_dump(mode="json", exclude_unset=True)
            if isinstance(ticket, BaseModel)
            else dict(ticket)
        )
        key = idempotency_key or body.get("idempotency_key") or uuid.uuid4().hex
        response = self._request("POST", "/v1/tickets", json=body, headers={"Idempotency-Key": str(key)})
        return TicketAccepted.model_validate(response.json())

    def submit_many(self, tickets: Sequence[Mapping[str, Any] | BaseModel]) -> BatchResult:
        """Queue up to 500 tickets; each item gets its own result (an item shed by admission is not
        retried here: its result carries `retry_after`)."""
        items = []
        for ticket in tickets:
            item = (
                ticket.model_dump(mode="json", exclude_unset=True)
                if isinstance(ticket, BaseModel)
                else dict(ticket)
            )
            item.setdefault("idempotency_key", uuid.uuid4().hex)  # makes retrying the batch safe
            items.append(item)
        response = self._request("POST", "/v1/tickets/batch", json={"tickets": items})
        return BatchResult.model_validate(response.json())

    def get(self, ticket_id: str) -> TicketView:
        return TicketView.model_validate(self._request("GET", f"/v1/tickets/{ticket_id}").json())

    def cancel(self, ticket_id: str) -> CancelResult:
        return CancelResult.model_validate(self._request("DELETE", f"/v1/tickets/{ticket_id}").json())

    def queues(self) -> QueuesView:
        return QueuesView.model_validate(self._request("GET", "/v1/queues").json())

    def wait(
        self, ticket_id: str, timeout: float = 60.0, *, poll_initial: float = 0.1, poll_max: float = 2.0
    ) -> TicketView:
        """Poll until the ticket ends (done, failed, expired, cancelled, rejected) or `timeout` passes.

        The interval doubles from `poll_initial` up to `poll_max`, so short tickets are seen quickly and
        long ones cost few requests.
        """
        deadline = time.monotonic() + timeout
        interval = poll_initial
        while True:
            view = self.get(ticket_id)
            if view.terminal:
                return view
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(ticket_id, timeout, view)
            self.sleep(min(interval, remaining))
            interval = min(interval * 2, poll_max)

    # ---- transport ----------------------------------------------------------------------------
    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(cap, base × 2^attempt)], so clients never retry in step."""
        return self.rng.uniform(0, min(self.backoff_cap, self.backoff_base * 2**attempt))

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        deadline = time.monotonic() + self.retry_deadline
        attempt = 0
        while True:
            response: requests.Response | None = None
            error: str | None = None
            retry_after: float | None = None
            try:
                response = self.session.request(
                    method, self.base_url + path, json=json, headers=dict(headers or {}), timeout=self.timeout
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in RETRY_STATUSES:
                    raise _error_of(response)
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
            pause = retry_after if retry_after is not None else self.backoff(attempt)
            if time.monotonic() + pause > deadline:
                if response is None:
                    raise ConnectionFailed(
                        f"{method} {self.base_url}{path}: no answer within the "
                        f"{self.retry_deadline:g} s retry deadline ({error})"
                    )
                raise _error_of(response, retry_after)
            if self.on_retry is not None:
                status = None if response is None else response.status_code
                self.on_retry(RetryEvent(method, path, attempt + 1, status, error, pause))
            self.sleep(pause)
            attempt += 1
