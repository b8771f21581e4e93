"""Why a ticket was shed: one code per admission rule, and the words for each code.

Admission (producer/admission.py) and the enqueue script's cap and deadline checks are the only
places that decide to shed; they return a `ShedCode`. Everything that explains a shed (the 429 body, the rejected
record, metrics, the status page) looks the code up here and never works the reason out again.
"""

from __future__ import annotations

from enum import StrEnum

OVERLOADED = "overloaded"
RATE_LIMITED = "rate_limit_exceeded"


class ShedCode(StrEnum):
    """A rule that refused a ticket at admission, as its submitter and the metrics see it."""

    REDIS_MEMORY = "redis_memory"
    CRITICAL_ONLY = "critical_only"
    QUEUE_RED = "queue_red"
    KV_CACHE_FULL = "kv_cache_full"
    QUEUE_ORANGE = "queue_orange"
    TYPE_CAP = "type_cap_reached"
    BRANCH_SHARE = "branch_share_exceeded"
    CIRCUIT_OPEN = "circuit_open"
    DEADLINE_UNREACHABLE = "deadline_unreachable"

    @property
    def error_type(self) -> str:
        """The OpenAI-style error type: a cap or a share is a rate limit, everything else is overload."""
        return RATE_LIMITED if self in (ShedCode.TYPE_CAP, ShedCode.BRANCH_SHARE) else OVERLOADED

    @classmethod
    def parse(cls, value: str) -> ShedCode:
        """The code a script or a stored record names; an unknown one reads as the cap."""
        try:
            return cls(value)
        except ValueError:
            return cls.TYPE_CAP


_CAUSES: dict[ShedCode, str] = {
    ShedCode.REDIS_MEMORY: "the queue's memory is nearly full, so we are accepting only {critical}",
    ShedCode.CRITICAL_ONLY: "an operator has limited intake to {critical} for now",
    ShedCode.QUEUE_RED: "we are at peak load and are accepting only {critical}",
    ShedCode.KV_CACHE_FULL: "the inference servers are nearly out of memory",
    ShedCode.QUEUE_ORANGE: "{label} requests are paused while the queue drains",
    ShedCode.TYPE_CAP: "{cap} {label} requests are already waiting, the most we hold at once",
    ShedCode.BRANCH_SHARE: (
        "your branch already holds its fair share of the {cap} {label} requests we hold at once, "
        "while other branches are waiting (the share is counted in tokens: longer prompts and "
        "answers use it up sooner)"
    ),
    ShedCode.CIRCUIT_OPEN: "the inference service is failing and is paused while it recovers",
    ShedCode.DEADLINE_UNREACHABLE: (
        "the requests ahead of it would keep it waiting past its deadline, so it would be answered "
        "only when the answer is no longer wanted"
    ),
}


def label(ticket_type: str) -> str:
    """A type as words: `loan_approval` → `loan approval`."""
    return ticket_type.replace("_", " ")


def shed_cause(code: ShedCode, ticket_type: str, *, critical_types: list[str], cap: int) -> str:
    """The plain-words cause for `code`, filled with the type's facts."""
    critical = " and ".join(f"{label(name)} requests" for name in critical_types)
    return _CAUSES[code].format(critical=critical, label=label(ticket_type), cap=cap)


def shed_message(
    code: ShedCode, ticket_type: str, retry_after: int, *, critical_types: list[str], cap: int
) -> str:
    """The sentence a branch reads in a 429: what happened, why, and when to retry."""
    cause = shed_cause(code, ticket_type, critical_types=critical_types, cap=cap)
    plural = "s" if retry_after != 1 else ""
    return (
        f"Your {label(ticket_type)} request was not queued: {cause}. "
        f"Please retry in {retry_after} second{plural}. (code {code.value})"
    )
