"""The JSON documents of the HTTP API, shared by the server and callbacks (the Python client,
clients/python/, mirrors them as dataclasses; tests/client checks they agree).

Only pydantic here (no FastAPI), so the callback job imports it cheaply. The request
body reuses `TicketRequest`'s fields and validators, so the HTTP schema shows the same types and
limits as the Python producer; only `branch_id` becomes optional, because the API key names it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.config import JsonDict

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

# A character Python's str.strip() keeps: \s of JSON Schema (ECMA) regexes misses \x1c-\x1f and \x85.
_NOT_BLANK = r"[^\s\x1c-\x1f\x85]"

# Exactly one of prompt (text) or messages (chat): written out so generated bodies respect it.
_PROMPT_XOR_MESSAGES: dict[str, Any] = {
    "anyOf": [
        {
            "required": ["prompt"],
            "properties": {"prompt": {"type": "string", "pattern": _NOT_BLANK}, "messages": {"type": "null"}},
        },
        {
            "required": ["messages"],
            "properties": {"messages": {"type": "array"}, "prompt": {"type": "null"}},
        },
    ]
}


TICKET_EXAMPLES: list[dict[str, Any]] = [
    {"type": "loan_approval", "urgent_level": 3, "prompt": "Approve a 25k loan for client 7781?"},
    {
        "type": "complaint",
        "vip_level": 2,
        "messages": [{"role": "user", "content": "My card was charged twice on 3 May."}],
        "max_tokens": 200,
        "callback_url": "https://hooks.branch-0412.example/tidegate",
    },
    {"type": "archive_query", "is_bulk": True, "prompt": "List 2019 statements of account 55-1021."},
]


def named_examples(*examples: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """OpenAPI media-type examples (`openapi_examples=`), each with a summary, for the docs pages."""
    return {name.replace(" ", "_"): {"summary": name, "value": value} for name, value in examples}


TICKET_BODY_EXAMPLES = named_examples(
    ("urgent loan approval", TICKET_EXAMPLES[0]),
    ("VIP complaint as chat, with a callback", TICKET_EXAMPLES[1]),
    ("bulk archive query", TICKET_EXAMPLES[2]),
)
BATCH_BODY_EXAMPLES = named_examples(("two tickets", {"tickets": TICKET_EXAMPLES[:2]}))
MODE_BODY_EXAMPLES = named_examples(
    ("admit only critical types", {"mode": "critical-only"}), ("back to normal", {"mode": "normal"})
)


class TicketBody(TicketRequest):
    """One ticket as a branch POSTs it: a `prompt` or chat `messages`, its type and factors."""

    # The policy's checks (known type, context limit) run after this model's own.
    model_config = ConfigDict(
        json_schema_extra=cast("JsonDict", {**_PROMPT_XOR_MESSAGES, "examples": TICKET_EXAMPLES})
    )

    branch_id: str | None = Field(  # type: ignore[assignment]  # optional here: the API key names the branch
        default=None,
        pattern=BRANCH_ID_PATTERN,
        description="optional; when given it must be the API key's branch (else 403)",
    )
    callback_url: Annotated[AnyHttpUrl, WithJsonSchema(_CALLBACK_URL_SCHEMA)] | None = None


class BatchBody(BaseModel):
    """Up to 500 tickets; each item is checked on its own, so one bad item fails only itself."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra=cast("JsonDict", {"examples": [{"tickets": TICKET_EXAMPLES[:2]}]})
    )

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
    deadline: float | None = Field(
        default=None,
        description="Unix time the answer is due: the type's SLO or the caller's sooner deadline",
    )
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
            deadline=ticket.deadline,
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


class ValidationIssue(BaseModel):
    """One bad field: where it is (`["body", "messages", 0, "role"]`), what is wrong, a kind."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorObject(BaseModel):
    """Every error answer's body, in OpenAI's shape (so OpenAI clients read it as they are)."""

    message: str
    type: str
    param: str | None = Field(default=None, description="the field, header or parameter at fault")
    code: str | None = None
    ticket_id: str | None = Field(default=None, description="the `rejected` ticket record, for a shed ticket")
    issues: list[ValidationIssue] | None = Field(default=None, description="every bad field, for a 422")


class ErrorBody(BaseModel):
    """`{"error": {...}}`: the one body of every 4xx and 5xx answer."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "error": {
                        "message": "body.urgent_level: Input should be less than or equal to 5",
                        "type": "invalid_request_error",
                        "param": "urgent_level",
                        "code": "invalid_field",
                        "issues": [
                            {
                                "loc": ["body", "urgent_level"],
                                "msg": "Input should be less than or equal to 5",
                                "type": "less_than_equal",
                            }
                        ],
                    }
                }
            ]
        }
    )

    error: ErrorObject


class BatchItemResult(BaseModel):
    index: int = Field(description="position of the item in the request")
    status_code: Literal[202, 403, 422, 429] = Field(description="what a single POST would have answered")
    outcome: Literal["queued", "existing", "rejected", "invalid", "forbidden"]
    id: str | None = None
    status: TicketStatus | None = None
    priority: float | None = None
    expires_at: float | None = None
    retry_after: int | None = Field(default=None, description="seconds, for a shed item")
    error: ErrorObject | None = Field(default=None, description="why the item was not queued")


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


class BreakerSummary(BaseModel):
    endpoint: str
    role: str = Field(description="primary or fallback")
    level: Literal["closed", "instant", "sustained", "deep"]
    level_value: int = Field(description="0 closed, 1 instant (open or half-open), 2 sustained, 3 deep")
    phase: Literal["closed", "open", "half_open"]
    retry_after: float = Field(description="seconds until the circuit takes work again; 0 when closed")
    sustained: bool
    deep: bool
    model: str
    version: str
    fallback: str = Field(description="a fallback's pairing: matched, mismatched, unknown (else empty)")
    since: float | None = Field(
        default=None, description="Unix time the level or phase last changed (None: never tripped)"
    )
    error_rates: dict[str, float] = Field(
        default_factory=dict, description="error rate (0..1) per window now: instant, sustained, deep"
    )
    requests: dict[str, int] = Field(
        default_factory=dict, description="requests counted per window now: instant, sustained, deep"
    )


class RolloutArmView(BaseModel):
    arm: str
    calls: int
    ok: int
    error: int
    shed: int
    client: int
    error_rate: float
    shed_rate: float
    ttft_p95_seconds: float | None
    ttft_samples: int


class RolloutView(BaseModel):
    """The queue's model rollout (shared/rollout.py); the candidate's address and the arms' figures
    are shown to operator keys only."""

    id: str
    version: str
    status: Literal["running", "paused", "rolled_back", "complete"]
    wave: int = Field(description="0-9: branches whose digit is at most this run on the candidate; 10: all")
    waves: int
    interval_seconds: float
    shadow_fraction: float
    started_at: float
    wave_started_at: float
    next_wave_at: float | None
    ended_at: float | None
    reason: str | None
    actor: str
    candidate: str | None = None
    arms: dict[str, RolloutArmView] | None = None


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
    breakers: list[BreakerSummary] = Field(default_factory=list)
    rollout: RolloutView | None = Field(default=None, description="the model rollout, if one was started")


class ModeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"mode": "critical-only"}]})

    mode: Mode


class ModeView(BaseModel):
    mode: Mode
    previous: Mode


class AuditEntryView(BaseModel):
    time: float = Field(description="when, in seconds since the epoch")
    actor: str = Field(description="who: `key:<id> (<name>)` over HTTP, the OS user or --actor otherwise")
    action: str = Field(description="mode.set, key.create, key.revoke, key.rotate_secret, rollout.<step>")
    target: str = Field(description="the queue, a key's id, a branch or a rollout's id")
    before: Any = None
    after: Any = None


class AuditView(BaseModel):
    entries: list[AuditEntryView] = Field(description="newest first")


class LiveView(BaseModel):
    status: Literal["ok"]


class HealthView(BaseModel):
    status: Literal["ok"]
    redis: Literal["ok"]
