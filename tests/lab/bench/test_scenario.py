"""The overload scenario: validation names the flag, quick keeps the shape, the branch split is seeded."""

from __future__ import annotations

import pytest

from ops.lab.bench.scenario import OverloadScenario, split_by_branch
from ops.lab.traffic.workload import plan_arrivals


def test_bad_values_are_refused_with_the_flag_and_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"--surge=0 is not accepted; use more than 0"):
        OverloadScenario(surge_load=0)
    with pytest.raises(ValueError, match=r"--kv-blocks=1000 is not accepted; use at least 1056"):
        OverloadScenario(kv_blocks=1000)
    with pytest.raises(ValueError, match=r"--honour-retry-after=1.5"):
        OverloadScenario(honour_retry_after=1.5)
    with pytest.raises(ValueError, match=r"--client=grpc is not accepted; use tickets or openai"):
        OverloadScenario(client="grpc")


def test_quick_is_the_same_shape_in_a_shorter_run() -> None:
    full, quick = OverloadScenario(), OverloadScenario.quick(seed=3)
    assert quick.duration_s < full.duration_s and quick.seed == 3
    assert (quick.normal_load, quick.surge_load) == (full.normal_load, full.surge_load)
    start, end = full.surge_window()
    assert 0 < start < end < full.duration_s
    assert full.profile().load_at((start + end) / 2) == full.surge_load
    assert full.sim_settings("crash").oom_mode == "crash"


def test_each_branch_retries_one_way_and_the_split_is_seeded() -> None:
    plan = plan_arrivals(OverloadScenario.quick().workload(20.0))
    honouring, fixed = split_by_branch(plan, 0.5, seed=7)
    assert len(honouring) + len(fixed) == len(plan)
    assert not {a.branch_id for a in honouring} & {a.branch_id for a in fixed}
    assert 0.3 < len({a.branch_id for a in honouring}) / len({a.branch_id for a in plan}) < 0.7
    assert split_by_branch(plan, 0.5, seed=7) == (honouring, fixed)
    everyone, nobody = split_by_branch(plan, 1.0, seed=7)
    assert len(everyone) == len(plan) and nobody == []
