"""Ticket models: what a branch submits (`TicketRequest`) and what tidegate stores (`Ticket`)."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from functools import cache
from typing import Any, ClassVar, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared.callback_targets import RefusedTarget, check_url
from shared.policy import Policy, UnknownTicketType
from shared.tokens import estimate_tokens

LiveMode = Literal["tokens", "end"]
"""What the worker publishes to the ticket's live stream: every token and the end, or only the end."""


class TicketStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def terminal(self) -> bool:
        return self not in (TicketStatus.QUEUED, TicketStatus.RUNNING)


TERMINAL_STATUSES = tuple(s for s in TicketStatus if s.terminal)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1, max_length=200_000)


class TicketRequest(BaseModel):
    """A submission. Validate with `context={"policy": policy}` to check the type and context limit."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    type: str = Field(min_length=1, max_length=64)
    branch_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    prompt: str | None = Field(default=None, max_length=400_000)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=32_768)
    urgent_level: int = Field(default=0, ge=0, le=5)
    vip_level: int = Field(default=0, ge=0, le=5)
    is_bulk: bool = False
    ttl_seconds: float | None = Field(default=None, gt=0, le=7 * 86_400)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=128)
    callback_url: AnyHttpUrl | None = None
    live: LiveMode | None = None
    sampling: dict[str, Any] | None = Field(default=None, max_length=64)
    deadline_ms: int | None = Field(
        default=None,
        ge=1,
        le=7 * 86_400_000,
        description="the caller's deadline, in milliseconds from now; the type's SLO applies when sooner",
    )

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str, info: ValidationInfo) -> str:
        policy = _policy_from(info)
        problem = unknown_type_problem(value, policy) if policy is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("callback_url")
    @classmethod
    def _callback_target_allowed(cls, value: AnyHttpUrl | None, info: ValidationInfo) -> AnyHttpUrl | None:
        policy = _policy_from(info)
        problem = callback_target_problem(str(value), policy) if value and policy else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("prompt must not be empty")
        return value

    @model_validator(mode="after")
    def _prompt_or_messages(self, info: ValidationInfo) -> TicketRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' (text completion) or 'messages' (chat)")
        policy = _policy_from(info)
        problem = context_limit_problem(self, policy) if policy is not None else None
        if problem:
            raise ValueError(problem)
        return self

    @property
    def prompt_chars(self) -> int:
        """Characters of the prompt (or every message), kept on a record that drops the text."""
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.content) for m in self.messages or [])

    @property
    def prompt_digest(self) -> str:
        """A short SHA-256 of the prompt, so a record without the text still identifies it."""
        if self.prompt is not None:
            text = self.prompt
        else:
            text = json.dumps([m.model_dump() for m in self.messages or []], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def prompt_tokens_estimate(self) -> int:
        if self.prompt is not None:
            return estimate_tokens(self.prompt)
        return sum(estimate_tokens(m.content) + 4 for m in self.messages or [])


def unknown_type_problem(ticket_type: str, policy: Policy) -> str | None:
    """Why the policy does not know `ticket_type`, or None."""
    if ticket_type in policy.types:
        return None
    return str(UnknownTicketType(ticket_type, policy.type_names))


def context_limit_problem(request: TicketRequest, policy: Policy) -> str | None:
    """Why prompt plus answer cannot fit the model's context, or None."""
    limit = policy.queue.context_limit_tokens
    max_tokens = request.max_tokens or policy.queue.default_max_tokens
    if request.prompt_tokens_estimate + max_tokens <= limit:
        return None
    return (
        f"prompt of about {request.prompt_tokens_estimate} tokens plus max_tokens {max_tokens} "
        f"exceeds the context limit of {limit} tokens"
    )


def callback_target_problem(url: str, policy: Policy) -> str | None:
    """Why tidegate will not call `url` back (a target inside the bank), or None."""
    try:
        check_url(url, policy.callbacks.allow_hosts)
    except RefusedTarget as exc:
        return f"callback_url {exc}"
    return None


def policy_problems(request: TicketRequest, policy: Policy) -> list[tuple[str, str]]:
    """(field, message) for each policy rule a request parsed without the policy breaks.

    The validators above apply the same rules when the policy is in the validation context; this
    checks a request that was parsed once already (the HTTP body, a request built in Python).
    """
    problems = []
    if (problem := unknown_type_problem(request.type, policy)) is not None:
        problems.append(("type", problem))
    elif (problem := context_limit_problem(request, policy)) is not None:
        problems.append(("body", problem))
    if request.callback_url and (problem := callback_target_problem(str(request.callback_url), policy)):
        problems.append(("callback_url", problem))
    return problems


def _policy_from(info: ValidationInfo) -> Policy | None:
    context = info.context
    if isinstance(context, dict):
        policy = context.get("policy")
        if isinstance(policy, Policy):
            return policy
    return None


class Ticket(BaseModel):
    """A ticket as stored: the request, its priority and its lifecycle."""

    id: str
    type: str
    branch_id: str
    status: TicketStatus
    priority: float
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int
    urgent_level: int = 0
    vip_level: int = 0
    is_bulk: bool = False
    ttl_seconds: float
    idempotency_key: str | None = None
    callback_url: str | None = None
    live: LiveMode | None = None
    sampling: dict[str, Any] | None = None
    prompt_tokens_estimate: int = 0
    prompt_chars: int | None = None
    prompt_digest: str | None = None
    created_at: float
    expires_at: float
    first_seen_at: float | None = None
    """When the request was first submitted (the first try under its idempotency key)."""
    deadline: float | None = None
    """When the answer is due: the type's SLO from `first_seen_at`, or the caller's sooner deadline."""
    started_at: float | None = None
    finished_at: float | None = None
    first_token_at: float | None = None
    attempts: int = 0
    max_attempts: int = 1
    preemptions: int = 0
    """Times a worker put it back, unstarted by its count, to make room for a critical ticket."""
    worker: str | None = None
    route: str | None = None
    result: str | None = None
    error: str | None = None
    shed_code: str | None = None
    retry_after: float | None = None
    usage: dict[str, Any] | None = None
    traceparent: str | None = None
    """The submitting span's W3C trace context (shared/tracing.py), when tracing is on."""

    @property
    def cost_tokens(self) -> int:
        """Tokens this ticket may occupy in the KV cache: prompt plus the answer it may write."""
        return self.prompt_tokens_estimate + self.max_tokens

    @property
    def queue_wait_seconds(self) -> float | None:
        return None if self.started_at is None else self.started_at - self.created_at

    @property
    def total_seconds(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.created_at

    # Redis hash <-> model. Scalars are stored as strings; structured fields as JSON.
    _JSON_FIELDS: ClassVar[tuple[str, ...]] = ("messages", "usage", "sampling")

    def to_redis(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in self.model_dump(mode="json").items():
            if value is None:
                continue
            if name in self._JSON_FIELDS:
                out[name] = json.dumps(value, separators=(",", ":"))
            elif isinstance(value, bool):
                out[name] = "1" if value else "0"
            else:
                out[name] = str(value)
        return out

    @classmethod
    def from_redis(cls, raw: dict[str, str]) -> Ticket:
        names = _stored_names(cls)
        data: dict[str, Any] = {k: v for k, v in raw.items() if v != "" and k in names}
        for name in cls._JSON_FIELDS:
            if name in data:
                data[name] = json.loads(data[name])
        if "is_bulk" in data:
            data["is_bulk"] = data["is_bulk"] == "1"
        return cls.model_validate(data)


@cache
def _stored_names(model: type[BaseModel]) -> frozenset[str]:
    """A model's field names, looked up once: reading every claimed ticket checks each hash field."""
    return frozenset(model.model_fields)
