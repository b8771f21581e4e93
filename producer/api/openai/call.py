"""An OpenAI-style request body as a ticket: which fields map where, and which are refused.

Sampling fields vLLM understands travel to it untouched (`sampling`); fields that would change the
answer's shape in ways the queue does not carry (several choices, logprobs, tools) answer 400 naming
the field, in OpenAI's error format, as does everything else this module cannot use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from producer.api.auth import Principal
from producer.api.errors import ApiError, api_error
from shared.policy import Policy


class Endpoint(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"

    @property
    def prompt_field(self) -> str:
        return "messages" if self is Endpoint.CHAT else "prompt"


PASSED_THROUGH = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "length_penalty",
        "logit_bias",
        "response_format",
        "stop_token_ids",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
    }
)
"""Sampling fields vLLM accepts that leave the answer one text: sent to vLLM as given."""
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "stream_options", "n"})
"""Accepted and not forwarded (n and stream_options are checked on their own)."""
OWN = frozenset({"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream", "tidegate"})
TIDEGATE_FIELDS = ("type", "urgent_level", "vip_level", "is_bulk", "deadline_ms")
HEADERS = {
    "type": "x-tidegate-type",
    "urgent_level": "x-tidegate-urgent-level",
    "vip_level": "x-tidegate-vip-level",
    "is_bulk": "x-tidegate-bulk",
    "deadline_ms": "x-tidegate-deadline-ms",
}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class Call:
    """What a request asks for: the ticket's fields, and how to answer."""

    endpoint: Endpoint
    model: str
    stream: bool
    include_usage: bool
    ticket: dict[str, Any]

    @property
    def ticket_type(self) -> str:
        return str(self.ticket["type"])


def bad_request(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return api_error(400, message, code=code, param=param)


def parse_call(
    body: Any, headers: Mapping[str, str], principal: Principal, policy: Policy, endpoint: Endpoint
) -> Call:
    """The call `body` asks for, or ApiError 400 naming the first field that cannot be used."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", None, "invalid_body")
    unknown = sorted(set(body) - PASSED_THROUGH - IGNORED - OWN)
    if unknown:
        raise bad_request(
            f"field {unknown[0]!r} is not supported here (the queue answers with one plain text); remove it",
            unknown[0],
            "unsupported_parameter",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(
            "'model' is required: a model id from GET /v1/models", "model", "missing_required_parameter"
        )
    if body.get("n", 1) != 1:
        raise bad_request(f"n = {body.get('n')!r} is not supported: only one choice (n = 1)", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request(f"'stream' must be true or false, got {stream!r}", "stream")
    ticket = _ticket_type_fields(body.get("tidegate"), headers, principal, policy)
    ticket[endpoint.prompt_field] = _prompt(body, endpoint)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        ticket["max_tokens"] = max_tokens
    sampling = {name: value for name, value in body.items() if name in PASSED_THROUGH}
    if sampling:
        ticket["sampling"] = sampling
    ticket["live"] = "tokens" if stream else "end"
    return Call(endpoint, model, stream, _include_usage(body.get("stream_options"), stream), ticket)


def _include_usage(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise bad_request(
            "'stream_options' must be an object like {\"include_usage\": true}", "stream_options"
        )
    if not stream:
        raise bad_request("'stream_options' is only allowed with \"stream\": true", "stream_options")
    return bool(options.get("include_usage", False))


def _prompt(body: dict[str, Any], endpoint: Endpoint) -> Any:
    if endpoint is Endpoint.COMPLETION:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise bad_request(
                "'prompt' is required: one string (lists of prompts and token ids are not supported)",
                "prompt",
                "missing_required_parameter" if prompt is None else "invalid_value",
            )
        return prompt
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request(
            "'messages' is required: a non-empty list of {role, content}",
            "messages",
            "missing_required_parameter" if messages is None else "invalid_value",
        )
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(message: Any, index: int) -> dict[str, str]:
    where = f"messages.{index}"
    if not isinstance(message, dict):
        raise bad_request(f"{where} must be an object with 'role' and 'content'", where)
    role = ROLES.get(str(message.get("role")))
    if role is None:
        raise bad_request(
            f"{where}.role {message.get('role')!r} is not supported; use one of: {', '.join(ROLES)}",
            f"{where}.role",
        )
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            raise bad_request(f"{where}.content: only text parts are supported", f"{where}.content")
        content = "".join(str(t) for t in texts)
    if not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string", f"{where}.content")
    return {"role": role, "content": content}


def _ticket_type_fields(
    given: Any, headers: Mapping[str, str], principal: Principal, policy: Policy
) -> dict[str, Any]:
    """Type and factors: the body's `tidegate` object, else the X-Tidegate-* headers, else the key's type."""
    if given is not None and not isinstance(given, dict):
        raise bad_request('\'tidegate\' must be an object like {"type": "complaint"}', "tidegate")
    body = given or {}
    unknown = sorted(set(body) - set(TIDEGATE_FIELDS))
    if unknown:
        raise bad_request(
            f"tidegate.{unknown[0]} is not a tidegate field; known: {', '.join(TIDEGATE_FIELDS)}",
            f"tidegate.{unknown[0]}",
        )
    fields: dict[str, Any] = {}
    for name in TIDEGATE_FIELDS:
        if name in body:
            fields[name] = body[name]
        elif HEADERS[name] in headers:
            fields[name] = _header_value(name, headers[HEADERS[name]])
    if "deadline_ms" in body and HEADERS["deadline_ms"] in headers:  # both deadlines: the smaller wins
        header = _header_value("deadline_ms", headers[HEADERS["deadline_ms"]])
        if isinstance(body["deadline_ms"], int) and not isinstance(body["deadline_ms"], bool):
            fields["deadline_ms"] = min(body["deadline_ms"], header)
    fields.setdefault("type", principal.default_type)
    if fields["type"] is None:
        raise bad_request(
            "no ticket type: send the header X-Tidegate-Type, the body field tidegate.type, or use a key "
            f"created with --default-type; known types: {', '.join(policy.type_names)}",
            "tidegate.type",
            "missing_ticket_type",
        )
    return fields


def _header_value(name: str, raw: str) -> Any:
    value = raw.strip()
    if name == "type":
        return value
    if name == "is_bulk":
        lowered = value.lower()
        if lowered in ("1", "true", "yes"):
            return True
        if lowered in ("0", "false", "no"):
            return False
        raise bad_request(f"header {HEADERS[name]} must be true or false, got {raw!r}", HEADERS[name])
    if name == "deadline_ms":
        if not value.isdigit() or int(value) < 1:
            raise bad_request(
                f"header {HEADERS[name]} must be a whole number of milliseconds, at least 1, got {raw!r}",
                HEADERS[name],
            )
        return int(value)
    if not value.isdigit():
        raise bad_request(f"header {HEADERS[name]} must be a whole number 0-5, got {raw!r}", HEADERS[name])
    return int(value)
