"""The clients' HTTP side: one pooled httpx client that sends a `Call`, retries it by the rules of
`retry.Retrier`, and opens a stream and reads it into server events within the stream's deadline.

Kept apart from client.py so the ticket operations there read as what they ask and return, and so
the sync and async send loops sit side by side, where a change to one is seen against the other.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Self, TypeVar

import httpx

from tidegate_client.calls import Call
from tidegate_client.errors import ConnectionFailed, StreamTimeout
from tidegate_client.retry import Retrier, RetryEvent, RetryPolicy
from tidegate_client.sse import ServerEvent, SseDecoder
from tidegate_client.streams import TICKET_HEADER

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 10.0
USER_AGENT = "tidegate-client/0.1"


class _Stream:
    """One open stream's deadline and event decoding, for both clients."""

    def __init__(self, call: Call[Any], timeout: float) -> None:
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


class _SessionBase:
    """What both sessions share: the address, the credentials, the timeouts and the retry rules."""

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

    def _retrier(self, call: Call[Any]) -> Retrier:
        return Retrier(self.retry, self.rng, call.method, self.base_url + call.path, self.on_retry)

    def _request(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any], timeout: float | None
    ) -> httpx.Request:
        """`call` as a request; a stream waits up to its whole `timeout` for each read (a queued
        ticket sends nothing until its first token)."""
        limit = self.timeout if timeout is None else httpx.Timeout(timeout, connect=self.timeout.connect)
        return http.build_request(
            call.method, self.base_url + call.path, json=call.json, headers=call.headers, timeout=limit
        )


class HttpSession(_SessionBase):
    """Calls sent over one pooled httpx.Client, sleeping between tries with `sleep`."""

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _events(self, call: Call[None], timeout: float) -> Iterator[tuple[str | None, ServerEvent]]:
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

    def _run(self, call: Call[T]) -> T:
        response = self._send(call)
        return call.parse(response.json())

    def _send(self, call: Call[Any], stream_timeout: float | None = None) -> httpx.Response:
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


class AsyncHttpSession(_SessionBase):
    """The same as HttpSession, as coroutines over one httpx.AsyncClient, sleeping with asyncio."""

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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _events(
        self, call: Call[None], timeout: float
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

    async def _run(self, call: Call[T]) -> T:
        response = await self._send(call)
        return call.parse(response.json())

    async def _send(self, call: Call[Any], stream_timeout: float | None = None) -> httpx.Response:
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
