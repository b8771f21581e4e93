"""TidegateClient (sync) and AsyncTidegateClient: the branch-office API's operations with safe retries.

Both build the same calls (`calls.Calls`) and send them through the same rules (`http_session`, which
retries by `retry.Retrier`): 429, 5xx and connection errors are retried with full-jitter backoff, or
exactly the server's Retry-After, within one deadline per call. Every submission carries an
Idempotency-Key, generated when the caller gives none, so a retry after a lost response can never
queue a ticket twice. Streams are retried the same way until their answer starts; after that a
failure ends the stream, and a ticket's stream is reopened after its last event (`streams.Resume`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from tidegate_client.calls import Call, Calls, body_of
from tidegate_client.errors import ConnectionFailed, StreamTimeout, WaitTimeout
from tidegate_client.http_session import DEFAULT_TIMEOUT_S, USER_AGENT, AsyncHttpSession, HttpSession
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

# The clients, and the names importable from here before the calls and the HTTP side moved out to
# `calls` and `http_session`, so that code importing them from here keeps working.
__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LAST_EVENT_ID",
    "TICKET_HEADER",
    "USER_AGENT",
    "AsyncTidegateClient",
    "Retrier",
    "RetryEvent",
    "RetryPolicy",
    "ServerEvent",
    "SseDecoder",
    "StreamTimeout",
    "TidegateClient",
    "body_of",
    "streamed_body",
]


class TidegateClient(HttpSession):
    """The API over one pooled httpx.Client; use it as a context manager or call `close`."""

    def submit(
        self, ticket: Mapping[str, Any] | Any, *, idempotency_key: str | None = None
    ) -> TicketAccepted:
        """Queue one ticket; retried safely (same Idempotency-Key) until accepted or the deadline."""
        return self._run(Calls.submit(ticket, idempotency_key))

    def submit_many(self, tickets: Sequence[Mapping[str, Any] | Any]) -> BatchResult:
        """Queue up to 500 tickets; each item gets its own result (an item shed by admission is not
        retried here: its result carries `retry_after`)."""
        return self._run(Calls.submit_many(tickets))

    def get(self, ticket_id: str) -> TicketView:
        return self._run(Calls.get(ticket_id))

    def cancel(self, ticket_id: str) -> CancelResult:
        """Cancel; cancelling an ended ticket changes nothing (`cancelled` is then false)."""
        return self._run(Calls.cancel(ticket_id))

    def queues(self) -> QueuesView:
        return self._run(Calls.queues())

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
                call = Calls.stream(ticket_id, resume.last_id)
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
        call = Calls.openai_stream(CHAT_PATH, body, include_usage, headers)
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
        call = Calls.openai_stream(COMPLETIONS_PATH, body, include_usage, headers)
        yield from self._chunks(call, timeout)

    def _chunks(self, call: Call[None], timeout: float) -> Iterator[CompletionChunk]:
        for ticket_id, event in self._events(call, timeout):
            chunk = chunk_item(event, ticket_id)
            if chunk is None:
                return
            yield chunk


class AsyncTidegateClient(AsyncHttpSession):
    """The same API as TidegateClient, as coroutines over one httpx.AsyncClient."""

    async def submit(
        self, ticket: Mapping[str, Any] | Any, *, idempotency_key: str | None = None
    ) -> TicketAccepted:
        return await self._run(Calls.submit(ticket, idempotency_key))

    async def submit_many(self, tickets: Sequence[Mapping[str, Any] | Any]) -> BatchResult:
        return await self._run(Calls.submit_many(tickets))

    async def get(self, ticket_id: str) -> TicketView:
        return await self._run(Calls.get(ticket_id))

    async def cancel(self, ticket_id: str) -> CancelResult:
        return await self._run(Calls.cancel(ticket_id))

    async def queues(self) -> QueuesView:
        return await self._run(Calls.queues())

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
                call = Calls.stream(ticket_id, resume.last_id)
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
        call = Calls.openai_stream(CHAT_PATH, body, include_usage, headers)
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
        call = Calls.openai_stream(COMPLETIONS_PATH, body, include_usage, headers)
        async for chunk in self._chunks(call, timeout):
            yield chunk

    async def _chunks(self, call: Call[None], timeout: float) -> AsyncIterator[CompletionChunk]:
        async for ticket_id, event in self._events(call, timeout):
            chunk = chunk_item(event, ticket_id)
            if chunk is None:
                return
            yield chunk
