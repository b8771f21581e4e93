"""The overload scenario: validation names the flag, quick keeps the shape, the branch split is seeded."""

from __future__ import annotations

import pytest

from ops.lab.bench.cli import overload_command_line
from ops.lab.bench.peer_runs import peer_slots, worker_batch
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


def test_a_ramp_of_zero_is_a_step_and_the_plateau_keeps_its_end() -> None:
    step = OverloadScenario(duration_s=100, ramp_s=0, surge_load=3.0)
    profile = step.profile()
    assert profile.load_at(21.9) == step.normal_load and profile.load_at(22.01) == 3.0
    assert step.surge_window()[0] == pytest.approx(22.0, abs=0.01) and step.surge_window()[1] == 62.0
    ramped = OverloadScenario(duration_s=100, ramp_s=10)
    assert ramped.profile().load_at(27) == pytest.approx((ramped.normal_load + ramped.surge_load) / 2)
    built_in = OverloadScenario(ramp_s=12).profile()
    default = OverloadScenario().profile()
    assert [(round(p.at, 6), p.load) for p in built_in.points] == [
        (round(p.at, 6), p.load) for p in default.points
    ]
    with pytest.raises(ValueError, match=r"--ramp=40 is not accepted"):
        OverloadScenario(duration_s=100, ramp_s=40)


def test_memory_settings_and_arms_are_checked_and_set_the_simulators() -> None:
    tight, ample = OverloadScenario(), OverloadScenario(memory="ample")
    assert (tight.oom_mode, tight.sim_settings().kv_blocks) == ("crash", tight.kv_blocks)
    assert ample.oom_mode == "preempt" and ample.sim_settings().kv_blocks > 3 * tight.kv_blocks
    ample.sim_settings().config()  # the simulator accepts it: the blocks fit beside the model
    assert OverloadScenario().sim_settings(scheduling_policy="priority").scheduling_policy == "priority"
    assert tight.sim_settings().max_num_seqs == ample.sim_settings().max_num_seqs == 32
    with pytest.raises(ValueError, match=r"--memory=huge is not accepted; use tight or ample"):
        OverloadScenario(memory="huge")
    with pytest.raises(ValueError, match=r"--system=tidegate,vllm is not accepted"):
        OverloadScenario(systems=("tidegate", "vllm"))
    with pytest.raises(ValueError, match=r"--system=smg,smg is not accepted"):
        OverloadScenario(systems=("smg", "smg"))


def test_a_peer_gets_the_worker_batch_unless_its_slots_are_set() -> None:
    assert peer_slots(OverloadScenario()) == worker_batch()
    assert peer_slots(OverloadScenario(peer_slots=12)) == 12
    with pytest.raises(ValueError, match=r"--peer-slots=0 is not accepted; use 1 to 1024"):
        OverloadScenario(peer_slots=0)


def test_the_quoted_command_reruns_the_scenario_with_the_peers_slots() -> None:
    scenario = OverloadScenario(
        surge_load=3.0,
        ramp_s=12.0,
        memory="tight",
        time_scale=2.0,
        peer_slots=16,
        systems=("tidegate", "smg"),
    )
    line = overload_command_line(
        scenario, quick=False, duration=None, worker_options=("--max-batch=16",), ablate=("preemption",)
    )
    assert line == (
        "tidegate bench overload --surge 3 --ramp 12 --memory tight --time-scale 2 --system tidegate,smg"
        " --peer-slots 16 --worker-option=--max-batch=16 --ablate preemption"
    )
    default = overload_command_line(OverloadScenario(), quick=True, duration=40, worker_options=(), ablate=())
    assert "--peer-slots" not in default and default.startswith(
        "tidegate bench overload --quick --duration 40"
    )
