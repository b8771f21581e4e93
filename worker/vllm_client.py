"""Calls to vLLM's OpenAI-compatible API for one ticket, with `requests`.

Every call streams (SSE) for two reasons: the first chunk gives the time to first token, and a
cancelled or expired ticket's request can be cut off mid-answer by shutting its socket, which vLLM
sees as a disconnect and answers by freeing the request's KV blocks. The ticket id travels as the
request id (body and `X-Request-Id`), so a line in vLLM's log names the ticket.

Errors are classified for the caller: refused connections, timeouts, 5xx and out-of-memory are
transient (the ticket goes back to the queue); 4xx are permanent, carrying vLLM's own message.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from shared import clock, tracing
from shared.models import Ticket
from worker.request_handle import RequestAborted, RequestHandle, shutdown_socket
from worker.vllm_errors import ErrorKind, VllmError, classify_status, error_message, retry_after_seconds

__all__ = ["Completion", "ErrorKind", "RequestAborted", "RequestHandle", "VllmClient", "VllmError"]

log = logging.getLogger(__name__)

PRIORITY_SCALE = 100
"""vLLM's `priority` is an integer; tidegate's is a float with two meaningful decimals."""
PRIORITY_DISABLED_HINT = "priority scheduling is not enabled"


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    ttft_seconds: float | None
    total_seconds: float
    first_token_at: float | None
    model: str

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "ttft_seconds": None if self.ttft_seconds is None else round(self.ttft_seconds, 6),
            "total_seconds": round(self.total_seconds, 6),
            "first_token_at": self.first_token_at,
            "finish_reason": self.finish_reason,
            "model": self.model,
        }


class VllmClient:
    """One vLLM endpoint: a pooled session, the served model name, and `run` for a ticket."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        pool_size: int = 32,
        connect_timeout: float = 3.0,
        send_priority: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.connect_timeout = connect_timeout
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(pool_size, 1), max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self._model = model
        self._send_priority = send_priority
        self._lock = threading.Lock()

    def close(self) -> None:
        self.session.close()

    @property
    def model(self) -> str | None:
        return self._model

    def discover_model(self, timeout: float = 5.0) -> str:
        """The served model's name from `/v1/models` (the first one), remembered for later calls."""
        if self._model:
            return self._model
        served = self.served_model(timeout)
        with self._lock:
            self._model = served
        return served

    def served_model(self, timeout: float = 5.0) -> str:
        """Ask `/v1/models` now: the breaker pairs fallbacks by the version it names."""
        url = self.base_url + "/v1/models"
        try:
            response = self.session.get(url, timeout=(self.connect_timeout, timeout))
        except requests.RequestException as exc:
            raise VllmError(ErrorKind.CONNECT, f"cannot reach {url}: {exc}") from exc
        if response.status_code != 200:
            raise classify_status(response.status_code, f"{url} answered {response.status_code}", None)
        data = response.json().get("data") or []
        if not data:
            raise VllmError(ErrorKind.PROTOCOL, f"{url} lists no served model")
        return str(data[0]["id"])

    def build_request(self, ticket: Ticket, max_tokens: int) -> tuple[str, dict[str, Any]]:
        """The endpoint path and body for `ticket`: chat when it has messages, completion otherwise.

        Sampling fields the caller passed through (temperature, stop, ...) go first, so tidegate's
        own fields (model, max_tokens, stream, priority, request id) always win.
        """
        body: dict[str, Any] = {
            **(ticket.sampling or {}),
            "model": self._model or self.discover_model(),
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "request_id": ticket.id,
        }
        if self._send_priority:
            body["priority"] = round(ticket.priority * PRIORITY_SCALE)
        if ticket.messages is not None:
            body["messages"] = [m.model_dump() for m in ticket.messages]
            return "/v1/chat/completions", body
        body["prompt"] = ticket.prompt or ""
        return "/v1/completions", body

    def run(
        self,
        ticket: Ticket,
        *,
        max_tokens: int,
        handle: RequestHandle,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        """Run `ticket` to completion; raises VllmError or RequestAborted.

        The read timeout is the ticket's remaining TTL: vLLM silent past it means the answer would
        arrive too late to matter. `on_text` gets each piece of the answer as it arrives.
        """
        try:
            return self._run_once(ticket, max_tokens, handle, on_text)
        except VllmError as exc:
            if (
                exc.kind is ErrorKind.CLIENT
                and PRIORITY_DISABLED_HINT in exc.message.lower()
                and self._send_priority
            ):
                log.warning(
                    "vLLM at %s runs without priority scheduling; sending no priorities", self.base_url
                )
                self._send_priority = False
                return self._run_once(ticket, max_tokens, handle, on_text)
            raise

    def _run_once(
        self,
        ticket: Ticket,
        max_tokens: int,
        handle: RequestHandle,
        on_text: Callable[[str], None] | None,
    ) -> Completion:
        handle.check()
        path, body = self.build_request(ticket, max_tokens)
        remaining = ticket.expires_at - clock.now()
        if remaining <= 0:
            raise VllmError(ErrorKind.TIMEOUT, f"ticket {ticket.id} expired before its request was sent")
        started = time.monotonic()
        headers = {"X-Request-Id": ticket.id, "Accept": "text/event-stream"}
        tracing.inject(headers)  # vLLM started with --otlp-traces-endpoint continues the trace
        try:
            response = self.session.post(
                self.base_url + path,
                json=body,
                headers=headers,
                stream=True,
                timeout=(min(self.connect_timeout, remaining), remaining),
            )
        except requests.ConnectionError as exc:
            handle.check()
            if isinstance(exc, requests.ConnectTimeout):
                raise VllmError(ErrorKind.TIMEOUT, f"connecting to {self.base_url} timed out") from exc
            raise VllmError(ErrorKind.CONNECT, f"cannot reach vLLM at {self.base_url}: {exc}") from exc
        except requests.Timeout as exc:
            handle.check()
            raise VllmError(ErrorKind.TIMEOUT, f"vLLM sent no answer within {remaining:.1f} s") from exc
        handle.attach(shutdown_socket(response))
        try:
            if response.status_code != 200:
                try:
                    payload: Any = response.json()
                except ValueError:
                    payload = None
                message = error_message(payload, f"HTTP {response.status_code}: {response.text[:200]}")
                raise classify_status(response.status_code, message, retry_after_seconds(response))
            return self._read_stream(ticket, response, handle, started, on_text)
        finally:
            handle.detach()
            response.close()

    def _read_stream(
        self,
        ticket: Ticket,
        response: requests.Response,
        handle: RequestHandle,
        started: float,
        on_text: Callable[[str], None] | None,
    ) -> Completion:
        pieces: list[str] = []
        chunks = 0
        ttft: float | None = None
        first_token_at: float | None = None
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        model = self._model or ""
        done = False
        try:
            for event in _sse_events(response):
                if event == "[DONE]":
                    done = True
                    break
                data = json.loads(event)
                if "error" in data or data.get("object") == "error":
                    message = error_message(data, "vLLM reported an error mid-stream")
                    error = data.get("error")
                    code = error.get("code") if isinstance(error, dict) else data.get("code")
                    raise classify_status(int(code) if isinstance(code, int) else 500, message, None)
                model = str(data.get("model") or model)
                if data.get("usage"):
                    usage = data["usage"]
                for choice in data.get("choices") or []:
                    text = choice.get("text")
                    if text is None:
                        text = (choice.get("delta") or {}).get("content")
                    if text:
                        if ttft is None:
                            ttft = time.monotonic() - started
                            first_token_at = clock.now()
                            handle.first_token_at = first_token_at
                        pieces.append(text)
                        chunks += 1
                        if on_text is not None:
                            on_text(text)
                    if choice.get("finish_reason"):
                        finish_reason = str(choice["finish_reason"])
        except Exception as exc:
            # An abort shuts the socket from another thread; http.client may then fail in any way
            # (even AttributeError on its closed file), so a set abort reason wins over the error.
            handle.check()
            if not isinstance(exc, requests.RequestException | OSError | ValueError):
                raise
            if isinstance(exc, requests.Timeout | TimeoutError):
                raise VllmError(ErrorKind.TIMEOUT, f"vLLM stalled mid-answer for ticket {ticket.id}") from exc
            raise VllmError(ErrorKind.PROTOCOL, f"stream for ticket {ticket.id} broke: {exc}") from exc
        handle.check()
        if not done:
            raise VllmError(ErrorKind.PROTOCOL, f"stream for ticket {ticket.id} ended without [DONE]")
        prompt_tokens = int(usage["prompt_tokens"]) if usage else ticket.prompt_tokens_estimate
        completion_tokens = int(usage["completion_tokens"]) if usage else chunks
        return Completion(
            text="".join(pieces),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish_reason,
            ttft_seconds=ttft,
            total_seconds=time.monotonic() - started,
            first_token_at=first_token_at,
            model=model,
        )


def _sse_events(response: requests.Response) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, one per event."""
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data:"):
            yield line[5:].strip()
