"""Capacity from a closed-loop saturation run against a real simulator process."""

from __future__ import annotations

import pytest

from ops.lab.bench.saturation import concurrency_ladder, measure_capacity
from ops.lab.sim.process import SimulatorProcess
from ops.lab.traffic.workload import LoadProfile, WorkloadSpec, sample_tickets


def test_the_ladder_spans_the_plateau_below_what_the_cache_holds() -> None:
    # 32000 tokens of cache, 1000-token tickets: 32 fit; the ladder stays within 25%..70% of that.
    assert concurrency_ladder(32_000, 1000.0, 256, 4) == [8, 13, 18, 22]
    assert concurrency_ladder(32_000, 1000.0, 256, 1) == [15]
    assert concurrency_ladder(32_000, 1000.0, 10, 4) == [8, 10]  # max_num_seqs caps it
    with pytest.raises(ValueError, match="mean_ticket_tokens"):
        concurrency_ladder(32_000, 0.0, 256, 2)


def test_capacity_is_the_best_point_in_tokens_and_requests_per_second() -> None:
    spec = WorkloadSpec(profile=LoadProfile.surge(10), capacity_tickets_per_s=1.0, tail_fraction=0.0)
    tickets = sample_tickets(spec, 50)
    with SimulatorProcess(time_scale=20, kv_blocks=2000, max_model_len=16_896) as sim:
        capacity = measure_capacity(sim.base_url, tickets, [2, 6], warmup_s=0.5, window_s=1.5)
    assert [point.concurrency for point in capacity.points] == [2, 6]
    best = max(capacity.points, key=lambda point: point.tokens_per_s)
    assert capacity.tokens_per_s == best.tokens_per_s > 0
    assert capacity.concurrency == best.concurrency
    assert all(point.errors == 0 and point.preemptions == 0 for point in capacity.points)
    # Mean ticket: about 500 prompt + up to a few hundred answer tokens.
    assert 300 < capacity.tokens_per_s / capacity.tickets_per_s < 1500
    assert capacity.to_dict()["concurrency"] == capacity.concurrency
