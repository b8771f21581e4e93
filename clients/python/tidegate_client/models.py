"""Typed results of the tidegate API, as plain frozen dataclasses (no dependency beyond the stdlib).

Each `from_json` ignores fields it does not know, so a newer server that adds fields does not
break an older client.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Literal


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
        """Whether the ticket has ended: it will not change again."""
        return self not in (TicketStatus.QUEUED, TicketStatus.RUNNING)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _status(value: Any) -> TicketStatus | None:
    return None if value is None else TicketStatus(value)


@dataclass(frozen=True)
class ValidationIssue:
    """One bad field of a 422: where (`["body", "vip_level"]`), what is wrong, and its kind."""

    loc: list[str | int]
    msg: str
    type: str


@dataclass(frozen=True)
class ErrorDetail:
    """The `error` object of every error answer (and of a failed batch item)."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None
    ticket_id: str | None = None
    issues: list[ValidationIssue] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorDetail:
        values = _known(cls, data)
        values["issues"] = [ValidationIssue(**_known(ValidationIssue, i)) for i in data.get("issues") or []]
        return cls(**values)


@dataclass(frozen=True)
class TicketAccepted:
    id: str
    status: TicketStatus
    priority: float
    expires_at: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TicketAccepted:
        values = _known(cls, data)
        values["status"] = TicketStatus(data["status"])
        return cls(**values)


@dataclass(frozen=True)
class TicketTimings:
    queue_wait_seconds: float | None = None
    time_to_first_token_seconds: float | None = None
    total_seconds: float | None = None


@dataclass(frozen=True)
class TicketView:
    """A ticket as its branch reads it (also the body of a callback)."""

    id: str
    type: str
    branch_id: str
    status: TicketStatus
    priority: float
    max_tokens: int
    attempts: int
    created_at: float
    expires_at: float
    route: str | None = None
    result: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    deadline: float | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    timings: TicketTimings = field(default_factory=TicketTimings)

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TicketView:
        values = _known(cls, data)
        values["status"] = TicketStatus(data["status"])
        values["timings"] = TicketTimings(**_known(TicketTimings, data.get("timings") or {}))
        return cls(**values)


@dataclass(frozen=True)
class CancelResult:
    id: str
    status: TicketStatus
    previous_status: TicketStatus
    cancelled: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CancelResult:
        return cls(
            id=data["id"],
            status=TicketStatus(data["status"]),
            previous_status=TicketStatus(data["previous_status"]),
            cancelled=bool(data["cancelled"]),
        )


BatchOutcome = Literal["queued", "existing", "rejected", "invalid", "forbidden"]


@dataclass(frozen=True)
class BatchItemResult:
    index: int
    status_code: int
    outcome: BatchOutcome
    id: str | None = None
    status: TicketStatus | None = None
    priority: float | None = None
    expires_at: float | None = None
    retry_after: int | None = None
    error: ErrorDetail | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchItemResult:
        values = _known(cls, data)
        values["status"] = _status(data.get("status"))
        values["error"] = ErrorDetail.from_json(data["error"]) if data.get("error") else None
        return cls(**values)


@dataclass(frozen=True)
class BatchResult:
    queued: int
    existing: int
    rejected: int
    invalid: int
    results: list[BatchItemResult]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchResult:
        values = _known(cls, data)
        values["results"] = [BatchItemResult.from_json(r) for r in data.get("results", [])]
        return cls(**values)


@dataclass(frozen=True)
class TypeDepth:
    depth: int
    oldest_wait_seconds: float
    cap: int


@dataclass(frozen=True)
class QueuesView:
    """Depth per type, alarm level and mode; `workers` as the API sent it."""

    queue: str
    level: str
    mode: str
    depth: int
    inflight: int
    types: dict[str, TypeDepth]
    workers: dict[str, Any]
    level_since: float | None = None
    drain_rate: float | None = None
    breakers: list[dict[str, Any]] = field(default_factory=list)
    """Each inference endpoint's circuit breaker as the API sent it (level, state, error rates)."""
    rollout: dict[str, Any] | None = None
    """The model rollout as the API sent it (wave, state; the arms' figures for operator keys)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueuesView:
        values = _known(cls, data)
        values["types"] = {k: TypeDepth(**_known(TypeDepth, v)) for k, v in data.get("types", {}).items()}
        return cls(**values)


@dataclass(frozen=True)
class TicketToken:
    """The next piece of a ticket's answer (`stream`)."""

    text: str


@dataclass(frozen=True)
class TicketRetry:
    """The attempt failed and the ticket went back to the queue: the answer starts over."""

    error: str


@dataclass(frozen=True)
class TicketEnd:
    """How the streamed ticket ended; the last event of `stream`."""

    status: TicketStatus
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TicketEnd:
        values = _known(cls, data)
        values["status"] = TicketStatus(data["status"])
        values["error"] = data.get("error") or ""
        return cls(**values)


TicketEvent = TicketToken | TicketRetry | TicketEnd


def ticket_event(name: str, data: dict[str, Any]) -> TicketEvent | None:
    """One event of GET /v1/tickets/{id}/stream; None for a kind this client does not know."""
    if name == "token":
        return TicketToken(str(data.get("text", "")))
    if name == "retry":
        return TicketRetry(str(data.get("error", "")))
    if name == "end":
        return TicketEnd.from_json(data)
    return None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class ChunkChoice:
    """One choice of a stream chunk: `text` is a chat delta's content or a completion's text."""

    index: int
    text: str | None = None
    role: str | None = None
    finish_reason: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkChoice:
        delta = data.get("delta")
        if isinstance(delta, dict):
            return cls(
                data.get("index", 0), delta.get("content"), delta.get("role"), data.get("finish_reason")
            )
        return cls(data.get("index", 0), data.get("text"), None, data.get("finish_reason"))


@dataclass(frozen=True)
class CompletionChunk:
    """One OpenAI stream chunk of /v1/chat/completions or /v1/completions, with its ticket's id."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]
    ticket_id: str | None = None
    usage: Usage | None = None

    @property
    def text(self) -> str:
        """The text this chunk adds (its choices' texts joined)."""
        return "".join(c.text or "" for c in self.choices)

    @property
    def finish_reason(self) -> str | None:
        return next((c.finish_reason for c in self.choices if c.finish_reason), None)

    @classmethod
    def from_json(cls, data: dict[str, Any], ticket_id: str | None) -> CompletionChunk:
        values = _known(cls, data)
        values["choices"] = [ChunkChoice.from_json(c) for c in data.get("choices") or []]
        usage = data.get("usage")
        values["usage"] = Usage(**_known(Usage, usage)) if isinstance(usage, dict) else None
        values["ticket_id"] = ticket_id
        return cls(**values)
