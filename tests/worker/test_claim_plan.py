"""The claim plan as a pure function: every bound in its order, and the code of the one that binds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from worker.claim_plan import Bound, ClaimPlan, Gate, Snapshot, plan_claim, reserved_slots

BASE = Snapshot(
    capacity=20,
    capacity_bound=Bound.KV,
    running=6,
    token_budget=10_000,
    usable_kv_tokens=20_000,
    reserve_share=0.2,
)


def test_capacity_less_the_reserve_is_what_other_work_may_fill() -> None:
    plan = plan_claim(BASE)
    assert plan == ClaimPlan(
        count=14, normal_count=10, budget=10_000, normal_budget=6_000, bound=Bound.KV, preempt=True
    ), "20 slots, 4 kept for critical types; 4,000 of the 20,000 usable KV tokens kept"


def test_the_throttle_binds_other_work_and_says_so_critical_tickets_still_fill_capacity() -> None:
    plan = plan_claim(replace(BASE, throttle=12))
    assert plan.count == 14, "critical tickets are bounded by capacity alone"
    assert plan.normal_count == 12 - reserved_slots(12, 0.2) - 6 == 3
    assert plan.bound is Bound.ADAPTIVE


def test_a_throttle_above_capacity_does_not_bind() -> None:
    assert plan_claim(replace(BASE, throttle=32)).bound is Bound.KV


def test_at_capacity_nothing_is_claimed_and_a_waiting_loan_may_preempt() -> None:
    plan = plan_claim(replace(BASE, running=20, capacity_bound=Bound.MEMORY))
    assert not plan.room and plan.preempt and plan.bound is Bound.MEMORY


def test_no_kv_budget_while_something_runs_holds_the_claim() -> None:
    plan = plan_claim(replace(BASE, token_budget=0))
    assert not plan.room and plan.preempt and plan.bound is Bound.KV_BUDGET


def test_an_idle_worker_claims_even_with_no_budget_so_one_long_ticket_still_runs() -> None:
    plan = plan_claim(replace(BASE, running=0, token_budget=0))
    assert plan.room and plan.budget == 1


def test_with_the_normal_share_full_only_critical_tickets_may_come() -> None:
    plan = plan_claim(replace(BASE, running=16))
    assert plan.count == 4 and plan.normal_count == 0 and plan.bound is Bound.CRITICAL_RESERVE


def test_unknown_kv_figures_mean_no_budget() -> None:
    plan = plan_claim(replace(BASE, token_budget=None, usable_kv_tokens=None))
    assert plan.budget == 0 and plan.normal_budget == 0 and plan.count == 14


@pytest.mark.parametrize("bound", [Bound.FAILING, Bound.HALF_OPEN])
def test_a_probing_endpoint_takes_one_ticket_and_never_preempts(bound: Bound) -> None:
    idle = plan_claim(replace(BASE, running=0, health=Gate.PROBE, health_bound=bound))
    assert (idle.count, idle.normal_count, idle.bound, idle.preempt) == (1, 1, bound, False)
    busy = plan_claim(replace(BASE, running=1, health=Gate.PROBE, health_bound=bound))
    assert not busy.room and not busy.preempt


@pytest.mark.parametrize("bound", [Bound.OPEN, Bound.FAILING])
def test_an_open_circuit_or_a_failure_pause_takes_nothing(bound: Bound) -> None:
    plan = plan_claim(replace(BASE, running=0, health=Gate.WAIT, health_bound=bound))
    assert not plan.room and plan.bound is bound and not plan.preempt


@pytest.mark.parametrize(
    ("limit", "share", "kept"), [(20, 0.2, 4), (5, 0.2, 1), (2, 0.9, 1), (1, 0.5, 0), (8, 0, 0)]
)
def test_the_reserve_keeps_at_least_one_slot_and_never_all(limit: int, share: float, kept: int) -> None:
    assert reserved_slots(limit, share) == kept


def test_a_synthetic_surge_keeps_room_for_loans_at_every_step() -> None:
    """A trace of a surge: capacity shrinking under KV pressure and the throttle cutting and growing
    back. At every step other work leaves the reserve free and the plan never exceeds capacity."""
    trace = [(32, None), (28, 24), (24, 18), (20, 18), (24, 20), (32, 26), (32, None)]
    for capacity, throttle in trace:
        for running in range(capacity + 1):
            snap = replace(BASE, capacity=capacity, running=running, throttle=throttle)
            plan = plan_claim(snap)
            assert running + plan.count <= capacity
            batch = min(capacity, throttle or capacity)
            assert running + plan.normal_count <= max(batch - reserved_slots(batch, 0.2), running)
