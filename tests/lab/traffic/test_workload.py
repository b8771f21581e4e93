"""The branch workload generator: seeded, shaped by its load profile, with the seed mix and size tail."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from ops.lab.sim.config import build_config
from ops.lab.sim.tokens import count_text_tokens
from ops.lab.traffic.capacity import estimate_capacity
from ops.lab.traffic.prompts import prompt_text
from ops.lab.traffic.workload import (
    LoadPoint,
    LoadProfile,
    WorkloadError,
    WorkloadSpec,
    plan_arrivals,
    sample_tickets,
    summarize,
)
from shared.tokens import estimate_tokens


def spec(**overrides: object) -> WorkloadSpec:
    base = WorkloadSpec(profile=LoadProfile.surge(90, surge=2.5, normal=0.6), capacity_tickets_per_s=10.0)
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_same_seed_same_plan_other_seed_other_plan() -> None:
    first, again, other = plan_arrivals(spec()), plan_arrivals(spec()), plan_arrivals(spec(seed=8))
    assert first == again
    assert [a.body() for a in first[:20]] == [a.body() for a in again[:20]]
    assert [(a.at, a.type) for a in first] != [(a.at, a.type) for a in other]


def test_arrivals_follow_the_load_profile() -> None:
    workload = spec(capacity_tickets_per_s=20.0)
    plan = plan_arrivals(workload)
    assert all(0 <= a.at < workload.duration for a in plan)
    assert [a.at for a in plan] == sorted(a.at for a in plan)
    # normal: 0-19.8 s at 60%; surge plateau: 24.3-55.8 s at 250% (of 20 tickets/s)
    normal = sum(1 for a in plan if a.at < 19.8) / 19.8
    surge = sum(1 for a in plan if 24.3 <= a.at < 55.8) / 31.5
    assert normal == pytest.approx(0.6 * 20, rel=0.2)
    assert surge == pytest.approx(2.5 * 20, rel=0.1)
    expected_total = sum(workload.rate_at(t / 10) for t in range(900)) / 10
    assert len(plan) == pytest.approx(expected_total, rel=0.08)


def test_type_mix_levels_and_branches() -> None:
    tickets = sample_tickets(spec(), 6000)
    share = {t: sum(1 for a in tickets if a.type == t) / len(tickets) for t in spec().mix}
    assert share["loan_approval"] == pytest.approx(0.2, abs=0.02)
    assert share["complaint"] == pytest.approx(0.5, abs=0.02)
    assert share["archive_query"] == pytest.approx(0.3, abs=0.02)
    loans = [a for a in tickets if a.type == "loan_approval"]
    assert {a.urgent_level for a in loans} == set(range(6))
    assert all(a.vip_level == 0 and not a.is_bulk for a in loans)
    archive = [a for a in tickets if a.type == "archive_query"]
    assert sum(a.is_bulk for a in archive) / len(archive) == pytest.approx(0.3, abs=0.04)
    assert {a.branch_id for a in tickets} == set(spec().branch_ids())
    assert len(spec().branch_ids()) == 200


def test_prompts_mostly_500_tokens_with_a_tail_up_to_16k() -> None:
    workload = spec()
    tickets = sample_tickets(workload, 6000)
    sizes = [a.prompt_tokens for a in tickets]
    tail = [s for s in sizes if s >= workload.tail_min_tokens]
    assert statistics.median(sizes) == pytest.approx(500, rel=0.05)
    assert len(tail) / len(sizes) == pytest.approx(0.05, abs=0.01)
    assert max(sizes) <= 16000 and max(sizes) > 12000
    summary = summarize(tickets, workload)
    assert summary.tail == len(tail) and summary.prompt_tokens_max == max(sizes)


@pytest.mark.parametrize("tokens", [40, 500, 16000])
def test_prompt_text_has_the_requested_size_for_queue_and_simulator(tokens: int) -> None:
    text = prompt_text("complaint", "branch-007", 3, tokens)
    assert estimate_tokens(text) == pytest.approx(tokens, abs=2)
    assert count_text_tokens(text) == pytest.approx(tokens, abs=2)


def test_load_profile_shape_and_validation() -> None:
    profile = LoadProfile.surge(100, surge=2.0, normal=0.5)
    assert profile.load_at(0) == 0.5
    assert profile.load_at(45) == 2.0
    assert profile.load_at(24.5) == pytest.approx(1.25)
    assert profile.load_at(200) == 0.5
    assert (profile.phase(10), profile.phase(45), profile.phase(80)) == ("normal", "surge", "recovery")
    with pytest.raises(WorkloadError, match="rise strictly"):
        LoadProfile((LoadPoint(0, 1), LoadPoint(0, 2)))
    with pytest.raises(WorkloadError, match="duration"):
        LoadProfile.surge(0)
    with pytest.raises(WorkloadError, match="branches=0"):
        spec(branches=0)
    with pytest.raises(WorkloadError, match="mix"):
        spec(mix={"complaint": -1.0})


def test_capacity_estimate_scales_with_gpus_and_time_scale() -> None:
    workload = spec()
    base = estimate_capacity(build_config("a100-7b"), workload, gpus=1, max_batch=32)
    assert base.tickets_per_s > 1
    assert 1 <= base.batch <= 32
    two = estimate_capacity(build_config("a100-7b"), workload, gpus=2, max_batch=32)
    assert two.tickets_per_s == pytest.approx(2 * base.tickets_per_s)
    slower = estimate_capacity(build_config("a100-7b", time_scale=0.5), workload, gpus=1, max_batch=32)
    assert slower.tickets_per_s == pytest.approx(base.tickets_per_s / 2)
    # A tiny KV cache holds fewer tickets at once, so fewer are drained per second.
    small = estimate_capacity(build_config("a100-7b", kv_blocks=200), workload, gpus=1, max_batch=32)
    assert small.batch < base.batch and small.tickets_per_s < base.tickets_per_s
