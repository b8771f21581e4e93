"""OpenAI's wire objects: completions, chat completions, their stream chunks and SSE framing.

Shaped like vLLM's own answers (ops/lab/vllm_cpu/observed-http.md), so a branch system sees the same
objects through tidegate as it would talking to vLLM directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from producer.api.openai.call import Endpoint
from shared import clock

SHED_FINISH_REASON = "load_shedding_fallback"
DONE_EVENT = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True)
class Shape:
    """The id, clock and model every object of one answer carries."""

    endpoint: Endpoint
    ticket_id: str
    model: str
    created: int

    @classmethod
    def of(cls, endpoint: Endpoint, ticket_id: str, model: str) -> Shape:
        return cls(endpoint, ticket_id, model, int(clock.now()))

    @property
    def id(self) -> str:
        prefix = "chatcmpl-" if self.endpoint is Endpoint.CHAT else "cmpl-"
        return prefix + self.ticket_id

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.endpoint is Endpoint.CHAT:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def completion(self, text: str, finish_reason: str | None, usage: Usage) -> dict[str, Any]:
        """A whole answer (no stream)."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.endpoint is Endpoint.CHAT:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": usage.as_dict()}

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        *,
        first: bool = False,
        usage_field: bool = False,
    ) -> dict[str, Any]:
        """One stream chunk; `usage_field` adds `"usage": null` as OpenAI does with include_usage."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.endpoint is Endpoint.CHAT:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        out = {**self._head(True), "choices": [choice]}
        if usage_field:
            out["usage"] = None
        return out

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last chunk of a stream with include_usage: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage.as_dict()}
