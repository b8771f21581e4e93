"""The JSON documents of the HTTP API, shared by the server, the Python client and callbacks.

Only pydantic here (no FastAPI), so the client and the callback job import it cheaply. The request
body reuses `TicketRequest`'s fields and validators, so the HTTP schema shows the same types and
limits as the Python producer; only `branch_id` becomes optional, because the API key names it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, WithJsonSchema

from shared.control import Mode
from shared.models import Ticket, TicketRequest, TicketStatus

MAX_BATCH = 500
TICKET_ID_PATTERN = r"^[0-9A-Za-z]{1,64}$"
BRANCH_ID_PATTERN = r"^[A-Za-z0-9_-]{1,32}$"

AlarmLabel = Literal["green", "yellow", "orange", "red"]

# The documented form of a callback URL. Validation is pydantic's AnyHttpUrl, which accepts more;
# this pattern describes the plain http(s) URLs a branch uses (host names without "--" runs, which
# would be IDNA labels, optional port, path and query), so every URL it admits is accepted.
_LABEL = r"[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*"
_CALLBACK_URL_SCHEMA: dict[str, Any] = {
    "type": "string",
    "maxLength": 2083,
    "pattern": (
        rf"^https?://{_LABEL}(\.{_LABEL})*(:[1-9][0-9]{{0,3}})?(/[A-Za-z0-9._~%/-]*)?(\?[A-Za-z0-9._~%=&-]*)?$"
    ),
    "description": "http(s) URL that receives the ticket's JSON (as GET /v1/tickets/{id}) when it ends",
}

# Exactly one of prompt (text) or messages (chat): written out so generated bodies respect it.
_PROMPT_XOR_MESSAGES: dict[str, Any] = {
    "anyOf": [
        {
            "required": ["prompt"],
            "properties": {"prompt": {"type": "string", "pattern": r"\S"}, "messages": {"type": "null"}},
        },
        {
            "required": ["messages"],
            "properties": {"messages": {"type": "array"}, "prompt": {"type": "null"}},
        },
    ]
}


class TicketBody(TicketRequest):
    """One ticket as a branch POSTs it. The policy checks (known type, context limit) run afterwards."""

    model_config = ConfigDict(json_schema_extra=_PROMPT_XOR_MESSAGES)

    branch_id: str | None = Field(  # type: ignore[assignment]  # optional here: the API key names the branch
        default=None,
        pattern=BRANCH_ID_PATTERN,
        description="optional; when given it must be the API key's branch (else 403)",
    )
    callback_url: Annotated[AnyHttpUrl, WithJsonSchema(_CALLBACK_URL_SCHEMA)] | None = None


class BatchBody(BaseModel):
    """Up to MAX_BATCH tickets. Items are validated one by one so one bad item fails only itself."""

    model_config = ConfigDict(extra="forbid")

    tickets: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        json_schema_extra={"items": {"$ref": "#/components/schemas/TicketBody"}},
    )


class TicketAccepted(BaseModel):
    id: str
    status: TicketStatus
    priority: float = Field(description="effective priority; lower runs first")
    expires_at: float = Field(description="Unix time after which a still-queued ticket expires")

    @classmethod
    def from_ticket(cls, ticket: Ticket) -> TicketAccepted:
        return cls(id=ticket.id, status=ticket.status, priority=ticket.priority, expires_at=ticket.expires_at)


class TicketTimings(BaseModel):
    queue_wait_seconds: float | None = Field(description="created → taken by a worker")
    time_to_first_token_seconds: float | None = Field(description="taken by a worker → first token")
    total_seconds: float | None = Field(description="created → ended")


class TicketView(BaseModel):
    """What a branch may read about its ticket (GET /v1/tickets/{id}, and the callback body)."""

    id: str
    type: str
    branch_id: str
    status: TicketStatus
    priority: float
    max_tokens: int
    attempts: int
    route: str | None
    result: str | None
    error: str | None
    usage: dict[str, Any] | None
    created_at: float
    expires_at: float
    started_at: float | None
    first_token_at: float | None
    finished_at: float | None
    timings: TicketTimings

    @classmethod
    def from_ticket(cls, ticket: Ticket) -> TicketView:
        ttft = None
        if ticket.first_token_at is not None and ticket.started_at is not None:
            ttft = ticket.first_token_at - ticket.started_at
        return cls(
            id=ticket.id,
            type=ticket.type,
            branch_id=ticket.branch_id,
            status=ticket.status,
            priority=ticket.priority,
            max_tokens=ticket.max_tokens,
            attempts=ticket.attempts,
            route=ticket.route,
            result=ticket.result,
            error=ticket.error,
            usage=ticket.usage,
            created_at=ticket.created_at,
            expires_at=ticket.expires_at,
            started_at=ticket.started_at,
            first_token_at=ticket.first_token_at,
            finished_at=ticket.finished_at,
            timings=TicketTimings(
                queue_wait_seconds=ticket.queue_wait_seconds,
                time_to_first_token_seconds=ttft,
                total_seconds=ticket.total_seconds,
            ),
        )

    @property
    def terminal(self) -> bool:
        return self.status.terminal


class CancelResult(BaseModel):
    id: str
    status: TicketStatus = Field(description="the ticket's status after the call")
    previous_status: TicketStatus
    cancelled: bool = Field(description="true when this call cancelled it; false when it had already ended")


class ErrorObject(BaseModel):
    """OpenAI's error shape, so branch systems built on OpenAI clients read it without new code."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None
    ticket_id: str | None = Field(default=None, description="the `rejected` ticket record, for a shed ticket")


class ErrorBody(BaseModel):
    error: ErrorObject


class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    """FastAPI's 422 shape: one entry per bad field."""

    detail: list[ValidationIssue]


class BatchItemResult(BaseModel):
    index: int = Field(description="position of the item in the request")
    status_code: Literal[202, 403, 422, 429] = Field(description="what a single POST would have answered")
    outcome: Literal["queued", "existing", "rejected", "invalid", "forbidden"]
    id: str | None = None
    status: TicketStatus | None = None
    priority: float | None = None
    expires_at: float | None = None
    retry_after: int | None = Field(default=None, description="seconds, for a shed item")
    error: ErrorObject | None = None
    detail: list[ValidationIssue] | None = None


class BatchResult(BaseModel):
    queued: int
    existing: int
    rejected: int
    invalid: int
    results: list[BatchItemResult]


class TypeDepth(BaseModel):
    depth: int
    oldest_wait_seconds: float
    cap: int


class WorkerSummary(BaseModel):
    worker_id: str
    host: str
    gpu: str
    model: str
    inflight: int | None
    batch_limit: int | None
    kv_usage: float | None


class WorkersView(BaseModel):
    alive: int
    desired: int | None = Field(description="what the monitor asks for (scale-out signal)")
    details: list[WorkerSummary] | None = Field(default=None, description="operator keys only")


class QueuesView(BaseModel):
    queue: str
    level: AlarmLabel
    level_since: float | None
    mode: Mode
    depth: int
    inflight: int
    drain_rate: float | None = Field(description="tickets per second the workers finish, recently")
    types: dict[str, TypeDepth]
    workers: WorkersView


class ModeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Mode


class ModeView(BaseModel):
    mode: Mode
    previous: Mode


class HealthView(BaseModel):
    status: Literal["ok"]
    redis: Literal["ok"]
