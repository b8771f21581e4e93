"""The policy: ticket types, priorities, TTLs, caps, aging and alarm thresholds, loaded from TOML.

Types live here rather than in code so a bank can add one with a file change. A bad file fails at
start with the file and the field named, never later while tickets are flowing.
"""

from __future__ import annotations

import ipaddress
import tomllib
from enum import IntEnum
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

FACTOR_FIELDS = ("urgent_level", "vip_level", "is_bulk")
RetainedOutcome = Literal["done", "failed", "expired", "cancelled", "rejected"]
"""Ticket attributes a type's dynamic factors may weigh."""


class AlarmLevel(IntEnum):
    """Depth alarm levels, ordered so comparisons read naturally (`level >= AlarmLevel.ORANGE`)."""

    GREEN = 0
    YELLOW = 1
    ORANGE = 2
    RED = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str | int) -> AlarmLevel:
        if isinstance(value, int) or str(value).isdigit():
            return cls(int(value))
        return cls[str(value).upper()]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TypePolicy(_Strict):
    """How one ticket type is prioritised, kept and degraded."""

    base: float
    factors: dict[str, float] = Field(default_factory=dict)
    ttl_seconds: float = Field(gt=0, le=7 * 86400)
    cap: int = Field(default=10_000, ge=1, description="most tickets of this type queued at once")
    slo_seconds: float = Field(default=60, gt=0)
    critical: bool = False
    orange_action: Literal["admit", "shed", "defer"] = "admit"
    degraded_max_tokens: int | None = Field(default=None, ge=1)
    kv_shed_free_below: float | None = Field(default=None, ge=0, le=1)
    route_to_fallback: bool = False
    shed_answer: Literal["error", "degraded"] = Field(
        default="error",
        description="what an OpenAI-style caller gets when shed: a 429 error, or a 200 with shed_text",
    )
    shed_text: str = Field(
        default="We cannot answer right now because of high demand. Please try again in a few minutes.",
        min_length=1,
        max_length=2000,
    )

    @model_validator(mode="after")
    def _known_factors(self) -> TypePolicy:
        unknown = sorted(set(self.factors) - set(FACTOR_FIELDS))
        if unknown:
            raise ValueError(f"unknown factor {unknown[0]!r}; known factors: {', '.join(FACTOR_FIELDS)}")
        return self


class QueuePolicy(_Strict):
    aging_seconds: float = Field(default=60, ge=0)
    lease_seconds: float = Field(default=30, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    retention_seconds: int = Field(default=86_400, ge=1, description="ended tickets stay readable this long")
    rejected_retention_seconds: int = Field(
        default=600, ge=1, description="a shed ticket's lean record stays readable this long"
    )
    retention_by_outcome: dict[RetainedOutcome, int] = Field(
        default_factory=dict, description="per-outcome overrides of retention_seconds"
    )
    keep_prompts: bool = Field(default=True, description="keep a finished ticket's prompt with its result")
    context_limit_tokens: int = Field(default=32_768, ge=16)
    retry_backoff_seconds: float = Field(default=1.0, ge=0)
    retry_backoff_max_seconds: float = Field(default=30.0, ge=0)
    default_max_tokens: int = Field(default=256, ge=1)

    @field_validator("retention_by_outcome")
    @classmethod
    def _positive_retention(cls, value: dict[str, int]) -> dict[str, int]:
        for outcome, seconds in value.items():
            if seconds < 1:
                raise ValueError(f"retention for {outcome} must be at least 1 second, got {seconds}")
        return value

    def retention_for(self, outcome: RetainedOutcome) -> int:
        """Seconds a ticket that ended `outcome` stays readable."""
        default = self.rejected_retention_seconds if outcome == "rejected" else self.retention_seconds
        return self.retention_by_outcome.get(outcome, default)

    @property
    def retention_spec(self) -> str:
        """What the Lua scripts that end tickets read (shared/lua/lib/tickets.lua `retention_for`)."""
        seconds = " ".join(str(self.retention_for(o)) for o in ("done", "failed", "expired", "cancelled"))
        return f"{seconds} {1 if self.keep_prompts else 0}"


class AlarmPolicy(_Strict):
    yellow: int = Field(default=30, ge=0)
    orange: int = Field(default=50, ge=0)
    red: int = Field(default=80, ge=0)
    clear_margin: int = Field(default=5, ge=0)
    clear_hold_seconds: float = Field(default=5, ge=0)
    window_seconds: float = Field(
        default=10, ge=0, description="the level follows depth averaged over this long; 0 = each sample"
    )
    min_dwell_seconds: float = Field(
        default=10,
        ge=0,
        description="no step down within this long of the last change, nor up after a step down",
    )

    @model_validator(mode="after")
    def _ordered(self) -> AlarmPolicy:
        if not self.yellow < self.orange < self.red:
            raise ValueError(
                f"thresholds must rise: yellow {self.yellow} < orange {self.orange} < red {self.red}"
            )
        return self

    def threshold(self, level: AlarmLevel) -> int:
        """Depth above which `level` is raised (green has none)."""
        return {AlarmLevel.YELLOW: self.yellow, AlarmLevel.ORANGE: self.orange, AlarmLevel.RED: self.red}[
            level
        ]


class MemoryPolicy(_Strict):
    """The Redis memory guard: above `high_water` of the budget the monitor sheds non-critical
    intake (code `redis_memory`) so critical tickets keep being accepted; it clears below `clear_below`."""

    budget_bytes: int = Field(default=0, ge=0, description="0: Redis's own maxmemory (no maxmemory: off)")
    high_water: float = Field(default=0.8, gt=0, le=1)
    clear_below: float = Field(default=0.7, gt=0, le=1)

    @model_validator(mode="after")
    def _hysteresis(self) -> MemoryPolicy:
        if self.clear_below >= self.high_water:
            raise ValueError(
                f"clear_below {self.clear_below} must be below high_water {self.high_water}, or the guard flaps"
            )
        return self


class HooksPolicy(_Strict):
    """Optional calls the monitor's actions make: a shell command or an http(s) URL (POSTed JSON)."""

    scale_hook: str | None = None
    notify_hook: str | None = None
    timeout_seconds: float = Field(default=10, gt=0, le=300)

    @field_validator("scale_hook", "notify_hook")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a shell command or an http(s) URL, or left out; got an empty string")
        return value


class CallbacksPolicy(_Strict):
    """Callback targets inside the bank that a branch may name anyway (host names, IPs or CIDRs)."""

    allow_hosts: tuple[str, ...] = ()

    @field_validator("allow_hosts")
    @classmethod
    def _valid_entries(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            if "/" in entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(
                        f"allow_hosts entry {entry!r} is not a CIDR network such as 10.20.0.0/16"
                    ) from None
            elif not entry.strip() or any(c.isspace() for c in entry):
                raise ValueError(f"allow_hosts entry {entry!r} must be a host name, an IP or a CIDR network")
        return tuple(e.strip("[]").lower() for e in entries)


class BreakerLevelPolicy(_Strict):
    """One rung of the breaker ladder: trips when the window's error rate is above `error_rate`."""

    window_seconds: float = Field(gt=0, le=86_400)
    error_rate: float = Field(gt=0, lt=1)


class InstantPolicy(BreakerLevelPolicy):
    window_seconds: float = Field(default=1.0, gt=0, le=86_400)
    error_rate: float = Field(default=0.30, gt=0, lt=1)
    open_seconds: float = Field(default=30.0, gt=0, le=3600)


class BreakerPolicy(_Strict):
    """The circuit-breaker ladder of CONTRACT.md: instant refuses, sustained falls back, deep pages."""

    min_requests: int = Field(default=10, ge=1, description="fewer requests in a window never trip it")
    instant: InstantPolicy = Field(default_factory=InstantPolicy)
    sustained: BreakerLevelPolicy = Field(
        default_factory=lambda: BreakerLevelPolicy(window_seconds=60, error_rate=0.20)
    )
    deep: BreakerLevelPolicy = Field(
        default_factory=lambda: BreakerLevelPolicy(window_seconds=300, error_rate=0.15)
    )


class ModelsPolicy(_Strict):
    """The model version primary and fallback must both serve; unset: the primary's, as it reports."""

    version: str | None = Field(default=None, min_length=1)


class RolloutPolicy(_Strict):
    """When a canary wave is judged worse than the control, and how much rollout data is kept.

    Margins are absolute for rates (0.05: five points more errors than the control) and relative
    for TTFT p95 (0.25: a quarter slower)."""

    error_rate_margin: float = Field(default=0.05, ge=0, le=1)
    shed_rate_margin: float = Field(default=0.05, ge=0, le=1)
    ttft_p95_margin: float = Field(default=0.25, ge=0)
    ttft_p95_slack_seconds: float = Field(
        default=0.05, ge=0, description="TTFT p95 differences below this are noise, never a regression"
    )
    min_samples: int = Field(default=20, ge=1, description="candidate calls a wave needs before it is judged")
    latency_samples: int = Field(default=2000, ge=10, description="TTFT samples kept per arm and wave")
    shadow_records: int = Field(default=5000, ge=10, description="A/B records kept per rollout")
    retention_seconds: int = Field(
        default=7 * 86_400, ge=60, description="rollout data expires this long after its last write"
    )
    shadow_concurrency: int = Field(
        default=4, ge=1, le=64, description="shadow calls one worker runs at once"
    )
    shadow_timeout_seconds: float = Field(default=120, gt=0)


class FairnessPolicy(_Strict):
    """Token-weighted fair share between branches (docs/fairness.md): a ticket's weighted tokens
    are `input_weight` per prompt token plus `output_weight` per answer token it may write, divided
    by its branch's weight; admission bounds each branch's queued weighted tokens by its share of
    the type, and within a priority band the claim serves the branch served least so far."""

    input_weight: float = Field(default=1.0, gt=0, le=1000)
    output_weight: float = Field(default=2.0, gt=0, le=1000)
    branch_weights: dict[str, float] = Field(
        default_factory=dict, description="branch id -> its share relative to others (default 1)"
    )

    @field_validator("branch_weights")
    @classmethod
    def _positive_weights(cls, weights: dict[str, float]) -> dict[str, float]:
        for branch, weight in weights.items():
            if not branch or not 0 < weight <= 1000:
                raise ValueError(f"branch_weights[{branch!r}] = {weight!r}: a weight in (0, 1000]")
        return weights

    def cost_args(self) -> list[str | float]:
        """The fairness arguments of the claim and enqueue scripts: the two weights, then each
        weighted branch."""
        pairs = [v for branch, weight in sorted(self.branch_weights.items()) for v in (branch, weight)]
        return [self.input_weight, self.output_weight, len(self.branch_weights), *pairs]


class Policy(_Strict):
    queue: QueuePolicy = Field(default_factory=QueuePolicy)
    types: dict[str, TypePolicy]
    alarms: AlarmPolicy = Field(default_factory=AlarmPolicy)
    hooks: HooksPolicy = Field(default_factory=HooksPolicy)
    memory: MemoryPolicy = Field(default_factory=MemoryPolicy)
    callbacks: CallbacksPolicy = Field(default_factory=CallbacksPolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    models: ModelsPolicy = Field(default_factory=ModelsPolicy)
    rollout: RolloutPolicy = Field(default_factory=RolloutPolicy)
    fairness: FairnessPolicy = Field(default_factory=FairnessPolicy)

    @model_validator(mode="after")
    def _has_types(self) -> Policy:
        if not self.types:
            raise ValueError("at least one ticket type must be defined under [types]")
        return self

    @property
    def type_names(self) -> list[str]:
        return list(self.types)

    @property
    def critical_types(self) -> list[str]:
        """Types admitted at red and kept headroom in every worker, in policy order."""
        return [name for name, tp in self.types.items() if tp.critical]

    def is_critical(self, name: str) -> bool:
        """Whether `name` is a critical type (an unknown name is not)."""
        type_policy = self.types.get(name)
        return type_policy is not None and type_policy.critical

    @property
    def critical_slo_seconds(self) -> float | None:
        """The tightest SLO among critical types; None when no type is critical."""
        slos = [self.types[name].slo_seconds for name in self.critical_types]
        return min(slos) if slos else None

    def type_policy(self, name: str) -> TypePolicy:
        """The policy of `name`, or an error listing the known types."""
        try:
            return self.types[name]
        except KeyError:
            raise UnknownTicketType(name, self.type_names) from None


class UnknownTicketType(ValueError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown ticket type {name!r}; known types: {', '.join(known)}")
        self.name = name
        self.known = known


class PolicyError(Exception):
    """A policy file that cannot be used; the message names the file and the field."""


def _format_errors(source: str, error: ValidationError) -> str:
    lines = [f"invalid policy file {source}:"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {field}: {item['msg']}")
    return "\n".join(lines)


def default_policy_text() -> str:
    return resources.files("shared").joinpath("default_policy.toml").read_text(encoding="utf-8")


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"invalid policy file {source}: not valid TOML: {exc}") from exc
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_format_errors(source, exc)) from exc


def load_policy(path: str | Path | None = None) -> Policy:
    """Load `path`, or the packaged defaults (CONTRACT.md's table) when no file is given."""
    if path is None:
        return parse_policy(default_policy_text(), "default_policy.toml")
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {file}: {exc.strerror}") from exc
    return parse_policy(text, str(file))
