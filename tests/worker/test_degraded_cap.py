"""Degraded service caps an answer's max_tokens once, in the worker, from the shared control state."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.policy import Policy
from tests.worker.support import running_ticket
from worker.execution import capped_max_tokens
from worker.inflight import RunningTicket

REPO = Path(__file__).resolve().parents[2]


def running(ticket_type: str, max_tokens: int, prompt_tokens: int = 10) -> RunningTicket:
    ticket = running_ticket(ticket_type, max_tokens=max_tokens, prompt_tokens_estimate=prompt_tokens)
    return RunningTicket(ticket, "1", 0)


@pytest.mark.parametrize(("degraded", "expected"), [(True, 512), (False, 2000)])
def test_a_loan_is_capped_only_while_service_is_degraded(
    policy: Policy, degraded: bool, expected: int
) -> None:
    assert policy.types["loan_approval"].degraded_max_tokens == 512
    assert capped_max_tokens(running("loan_approval", 2000), policy, degraded) == expected


def test_the_context_still_bounds_an_answer_at_normal_service(policy: Policy) -> None:
    limit = policy.queue.context_limit_tokens
    assert capped_max_tokens(running("complaint", 4000, prompt_tokens=limit - 100), policy, False) == 100


def test_the_degraded_cap_is_applied_in_exactly_one_place() -> None:
    """Intake leaves max_tokens alone (tests/producer/test_admission.py); only the worker caps."""
    uses = [
        path.relative_to(REPO).as_posix()
        for package in ("shared", "producer", "worker", "ops")
        for path in (REPO / package).rglob("*.py")
        if re.search(r"\.degraded_max_tokens\b", path.read_text(encoding="utf-8"))
    ]
    assert uses == ["worker/execution.py"]
