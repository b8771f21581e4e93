"""TidegateClient (sync) and AsyncTidegateClient: the branch-office API with safe retries.

Both build the same calls (`_Calls`) and retry them by the same rules (`retry.Retrier`): 429, 5xx
and connection errors are retried with full-jitter backoff, or exactly the server's Retry-After,
within one deadline per call. Every submission carries an Idempotency-Key, generated when the
caller gives none, so a retry after a lost response can never queue a ticket twice. Streams are
retried the same way until their answer starts; after that a failure ends the stream.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from tidegate_client.errors import ConnectionFailed, StreamTimeout, WaitTimeout
from tidegate_client.models import (
    BatchResult,
    CancelResult,
    CompletionChunk,
    QueuesView,
    TicketAccepted,
    TicketEnd,
    TicketEvent,
    TicketView,
)
from tidegate_client.retry import Retrier, RetryEvent, RetryPolicy
from tidegate_client.sse import ServerEvent, SseDecoder
from tidegate_client.streams import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DEFAULT_STREAM_TIMEOUT_S,
    LAST_EVENT_ID,
    TICKET_HEADER,
    Resume,
    chunk_item,
    streamed_body,
    ticket_item,
)

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 10.0
USER_AGENT = "tidegate-client/0.1"


def body_of(ticket: Any) -> dict[str, Any]:
    """A ticket given as a mapping or as any object with pydantic's `model_dump` (duck-typed, so
    this package needs no pydantic)."""
    dump = getattr(ticket, "model_dump", None)
    if callable(dump):
        return dict(dump(mode="json", exclude_unset=True))
    return dict(ticket)


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class _Calls:
    """What each API method sends and how its answer is read, for both clients."""

    @staticmethod
    def submit(ticket: Mapping[str, Any] | Any, idempotency_key: str | None) -> _Call[TicketAccepted]:
        body = body_of(ticket)
        key = idempotency_key or body.get("idempotency_key") or uuid.uuid4().hex
        return _Call("POST", "/v1/tickets", TicketAccepted.from_json, body, {"Idempotency-Key": str(key)})

    @staticmethod
    def submit_many(tickets: Sequence[Mapping[str, Any] | Any]) -> _Call[BatchResult]:
        items = []
        for ticket in tickets:
            item = body_of(ticket)
            item.setdefault("idempotency_key", uuid.uuid4().hex)  # makes retrying the batch safe
            items.append(item)
        return _Call("POST", "/v1/tickets/batch", BatchResult.from_json, {"tickets": items})

    @staticmethod
    def get(ticket_id: str) -> _Call[TicketView]:
        return _Call("GET", f"/v1/tickets/{ticket_id}", TicketView.from_json)

    @staticmethod
    def cancel(ticket_id: str) -> _Call[CancelResult]:
        return _Call("DELETE", f"/v1/tickets/{ticket_id}", CancelResult.from_json)

    @staticmethod
    def queues() -> _Call[QueuesView]:
        return _Call("GET", "/v1/queues", QueuesView.from_json)

    @staticmethod
    def stream(ticket_id: str, last_event_id: str | None = None) -> _Call[None]:
        headers = {LAST_EVENT_ID: last_event_id} if last_event_id else {}
        return _Call("GET", f"/v1/tickets/{ticket_id}/stream", _nothing, headers=headers)

    @staticmethod
    def openai_stream(
        path: str, body: Mapping[str, Any], include_usage: bool, headers: Mapping[str, str] | None
    ) -> _Call[None]:
        return _Call("POST", path, _nothing, streamed_body(body, include_usage), dict(headers or {}))


def _nothing(_: Any) -> None:
    return None


class _Stream:
    """One open stream's deadline and event decoding, for both clients."""

    def __init__(self, call: _Call[Any], timeout: float) -> None:
        self.url = call.path
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.decoder = SseDecoder()

    def feed(self, line: str) -> ServerEvent | None:
        if time.monotonic() > self.deadline:
            raise self.timed_out()
        return self.decoder.feed(line)

    def timed_out(self) -> StreamTimeout:
        return StreamTimeout(f"{self.url}: the stream had not ended within {self.timeout:g} s")

    def failed(self, error: httpx.TransportError) -> ConnectionFailed | StreamTimeout:
        if isinstance(error, httpx.TimeoutException):
            return self.timed_out()
        return ConnectionFailed(f"{self.url}: the stream broke off ({type(error).__name__}: {error})")


class _Base:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float,
        retry: RetryPolicy | None,
        on_retry: Callable[[RetryEvent], None] | None,
        rng: random.Random | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = httpx.Timeout(timeout)
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.rng = rng or random.Random()
        self.headers = {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT}

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(cap, base × 2^attempt)]."""
        return self.retry.backoff(attempt, self.rng)

    def _retrier(self, call: _Call[Any]) -> Retrier:
        return Retrier(self.retry, self.rng, call.method, self.base_url + call.path, self.on_retry)

    def _request(
        self, http: httpx.Client | httpx.AsyncClient, call: _Call[Any], timeout: float | None
    ) -> httpx.Request:
        """`call` as a request; a stream waits up to its whole `timeout` for each read (a queued
        ticket sends nothing until its first token)."""
        limit = self.timeout if timeout is None else httpx.Timeout(timeout, connect=self.timeout.connect)
        return http.build_request(
            call.method, self.base_url + call.path, json=call.json, headers=call.headers, timeout=limit
        )


class TidegateClient(_Base):
    """The API over one pooled httpx.Client; use it as a context manager or call `close`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout=timeout, retry=retry, on_retry=on_retry, rng=rng)
        self.sleep = sleep
        self.http = httpx.Client(headers=self.headers, timeout=self.timeout, transport=transport)

    def __enter__(self) -> TidegateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def submit(
        self, ticket: Mapping[str, Any] | Any, *, idempotency_key: str | None = None
    ) -> TicketAccepted:
        """Queue one ticket; retried safely (same Idempotency-Key) until accepted or the deadline."""
        return self._run(_Calls.submit(ticket, idempotency_key))

    def submit_many(self, tickets: Sequence[Mapping[str, Any] | Any]) -> BatchResult:
        """Queue up to 500 tickets; each item gets its own result (an item shed by admission is not
        retried here: its result carries `retry_after`)."""
        return self._run(_Calls.submit_many(tickets))

    def get(self, ticket_id: str) -> TicketView:
        return self._run(_Calls.get(ticket_id))

    def cancel(self, ticket_id: str) -> CancelResult:
        """Cancel; cancelling an ended ticket changes nothing (`cancelled` is then false)."""
        return self._run(_Calls.cancel(ticket_id))

    def queues(self) -> QueuesView:
        return self._run(_Calls.queues())

    def wait(
        self, ticket_id: str, timeout: float = 60.0, *, poll_initial: float = 0.1, poll_max: float = 2.0
    ) -> TicketView:
        """Poll until the ticket ends or `timeout` passes; the interval doubles from `poll_initial`
        to `poll_max`, so short tickets are seen quickly and long ones cost few requests."""
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

    def stream(self, ticket_id: str, *, timeout: float = DEFAULT_STREAM_TIMEOUT_S) -> Iterator[TicketEvent]:
        """A ticket's answer while it is produced: tokens (when it was submitted with
        `"live": "tokens"`), retries, then its `TicketEnd`. Leaving the loop does not cancel it.
        A stream that breaks off is reopened with `Last-Event-ID`, within `timeout`, and goes on
        after the last event received (each event exactly once)."""
        resume = Resume(timeout)
        while True:
            try:
                call = _Calls.stream(ticket_id, resume.last_id)
                for _, event in self._events(call, resume.remaining()):
                    resume.saw(event)
                    item = ticket_item(event)
                    if item is not None:
                        yield item
                    if isinstance(item, TicketEnd):
                        return
                return
            except ConnectionFailed:
                if not resume.possible():
                    raise

    def chat_stream(
        self,
        body: Mapping[str, Any],
        *,
        include_usage: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_STREAM_TIMEOUT_S,
    ) -> Iterator[CompletionChunk]:
        """POST /v1/chat/completions with `stream` on: its chunks as they come. Leaving the loop
        early closes the connection, which cancels the ticket (the front door's contract)."""
        call = _Calls.openai_stream(CHAT_PATH, body, include_usage, headers)
        yield from self._chunks(call, timeout)

    def completion_stream(
        self,
        body: Mapping[str, Any],
        *,
        include_usage: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_STREAM_TIMEOUT_S,
    ) -> Iterator[CompletionChunk]:
        """As `chat_stream`, for POST /v1/completions."""
        call = _Calls.openai_stream(COMPLETIONS_PATH, body, include_usage, headers)
        yield from self._chunks(call, timeout)

    def _chunks(self, call: _Call[None], timeout: float) -> Iterator[CompletionChunk]:
        for ticket_id, event in self._events(call, timeout):
            chunk = chunk_item(event, ticket_id)
            if chunk is None:
                return
            yield chunk

    def _events(self, call: _Call[None], timeout: float) -> Iterator[tuple[str | None, ServerEvent]]:
        stream = _Stream(call, timeout)
        response = self._send(call, timeout)
        ticket_id = response.headers.get(TICKET_HEADER)
        try:
            for line in response.iter_lines():
                event = stream.feed(line)
                if event is not None:
                    yield ticket_id, event
        except httpx.TransportError as exc:
            raise stream.failed(exc) from exc
        finally:
            response.close()

    def _run(self, call: _Call[T]) -> T:
        response = self._send(call)
        return call.parse(response.json())

    def _send(self, call: _Call[Any], stream_timeout: float | None = None) -> httpx.Response:
        """The first answer under 400, retrying by the rules; a stream's body is left unread."""
        retrier = self._retrier(call)
        while True:
            response: httpx.Response | None = None
            error: httpx.TransportError | None = None
            try:
                request = self._request(self.http, call, stream_timeout)
                response = self.http.send(request, stream=stream_timeout is not None)
            except httpx.TransportError as exc:
                error = exc
            else:
                if response.status_code < 400:
                    return response
                response.read()
                response.close()
            self.sleep(retrier.pause(response, error))


class AsyncTidegateClient(_Base):
    """The same API as TidegateClient, as coroutines over one httpx.AsyncClient."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        rng: random.Random | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout=timeout, retry=retry, on_retry=on_retry, rng=rng)
        self.http = httpx.AsyncClient(headers=self.headers, timeout=self.timeout, transport=transport)

    async def __aenter__(self) -> AsyncTidegateClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def submit(
        self, ticket: Mapping[str, Any] | Any, *, idempotency_key: str | None = None
    ) -> TicketAccepted:
        return await self._run(_Calls.submit(ticket, idempotency_key))

    async def submit_many(self, tickets: Sequence[Mapping[str, Any] | Any]) -> BatchResult:
        return await self._run(_Calls.submit_many(tickets))

    async def get(self, ticket_id: str) -> TicketView:
        return await self._run(_Calls.get(ticket_id))

    async def cancel(self, ticket_id: str) -> CancelResult:
        return await self._run(_Calls.cancel(ticket_id))

    async def queues(self) -> QueuesView:
        return await self._run(_Calls.queues())

    async def wait(
        self, ticket_id: str, timeout: float = 60.0, *, poll_initial: float = 0.1, poll_max: float = 2.0
    ) -> TicketView:
        """As TidegateClient.wait, sleeping with asyncio so other tasks run meanwhile."""
        deadline = time.monotonic() + timeout
        interval = poll_initial
        while True:
            view = await self.get(ticket_id)
            if view.terminal:
                return view
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(ticket_id, timeout, view)
            await asyncio.sleep(min(interval, remaining))
            interval = min(interval * 2, poll_max)

    async def stream(
        self, ticket_id: str, *, timeout: float = DEFAULT_STREAM_TIMEOUT_S
    ) -> AsyncIterator[TicketEvent]:
        """As TidegateClient.stream (resumed with `Last-Event-ID` when it breaks off)."""
        resume = Resume(timeout)
        while True:
            try:
                call = _Calls.stream(ticket_id, resume.last_id)
                async for _, event in self._events(call, resume.remaining()):
                    resume.saw(event)
                    item = ticket_item(event)
                    if item is not None:
                        yield item
                    if isinstance(item, TicketEnd):
                        return
                return
            except ConnectionFailed:
                if not resume.possible():
                    raise

    async def chat_stream(
        self,
        body: Mapping[str, Any],
        *,
        include_usage: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_STREAM_TIMEOUT_S,
    ) -> AsyncIterator[CompletionChunk]:
        """As TidegateClient.chat_stream."""
        call = _Calls.openai_stream(CHAT_PATH, body, include_usage, headers)
        async for chunk in self._chunks(call, timeout):
            yield chunk

    async def completion_stream(
        self,
        body: Mapping[str, Any],
        *,
        include_usage: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_STREAM_TIMEOUT_S,
    ) -> AsyncIterator[CompletionChunk]:
        """As TidegateClient.completion_stream."""
        call = _Calls.openai_stream(COMPLETIONS_PATH, body, include_usage, headers)
        async for chunk in self._chunks(call, timeout):
            yield chunk

    async def _chunks(self, call: _Call[None], timeout: float) -> AsyncIterator[CompletionChunk]:
        async for ticket_id, event in self._events(call, timeout):
            chunk = chunk_item(event, ticket_id)
            if chunk is None:
                return
            yield chunk

    async def _events(
        self, call: _Call[None], timeout: float
    ) -> AsyncIterator[tuple[str | None, ServerEvent]]:
        stream = _Stream(call, timeout)
        response = await self._send(call, timeout)
        ticket_id = response.headers.get(TICKET_HEADER)
        try:
            async for line in response.aiter_lines():
                event = stream.feed(line)
                if event is not None:
                    yield ticket_id, event
        except httpx.TransportError as exc:
            raise stream.failed(exc) from exc
        finally:
            await response.aclose()

    async def _run(self, call: _Call[T]) -> T:
        response = await self._send(call)
        return call.parse(response.json())

    async def _send(self, call: _Call[Any], stream_timeout: float | None = None) -> httpx.Response:
        retrier = self._retrier(call)
        while True:
            response: httpx.Response | None = None
            error: httpx.TransportError | None = None
            try:
                request = self._request(self.http, call, stream_timeout)
                response = await self.http.send(request, stream=stream_timeout is not None)
            except httpx.TransportError as exc:
                error = exc
            else:
                if response.status_code < 400:
                    return response
                await response.aread()
                await response.aclose()
            await asyncio.sleep(retrier.pause(response, error))
