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


def types_ahead(policy: Policy, ticket_type: str) -> str:
    """The types served ahead of `ticket_type` (a better base priority), comma-separated: the
    deadline rule takes their arrivals off the service rate, since they keep starting first."""
    base = policy.type_policy(ticket_type).base
    return ",".join(name for name, tp in policy.types.items() if tp.base < base)
