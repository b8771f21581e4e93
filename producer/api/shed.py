"""The 429 answer for a shed ticket: a friendly message per type, a code naming the rule, Retry-After.

Built from what admission already read (its cached control state), so answering a shed ticket costs
no Redis round trip beyond the `rejected` record the producer writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from producer.api.schemas import ErrorObject
from producer.producer import SubmitResult
from shared.control import ControlState, Mode
from shared.policy import AlarmLevel, Policy

OVERLOADED = "overloaded"
RATE_LIMITED = "rate_limit_exceeded"


@dataclass(frozen=True)
class Shed:
    retry_after: int
    error: ErrorObject

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


def retry_after_header(seconds: float | None) -> int:
    """Whole seconds, rounded up, at least one (RFC 9110 delay-seconds)."""
    return max(1, math.ceil(seconds or 1.0))


def _label(ticket_type: str) -> str:
    return ticket_type.replace("_", " ")


def shed_cause(ticket_type: str, policy: Policy, state: ControlState) -> tuple[str, str, str]:
    """(code, error type, plain-words cause), checked in the order admission applies its rules."""
    type_policy = policy.type_policy(ticket_type)
    critical = " and ".join(f"{_label(name)} requests" for name, tp in policy.types.items() if tp.critical)
    if state.mode is Mode.CRITICAL_ONLY and not type_policy.critical:
        return "critical_only", OVERLOADED, f"an operator has limited intake to {critical} for now"
    if state.level >= AlarmLevel.RED and not type_policy.critical:
        return "queue_red", OVERLOADED, f"we are at peak load and are accepting only {critical}"
    floor = type_policy.kv_shed_free_below
    if (
        floor is not None
        and not type_policy.critical
        and state.kv_free_min is not None
        and state.kv_free_min < floor
    ):
        return "kv_cache_full", OVERLOADED, "the inference servers are nearly out of memory"
    if state.level >= AlarmLevel.ORANGE and type_policy.orange_action == "shed":
        return "queue_orange", OVERLOADED, f"{_label(ticket_type)} requests are paused while the queue drains"
    return (
        "type_cap_reached",
        RATE_LIMITED,
        f"{type_policy.cap} {_label(ticket_type)} requests are already waiting, the most we hold at once",
    )


def shed_answer(result: SubmitResult, ticket_type: str, policy: Policy, state: ControlState) -> Shed:
    retry_after = retry_after_header(result.retry_after)
    code, error_type, cause = shed_cause(ticket_type, policy, state)
    message = (
        f"Your {_label(ticket_type)} request was not queued: {cause}. "
        f"Please retry in {retry_after} second{'s' if retry_after != 1 else ''}. ({result.reason})"
    )
    return Shed(
        retry_after,
        ErrorObject(message=message, type=error_type, param=None, code=code, ticket_id=result.ticket_id),
    )
