"""One branch request through the OpenAI front door, streamed, as a branch system using the `openai`
package would send it: `POST /v1/completions` with `stream=True` and `include_usage`, the branch key
as the API key and the ticket type and factors in `extra_body`.

The answer is read from the raw streaming response so the headers (the ticket id, the shed code,
Retry-After) are seen before the body; the time to first token is the branch's own clock, from the
send to the first chunk carrying text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import openai
from tidegate_client import parse_retry_after

from ops.lab.traffic.workload import PlannedArrival

TICKET_HEADER = "X-Tidegate-Ticket-Id"
SHED_HEADER = "X-Tidegate-Shed"
CONNECT_TIMEOUT_S = 5.0

Verdict = Literal["answered", "shed", "error"]


@dataclass(frozen=True)
class StreamAnswer:
    """What one streamed call came to, as the branch saw it."""

    verdict: Verdict
    """`answered`: admitted and streamed (maybe ending in an error event); `shed`: a 429 or a degraded
    200; `error`: no usable answer."""
    ticket_id: str | None
    sent_at: float
    ttft_s: float | None = None
    latency_s: float | None = None
    retry_after: float | None = None
    error: str | None = None
    degraded: bool = False
    """The shed answer was the type's degraded 200, not a 429."""


def branch_client(base_url: str, read_timeout_s: float) -> openai.OpenAI:
    """One client for all the player's threads (its connection pool is thread-safe and larger than
    the thread pool, which is what bounds the open streams).

    No SDK retries: the player's own retry policy decides, as it does for the tickets client.
    """
    return openai.OpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key="unused",  # every call names its branch's key in its own Authorization header
        max_retries=0,
        timeout=openai.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S),
    )


def tidegate_fields(arrival: PlannedArrival) -> dict[str, Any]:
    """The `tidegate` body object: the ticket type and its factors."""
    body = arrival.body()
    return {k: body[k] for k in ("type", "urgent_level", "vip_level", "is_bulk") if k in body}


def stream_completion(
    client: openai.OpenAI,
    model: str,
    arrival: PlannedArrival,
    key: str,
    admitted: Callable[[str], None],
) -> StreamAnswer:
    """Send `arrival` once and read its stream to the end; `admitted(ticket_id)` once it is queued."""
    body = arrival.body()
    sent_at = time.time()
    started = time.monotonic()
    ticket_id: str | None = None
    try:
        with client.completions.with_streaming_response.create(
            model=model,
            prompt=body["prompt"],
            max_tokens=body["max_tokens"],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"tidegate": tidegate_fields(arrival)},
            extra_headers={"Authorization": f"Bearer {key}"},
        ) as response:
            ticket_id = response.headers.get(TICKET_HEADER)
            if response.headers.get(SHED_HEADER):  # the degraded 200: shed all the same
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                return StreamAnswer("shed", ticket_id, sent_at, retry_after=retry_after, degraded=True)
            if ticket_id:
                admitted(ticket_id)
            ttft_s = _read_stream(response.parse(), started)
            return StreamAnswer(
                "answered", ticket_id, sent_at, ttft_s=ttft_s, latency_s=time.monotonic() - started
            )
    except openai.RateLimitError as exc:
        headers = exc.response.headers
        retry_after = parse_retry_after(headers.get("Retry-After"))
        return StreamAnswer("shed", headers.get(TICKET_HEADER), sent_at, retry_after=retry_after)
    except openai.APIStatusError as exc:
        error = f"HTTP {exc.status_code}: {exc.message[:300]}"
        return StreamAnswer("error", exc.response.headers.get(TICKET_HEADER), sent_at, error=error)
    except openai.APIError as exc:  # an error event inside an admitted stream, or a dropped connection
        verdict: Verdict = "answered" if ticket_id else "error"
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return StreamAnswer(verdict, ticket_id, sent_at, error=f"{type(exc).__name__}: {exc}{cause}")


def _read_stream(stream: openai.Stream[Any], started: float) -> float | None:
    """Seconds from the send to the first chunk with text (None if no text came)."""
    ttft_s: float | None = None
    for chunk in stream:
        if ttft_s is None and any(choice.text for choice in chunk.choices):
            ttft_s = time.monotonic() - started
    return ttft_s
