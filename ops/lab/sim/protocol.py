"""The OpenAI-compatible request and response shapes vLLM serves, reduced to what the engine needs.

Parsing turns a request body into a `Job` (token counts, limits, ids) or raises the 400 vLLM would;
the builders produce bodies and stream chunks with the fields vLLM 0.32 sends, as recorded in
ops/lab/vllm_cpu/observed-http.md. Fields that only carry logprobs, token ids or tools are present and null.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ops.lab.sim.config import SimConfig
from ops.lab.sim.errors import ApiError, invalid, schema_error
from ops.lab.sim.tokens import (
    count_chat_tokens,
    count_text_tokens,
    filler_text,
    natural_stop_length,
    prompt_fingerprint,
)

Kind = Literal["completion", "chat"]
B = TypeVar("B", bound=BaseModel)


class _Body(BaseModel):
    """Fields both endpoints share; unknown sampling fields are accepted and ignored, as vLLM does."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    priority: int = 0
    request_id: str | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    seed: int | None = None
    temperature: float | None = None
    n: int = 1


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    max_tokens: int | None = 16


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


@dataclass(frozen=True)
class Job:
    """One validated request, ready for an engine."""

    kind: Kind
    request_id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    target_tokens: int
    priority: int
    stream: bool
    include_usage: bool
    text_offset: int
    fingerprint: str

    @property
    def response_id(self) -> str:
        return f"{'cmpl' if self.kind == 'completion' else 'chatcmpl'}-{self.request_id}"


def parse_completion(payload: object, config: SimConfig, header_request_id: str | None) -> Job:
    body = _validate(CompletionBody, payload)
    prompt_tokens, fingerprint = _completion_prompt(body, config)
    return _job("completion", body, body.max_tokens, prompt_tokens, fingerprint, config, header_request_id)


def parse_chat(payload: object, config: SimConfig, header_request_id: str | None) -> Job:
    body = _validate(ChatBody, payload)
    if not body.messages:
        raise invalid("Cannot apply chat template to an empty conversation. Provide at least one message.")
    contents = [_message_text(message) for message in body.messages]
    prompt_tokens = count_chat_tokens(contents)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if max_tokens is None:
        max_tokens = max(1, config.max_model_len - prompt_tokens)
    fingerprint = prompt_fingerprint(contents, body.seed)
    return _job("chat", body, max_tokens, prompt_tokens, fingerprint, config, header_request_id)


def _validate(model: type[B], payload: object) -> B:
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        raise schema_error(error.errors()) from None


def _completion_prompt(body: CompletionBody, config: SimConfig) -> tuple[int, int]:
    prompt: str | list[int] | None
    if isinstance(body.prompt, list) and body.prompt and not isinstance(body.prompt[0], int):
        if len(body.prompt) != 1:
            raise invalid(
                f"prompt holds {len(body.prompt)} prompts; the simulator serves one prompt per request",
                "prompt",
            )
        prompt = body.prompt[0]
    else:
        prompt = body.prompt  # type: ignore[assignment]  # the union's remaining members
    if prompt is None or len(prompt) == 0:
        raise invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(prompt, str):
        return count_text_tokens(prompt), prompt_fingerprint(prompt, body.seed)
    vocab = config.profile.vocab_size
    outside = [token for token in prompt if not 0 <= token < vocab]
    if outside:
        raise invalid(
            f"Token id {outside[0]} is out of vocabulary (ids run from 0 to {vocab - 1}).", "prompt"
        )
    return len(prompt), prompt_fingerprint(tuple(prompt), body.seed)


def _message_text(message: ChatMessage) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return " ".join(part.text or "" for part in message.content)


def _job(
    kind: Kind,
    body: _Body,
    max_tokens: int | None,
    prompt_tokens: int,
    fingerprint: int,
    config: SimConfig,
    header_request_id: str | None,
) -> Job:
    if body.model is not None and body.model != config.model:
        raise ApiError(
            HTTPStatus.NOT_FOUND,
            f"The model `{body.model}` does not exist. Valid aliases: {config.model}.",
            param="model",
        )
    if body.n != 1:
        raise invalid("n is not supported by the simulator; send n=1.", "n", body.n)
    if body.temperature is not None and body.temperature < 0:
        raise invalid(
            f"temperature must be non-negative, got {body.temperature}.", "temperature", body.temperature
        )
    if max_tokens is None or max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    limit = config.max_model_len
    if max_tokens > limit:
        raise invalid(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            "max_tokens",
            max_tokens,
        )
    if prompt_tokens > limit:
        raise invalid(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains at least "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
            "input_tokens",
            prompt_tokens,
        )
    # vLLM cuts the output to what the context has room for rather than refusing the request; a prompt
    # that fills the context exactly leaves 0, which it then refuses as a max_tokens error.
    max_tokens = min(max_tokens, limit - prompt_tokens)
    if max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if body.ignore_eos:
        target = max_tokens
    else:
        natural = natural_stop_length(
            prompt_fingerprint(config.seed, fingerprint, max_tokens),
            config.stop_median_tokens,
            config.profile.stop_sigma,
        )
        target = min(max_tokens, max(natural, body.min_tokens))
    options = body.stream_options or {}
    return Job(
        kind=kind,
        request_id=header_request_id or body.request_id or uuid.uuid4().hex[:16],
        model=config.model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        target_tokens=target,
        priority=body.priority,
        stream=body.stream,
        include_usage=bool(options.get("include_usage", False)),
        text_offset=fingerprint % 997,
        fingerprint=system_fingerprint(config),
    )


def system_fingerprint(config: SimConfig) -> str:
    """Like vLLM's `vllm-<version>-<hash>`, naming the simulator and its configuration."""
    return f"tidegate-sim-{prompt_fingerprint(config) & 0xFFFFFFFF:08x}"


# -- responses ---------------------------------------------------------------------------------------


def usage(job: Job, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def full_response(job: Job, created: int, completion_tokens: int, finish_reason: str) -> dict[str, Any]:
    text = filler_text(job.text_offset, 0, completion_tokens)
    if job.kind == "completion":
        obj = "text_completion"
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
        tail: dict[str, Any] = {}
    else:
        obj = "chat.completion"
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
        }
        tail = {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
    return {
        "id": job.response_id,
        "object": obj,
        "created": created,
        "model": job.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": job.fingerprint,
        "usage": usage(job, completion_tokens),
        **tail,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def token_events(job: Job, created: int, start: int, stop: int, finish_reason: str | None) -> str:
    """Server-sent events for generated tokens [start, stop), one per token as vLLM streams them.

    All but a finishing chunk differ only in their text, so they are cut from one template instead of
    encoding a dict per token: streaming is the simulator's hottest path.
    """
    head, tail = _token_template(job, created)
    events = []
    for index in range(start, stop):
        text = filler_text(job.text_offset, index, index + 1)
        if index == stop - 1 and finish_reason is not None:
            events.append(sse(_token_chunk(job, created, text, finish_reason)))
        else:
            events.append(f"data: {head}{json.dumps(text)}{tail}\n\n")
    return "".join(events)


def _token_template(job: Job, created: int) -> tuple[str, str]:
    marker = "\x00"
    encoded = _compact(_token_chunk(job, created, marker, None))
    head, tail = encoded.split(json.dumps(marker), 1)
    return head, tail


def _token_chunk(job: Job, created: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0}
    if job.kind == "completion":
        choice |= {"text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        choice |= {"prompt_token_ids": None, "token_ids": None}
    else:
        choice |= {"delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
        choice |= {"token_ids": None} if finish_reason is None else {"stop_reason": None, "token_ids": None}
    chunk = _chunk(job, created, [choice])
    if finish_reason is not None:
        chunk["system_fingerprint"] = job.fingerprint
    return chunk


def sse(payload: dict[str, Any]) -> str:
    return f"data: {_compact(payload)}\n\n"


def _compact(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"))


def role_chunk(job: Job, created: int) -> dict[str, Any]:
    """The first chat chunk, which announces the assistant role before any content."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    return _chunk(job, created, [choice]) | {"prompt_token_ids": None, "prompt_text": None}


def usage_chunk(job: Job, created: int, completion_tokens: int) -> dict[str, Any]:
    """The closing chunk `stream_options.include_usage` asks for: no choices, only usage."""
    counts = {
        "prompt_tokens": job.prompt_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    return _chunk(job, created, []) | {"usage": counts, "system_fingerprint": job.fingerprint}


def _chunk(job: Job, created: int, choices: list[dict[str, Any]]) -> dict[str, Any]:
    obj = "text_completion" if job.kind == "completion" else "chat.completion.chunk"
    return {"id": job.response_id, "object": obj, "created": created, "model": job.model, "choices": choices}


def models_response(config: SimConfig, created: int) -> dict[str, Any]:
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": config.model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": config.model,
        "parent": None,
        "max_model_len": config.max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
