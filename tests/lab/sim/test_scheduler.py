"""The scheduler on its own, in model time: calibration, preemption, crash, aborts and macro steps."""

from __future__ import annotations

import copy
import random

import pytest

from ops.lab.sim.config import SimConfig, build_config
from ops.lab.sim.scheduler import KvCacheExhausted, Scheduler, Seq, SeqState
from ops.lab.sim.stats import EngineStats


def make_seq(index: int, prompt: int, output: int, *, priority: int = 0, arrival: float = 0.0) -> Seq:
    return Seq(
        request_id=f"r{index}",
        prompt_tokens=prompt,
        max_tokens=output,
        target_tokens=output,
        priority=priority,
        arrival=arrival,
        arrival_index=index,
    )


def run(config: SimConfig, seqs: list[Seq], *, macro: int | None = None) -> tuple[Scheduler, float]:
    """Drive the scheduler to the end as the engine would, with no wall clock; returns the end time."""
    scheduler = Scheduler(config, EngineStats(), max_macro_steps=macro)
    for seq in seqs:
        scheduler.add(seq)
    now = 0.0
    while scheduler.has_work():
        plan = scheduler.schedule(now, max_span_s=1e9)
        if plan is None:
            arrival = scheduler.next_arrival()
            assert arrival is not None and arrival > now
            now = arrival
            continue
        scheduler.commit(plan, plan.steps)
        now = plan.start + plan.step_s * plan.steps
        assert scheduler.used_blocks == sum(seq.blocks for seq in scheduler.running)
    return scheduler, now


@pytest.mark.parametrize(("prompt", "seconds"), [(500, 0.4), (16_000, 3.2)])
def test_a100_profile_matches_the_seed_figures_for_a_lone_ticket(prompt: int, seconds: float) -> None:
    scheduler, end = run(build_config("a100-7b"), [make_seq(0, prompt, 128)])
    assert end == pytest.approx(seconds, rel=0.01)
    assert scheduler.stats.e2e.total == pytest.approx(seconds, rel=0.01)
    assert scheduler.stats.generation_tokens == 128
    assert scheduler.stats.prompt_tokens == prompt


def test_decode_steps_slow_down_with_more_running_sequences() -> None:
    config = build_config("a100-7b")
    _, alone = run(config, [make_seq(0, 16, 200)])
    _, crowded = run(config, [make_seq(i, 16, 200) for i in range(32)])
    per_step_alone = config.decode_step_s + config.per_seq_slowdown_s
    per_step_crowded = config.decode_step_s + 32 * config.per_seq_slowdown_s
    assert crowded / alone == pytest.approx(per_step_crowded / per_step_alone, rel=0.05)


def small_cache(**overrides: object) -> SimConfig:
    flags: dict[str, object] = {"kv_blocks": 40, "max_model_len": 512, "max_num_seqs": 8}
    flags.update(overrides)
    return build_config("a100-7b", **flags)  # type: ignore[arg-type]


def test_fcfs_preempts_the_newest_sequence_and_recomputes_it() -> None:
    seqs = [make_seq(i, 100, 400) for i in range(2)]
    scheduler, _ = run(small_cache(), seqs)
    assert scheduler.stats.preemptions >= 1
    assert seqs[1].preemptions >= 1 and seqs[0].preemptions == 0
    assert all(seq.state is SeqState.FINISHED and seq.output_tokens == 400 for seq in seqs)
    # A recomputed sequence prefills its prompt and its earlier output again.
    assert seqs[0].finished_at is not None and seqs[1].finished_at is not None
    assert seqs[0].finished_at < seqs[1].finished_at
    assert scheduler.free_blocks == 40


def test_priority_policy_preempts_the_lowest_priority_sequence() -> None:
    seqs = [make_seq(0, 100, 400, priority=5), make_seq(1, 100, 400, priority=0)]
    run(small_cache(scheduling_policy="priority"), seqs)
    assert seqs[0].preemptions >= 1 and seqs[1].preemptions == 0
    assert seqs[1].finished_at is not None and seqs[0].finished_at is not None
    assert seqs[1].finished_at < seqs[0].finished_at


def test_priority_policy_admits_by_priority_then_arrival() -> None:
    seqs = [make_seq(0, 10, 5, priority=3), make_seq(1, 10, 5, priority=1), make_seq(2, 10, 5, priority=1)]
    run(small_cache(scheduling_policy="priority", max_num_seqs=1), seqs)
    finished = sorted(seqs, key=lambda seq: seq.finished_at or 0.0)
    assert [seq.request_id for seq in finished] == ["r1", "r2", "r0"]


def test_swap_preemption_resumes_without_recomputing() -> None:
    recompute = [make_seq(i, 100, 400) for i in range(2)]
    swap = copy.deepcopy(recompute)
    swap_config = small_cache(preemption_mode="swap")
    _, recompute_end = run(small_cache(), recompute)
    scheduler, swap_end = run(swap_config, swap)
    assert scheduler.stats.preemptions >= 1
    assert all(seq.output_tokens == 400 for seq in swap)
    assert scheduler.free_swap_blocks == swap_config.swap_blocks
    assert swap_end < recompute_end


def test_crash_mode_reports_exhaustion_instead_of_preempting() -> None:
    scheduler = Scheduler(small_cache(oom_mode="crash"), EngineStats())
    for i in range(2):
        scheduler.add(make_seq(i, 100, 400))
    now = 0.0
    with pytest.raises(KvCacheExhausted):
        for _ in range(10_000):
            plan = scheduler.schedule(now, 1e9)
            assert plan is not None
            scheduler.commit(plan, plan.steps)
            now = plan.start + plan.step_s * plan.steps
    failed = scheduler.fail_all()
    assert len(failed) == 2 and all(seq.state is SeqState.FAILED for seq in failed)
    assert scheduler.free_blocks == 40 and scheduler.stats.preemptions == 0


def test_abort_frees_blocks_at_once() -> None:
    scheduler = Scheduler(small_cache(), EngineStats())
    running, waiting = make_seq(0, 100, 50), make_seq(1, 100, 50)
    scheduler.add(running)
    plan = scheduler.schedule(0.0, 1e9)
    assert plan is not None
    scheduler.commit(plan, 1)
    scheduler.add(waiting)
    assert scheduler.used_blocks == 7
    assert scheduler.abort(running) and scheduler.abort(waiting)
    assert scheduler.used_blocks == 0 and not scheduler.has_work()
    assert scheduler.stats.aborted == 2 and scheduler.stats.finished["abort"] == 0  # as vLLM 0.32 counts
    assert not scheduler.abort(running)


@pytest.mark.parametrize("seed", range(6))
def test_macro_steps_give_the_same_result_as_single_steps(seed: int) -> None:
    rng = random.Random(seed)
    config = small_cache(
        kv_blocks=rng.choice([40, 64, 200]),
        scheduling_policy=rng.choice(["fcfs", "priority"]),
        preemption_mode=rng.choice(["recompute", "swap"]),
        max_num_batched_tokens=rng.choice([64, 512]),
    )
    seqs = [
        make_seq(
            i, rng.randint(1, 300), rng.randint(1, 200), priority=rng.randint(0, 3), arrival=rng.uniform(0, 2)
        )
        for i in range(24)
    ]
    macro_seqs, single_seqs = copy.deepcopy(seqs), copy.deepcopy(seqs)
    macro, macro_end = run(config, macro_seqs)
    single, single_end = run(config, single_seqs, macro=1)
    assert macro_end == pytest.approx(single_end)
    assert macro.stats.preemptions == single.stats.preemptions
    assert macro.stats.generation_tokens == single.stats.generation_tokens
    for a, b in zip(macro_seqs, single_seqs, strict=True):
        assert a.finished_at == pytest.approx(b.finished_at)
        assert a.first_token_at == pytest.approx(b.first_token_at)
    assert macro.stats.itl.total == pytest.approx(single.stats.itl.total)
    assert macro.stats.itl.counts == single.stats.itl.counts
