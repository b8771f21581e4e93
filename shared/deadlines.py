"""A ticket's deadline, and what the enqueue script's deadline rule (shared/lua/lib/deadline.lua)
reads of it, decided here once for every way in (HTTP, OpenAI front door, Python producer, CLI)."""

from __future__ import annotations

from shared.policy import Policy, TypePolicy


def ticket_deadline(type_policy: TypePolicy, created: float, deadline_ms: int | None) -> float:
    """The type's SLO from `created`, or the caller's deadline when sooner (the smaller wins).
    The enqueue script moves it earlier for a retry, counting the SLO from the first sighting."""
    deadline = created + type_policy.slo_seconds
    if deadline_ms is not None:
        deadline = min(deadline, created + deadline_ms / 1000)
    return deadline


def deadline_rule_fields(policy: Policy, ticket_type: str, deadline: float) -> list[tuple[str, str]]:
    """The fields the deadline rule reads: the deadline, the type's SLO (to count it from a retry's
    first sighting), whether the type is exempt (critical), and the types served ahead of it (their
    arrivals are taken off the service rate). Not part of a rejected record."""
    type_policy = policy.type_policy(ticket_type)
    ahead = ",".join(name for name, tp in policy.types.items() if tp.base < type_policy.base)
    return [
        ("deadline", repr(deadline)),
        ("slo_seconds", repr(type_policy.slo_seconds)),
        ("admit_late", "1" if type_policy.critical else ""),
        ("ahead_types", ahead),
    ]
