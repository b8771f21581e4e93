"""One submission of a branch's request to `/v1/completions`, and what it came to, read cheaply.

A whole answer is one JSON body. A streamed answer (`stream: true`, `include_usage`) is read line by
line: only `data:` lines are looked at, each decoded only while it can still change what is recorded
(every line until the first text, then only the usage chunk and error events), so a chunk costs the
harness a few string tests, not an object. Nothing here decides about retries: `Submission.verdict`
says what the answer was and the player applies its branches' rules to it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

TICKET_HEADER = "X-Tidegate-Ticket-Id"
SHED_HEADER = "X-Tidegate-Shed"
"""tidegate's shed code; on a 200 it marks the degraded answer, the policy's friendly text, shed all the
same."""
SHED_PREFIX = "scheduler_"
"""A 503 whose error code starts so is a gateway's queue timeout (SMG), not a dead engine."""
DROPPED = "dropped"
"""The code of a submission whose connection closed before any text came (SMG's preemption does this)."""
STREAM_FIELDS: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
DONE_LINE = "[DONE]"

Verdict = Literal["open", "done", "shed", "error", "expired"]
"""`open`: not judged yet; `done`: answered; `shed`: refused (429, a degraded 200, a queue timeout, a
dropped connection before any text); `error`: another error status, or an admitted answer that broke
off (an error event, a cut after text); `expired`: its branch stopped waiting at the type's TTL."""


@dataclass
class Submission:
    """What one send came to; filled in as the answer arrives, so a cancelled read keeps what it saw."""

    sent: float
    """`time.monotonic()` of the send."""
    status: int | None = None
    ticket_id: str | None = None
    admitted: bool = False
    """A 200 that is not a shed answer: the system took the request on (a stream began)."""
    verdict: Verdict = "open"
    code: str = ""
    """Why it was not done, e.g. "429 scheduler_queue_full", "200 red_alarm", "dropped", "stream error 500"."""
    retry_after: float | None = None
    degraded: bool = False
    ttft_s: float | None = None
    """Seconds from the send to the first line carrying text (streamed answers only)."""
    tokens: int | None = None
    """Prompt + completion tokens, from the usage the answer carried."""
    error: str | None = None

    def dropped(self, why: str) -> None:
        """The connection closed or broke: a shed before any text, a broken answer after it."""
        if self.verdict != "open":
            return
        if self.ttft_s is None:
            self.verdict, self.code = "shed", DROPPED
        else:
            self.verdict, self.code = "error", f"{DROPPED} after text"
        self.error = why


async def send_whole(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any], headers: Mapping[str, str], sub: Submission
) -> None:
    """One POST answered with one JSON body."""
    response = await client.post(url, json=body, headers=headers)
    _read_headers(sub, response)
    if sub.verdict != "open":
        return
    if response.status_code != 200:
        _refused(sub, response)
        return
    sub.admitted = True
    try:
        usage = response.json()["usage"]
        sub.tokens = int(usage["prompt_tokens"]) + int(usage["completion_tokens"])
        sub.verdict = "done"
    except (ValueError, KeyError, TypeError):
        sub.verdict, sub.code = "error", "200 unreadable"
        sub.error = f"unreadable completion body: {response.text[:200]}"


async def send_streamed(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any], headers: Mapping[str, str], sub: Submission
) -> None:
    """One streamed POST, read to `[DONE]`; `body` carries `STREAM_FIELDS`."""
    async with client.stream("POST", url, json=body, headers=headers) as response:
        _read_headers(sub, response)
        if sub.verdict != "open" or response.status_code != 200:
            await response.aread()  # small; read so the connection goes back to the pool
            if sub.verdict == "open":
                _refused(sub, response)
            return
        sub.admitted = True
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == DONE_LINE:
                if sub.verdict == "open":
                    sub.verdict = "done"
                return
            if sub.ttft_s is not None and '"prompt_tokens"' not in data and '"error"' not in data:
                continue  # a text chunk after the first: nothing in it changes the record
            _read_chunk(sub, data)
    sub.dropped("the stream ended without [DONE]")


def _read_headers(sub: Submission, response: httpx.Response) -> None:
    sub.status = response.status_code
    sub.ticket_id = response.headers.get(TICKET_HEADER)
    sub.retry_after = _retry_after(response)
    shed = response.headers.get(SHED_HEADER)  # tidegate names the shed code on its 429s too
    if shed:
        sub.verdict, sub.code = "shed", f"{response.status_code} {shed}"
        sub.degraded = response.status_code == 200


def _refused(sub: Submission, response: httpx.Response) -> None:
    """A non-200 answer: shed (429, a gateway's queue timeout) or an error."""
    reason = _error_code(response)
    sub.code = f"{response.status_code} {reason}".strip()
    if response.status_code == 429 or reason.startswith(SHED_PREFIX):
        sub.verdict = "shed"
    else:
        sub.verdict, sub.error = "error", f"HTTP {response.status_code}: {response.text[:200]}"


def _read_chunk(sub: Submission, data: str) -> None:
    try:
        chunk = json.loads(data)
    except ValueError:
        sub.verdict, sub.code, sub.error = "error", "stream unreadable", f"unreadable chunk: {data[:200]}"
        return
    if not isinstance(chunk, dict):
        return
    error = chunk.get("error")
    if error is not None:
        if sub.verdict == "open":
            reason = _reason(error)
            sub.verdict, sub.code = "error", f"stream error {reason}".strip()
            sub.error = str(error.get("message") if isinstance(error, dict) else error)[:300]
        return
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        sub.tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    if sub.ttft_s is None and any(_text(choice) for choice in chunk.get("choices") or ()):
        sub.ttft_s = time.monotonic() - sub.sent


def _text(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    return bool(choice.get("text") or (isinstance(delta, dict) and delta.get("content")))


def _error_code(response: httpx.Response) -> str:
    """The machine-readable reason a system gave (SMG: `scheduler_queue_full`, ...), or ""."""
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        return ""
    reason = _reason(error)
    return "" if reason == str(response.status_code) else reason


def _reason(error: Any) -> str:
    if not isinstance(error, dict):
        return ""
    return str(error.get("code") or error.get("type") or "")


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None
