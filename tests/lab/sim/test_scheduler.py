"""The scheduler on its own, in model time: calibration, preemption, crash, aborts and macro steps."""

from __future__ import annotations

import copy
import random

import pytest

from ops.lab.sim.config import ConfigError, SimConfig, build_config
from ops.lab.sim.scheduler import KvCacheExhausted, Scheduler, Seq, SeqState, StepPlan
from ops.lab.sim.stats import ITL_BUCKETS, EngineStats, Histogram


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
        now = plan.end(plan.steps)
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
    config = build_config("a100-7b", decode_attention_s=0.0, prefill_attention_s=0.0)
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
            now = plan.end(plan.steps)
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
        # Exaggerated attention makes a macro step's growth large enough to move tokens between buckets
        # (not a round figure: a value landing exactly on a bucket bound would round either way).
        decode_attention_s=rng.choice([0.0, None, 2.137e-5]),
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


def test_decode_pays_attention_over_each_sequences_context() -> None:
    config = build_config("a100-7b")
    _, short = run(config, [make_seq(0, 16, 200)])
    _, long = run(config, [make_seq(0, 8_000, 200)])
    flat = build_config("a100-7b", decode_attention_s=0.0, prefill_attention_s=0.0)
    _, flat_short = run(flat, [make_seq(0, 16, 200)])
    _, flat_long = run(flat, [make_seq(0, 8_000, 200)])
    # 199 decode steps, each reading about 7,984 more context tokens in the long case.
    extra_decode = 199 * (8_000 - 16) * config.decode_attention_s
    extra_prefill = (8_000 * 8_001 // 2 - 16 * 17 // 2) * config.prefill_attention_s
    assert (long - short) - (flat_long - flat_short) == pytest.approx(extra_decode + extra_prefill, rel=1e-6)


def test_chunked_prefill_pays_attention_for_every_pair_once() -> None:
    """A prompt split over steps costs the same attention as one prefilled at once: P (P + 1) / 2 pairs."""
    whole, chunked = (build_config("a100-7b", max_num_batched_tokens=b) for b in (16_384, 1_024))
    lone = [make_seq(0, 16_000, 1)]
    whole_scheduler, whole_end = run(whole, copy.deepcopy(lone))
    _, chunked_end = run(chunked, copy.deepcopy(lone))
    chunks = -(-16_000 // 1_024)
    extra_steps = (chunks - 1) * (chunked.decode_step_s + chunked.per_seq_slowdown_s)
    assert chunked_end - whole_end == pytest.approx(extra_steps, rel=1e-6)
    assert whole_scheduler.stats.ttft.total == pytest.approx(whole_end)


def test_a_macro_steps_duration_grows_with_its_contexts() -> None:
    plan = StepPlan(start=1.0, step_s=0.01, steps=50, growth_s=0.001)
    assert plan.end(3) == pytest.approx(1.0 + 0.01 + 0.011 + 0.012)
    for elapsed in (0.0, 0.005, 0.01, 0.0105, 0.021, 0.0331, 0.5):
        started = plan.steps_started(elapsed)
        assert plan.duration(started) >= elapsed - 1e-12
        assert started == 1 or plan.duration(started - 1) < elapsed
    assert plan.duration(plan.steps_within(0.1)) <= 0.1 < plan.duration(plan.steps_within(0.1) + 1)


def test_a_histogram_series_lands_where_single_observations_do() -> None:
    series, single = Histogram(ITL_BUCKETS), Histogram(ITL_BUCKETS)
    series.observe_series(0.0093, 0.00071, 400)
    for index in range(400):
        single.observe(0.0093 + index * 0.00071)
    assert series.counts == single.counts
    assert series.total == pytest.approx(single.total) and series.count == single.count == 400


def test_a_request_is_admitted_only_when_its_whole_prompt_fits() -> None:
    """vLLM 0.32 (`scheduler_reserve_full_isl`): free blocks for the first chunk alone are not enough."""
    config = small_cache(max_num_batched_tokens=64)
    scheduler = Scheduler(config, EngineStats())
    holder, big = make_seq(0, 300, 50), make_seq(1, 400, 5)  # 19 blocks held; big needs 25 of the 21 left
    scheduler.add(holder)
    now = 0.0
    while holder.output_tokens == 0:
        plan = scheduler.schedule(now, 1e9)
        assert plan is not None
        scheduler.commit(plan, plan.steps)
        now = plan.end(plan.steps)
    scheduler.add(big)
    plan = scheduler.schedule(now, 1e9)
    assert plan is not None and big not in plan.work and big.state is SeqState.WAITING
    run_rest = [holder, big]
    while scheduler.has_work():
        plan = scheduler.schedule(now, 1e9)
        assert plan is not None
        scheduler.commit(plan, plan.steps)
        now = plan.end(plan.steps)
    assert all(seq.state is SeqState.FINISHED for seq in run_rest) and scheduler.stats.preemptions == 0
    assert big.scheduled_at is not None and holder.finished_at is not None
    assert big.scheduled_at >= holder.finished_at


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room_for_all_of_it() -> None:
    chunked = small_cache(max_num_batched_tokens=512, kv_blocks=200, max_model_len=512)
    whole = small_cache(
        max_num_batched_tokens=512, kv_blocks=200, max_model_len=512, enable_chunked_prefill=False
    )
    for config, shares_a_step in ((chunked, True), (whole, False)):
        scheduler = Scheduler(config, EngineStats())
        first, second = make_seq(0, 400, 1), make_seq(1, 300, 1)
        scheduler.add(first)
        scheduler.add(second)
        plan = scheduler.schedule(0.0, 1e9)
        assert plan is not None and plan.work[first] == 400
        assert (second in plan.work) is shares_a_step
        if shares_a_step:
            assert plan.work[second] == 112  # the rest of the budget: a first chunk


def test_chunked_prefill_off_needs_a_budget_for_the_longest_prompt() -> None:
    with pytest.raises(ConfigError, match="--max-num-batched-tokens=8192 is smaller than --max-model-len"):
        build_config("a100-7b", enable_chunked_prefill=False)
    assert not build_config(
        "a100-7b", enable_chunked_prefill=False, max_num_batched_tokens=32_768
    ).enable_chunked_prefill


def step(scheduler: Scheduler, now: float) -> tuple[StepPlan, float]:
    plan = scheduler.schedule(now, 1e9)
    assert plan is not None
    scheduler.commit(plan, plan.steps)
    return plan, plan.end(plan.steps)


def test_a_sequence_that_preempts_itself_ends_the_step_for_those_after_it() -> None:
    """Priority policy, running [a, low, b]: `low` needs a block, none is free, and it is the lowest
    priority running, so it is its own victim; as in vLLM's running loop, `b` then waits a step."""
    scheduler = Scheduler(
        small_cache(kv_blocks=5, max_model_len=64, scheduling_policy="priority"), EngineStats()
    )
    a, low = make_seq(0, 20, 30, priority=0), make_seq(1, 31, 30, priority=5)
    scheduler.add(a)
    scheduler.add(low)
    _, now = step(scheduler, 0.0)  # both prefill: 2 + 2 of the 5 blocks
    b = make_seq(2, 16, 30, priority=0, arrival=now)
    scheduler.add(b)
    _, now = step(scheduler, now)  # b takes the last block
    plan, now = step(scheduler, now)  # low's 33rd token needs a third block
    assert plan.preempted == [low] and low.state is SeqState.WAITING
    assert a in plan.work and b not in plan.work
    plan, _ = step(scheduler, now)
    assert b in plan.work


def test_when_the_only_sequence_left_in_a_step_preempts_itself_the_next_step_runs_at_once() -> None:
    scheduler = Scheduler(
        small_cache(kv_blocks=4, max_model_len=64, scheduling_policy="priority"), EngineStats()
    )
    low = make_seq(0, 31, 30, priority=5)
    scheduler.add(low)
    _, now = step(scheduler, 0.0)
    high = make_seq(1, 32, 30, priority=0, arrival=now)
    scheduler.add(high)
    _, now = step(scheduler, now)  # the cache is full
    plan, _ = step(scheduler, now)  # low preempts itself: the step it ends ran nothing
    assert plan.start == now and list(plan.work) == [high]
    assert low.state is SeqState.WAITING and low.preemptions == 1
