"""vLLM's continuous-batching scheduler for one GPU, as plain synchronous code over model time.

Each step it first advances the running sequences (decode one token, or the next prefill chunk) inside
`max_num_batched_tokens`, allocating KV blocks as they grow; when the cache is full it preempts the newest
(fcfs) or lowest-priority (priority) sequence, or reports exhaustion for crash mode. Only in a step
without preemption does it admit waiting requests, while sequences, tokens and blocks allow.

Stretches of identical decode steps are planned as one "macro step" of k steps, so the engine's Python
work scales with events (arrivals, finishes, block exhaustion), not with generated tokens. The engine
commits as many of those k steps as have elapsed when something interrupts it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from heapq import heappop, heappush

from ops.lab.sim.config import OomMode, PreemptionMode, SchedulingPolicy, SimConfig
from ops.lab.sim.stats import EngineStats


class SeqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(eq=False)
class Seq:
    """One request inside the engine. `computed` counts tokens whose KV entries exist (on GPU or swapped)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    target_tokens: int
    priority: int
    arrival: float
    arrival_index: int
    output_tokens: int = 0
    computed: int = 0
    blocks: int = 0
    swapped_blocks: int = 0
    state: SeqState = SeqState.WAITING
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def decoding(self) -> bool:
        """Past prefill: only the last sampled token is still to be fed through the model."""
        return self.output_tokens > 0 and self.computed == self.total_tokens - 1


class KvCacheExhausted(RuntimeError):
    """A running sequence needs a KV block and none is free (crash mode turns this into an OOM)."""

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(f"a running sequence needs {needed} more KV blocks and {free} are free")
        self.needed = needed
        self.free = free


class WaitingQueue:
    """Arrival order for fcfs (preempted requests go back to the front), (priority, arrival) for priority."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        self._policy = policy
        self._fifo: deque[Seq] = deque()
        self._heap: list[tuple[int, int, Seq]] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, seq: Seq) -> None:
        if self._policy is SchedulingPolicy.PRIORITY:
            heappush(self._heap, (seq.priority, seq.arrival_index, seq))
        else:
            self._fifo.append(seq)
        self._size += 1

    def push_preempted(self, seq: Seq) -> None:
        if self._policy is SchedulingPolicy.PRIORITY:
            self.push(seq)
        else:
            self._fifo.appendleft(seq)
            self._size += 1

    def peek(self) -> Seq | None:
        self._drop_stale()
        if self._policy is SchedulingPolicy.PRIORITY:
            return self._heap[0][2] if self._heap else None
        return self._fifo[0] if self._fifo else None

    def pop(self) -> Seq:
        self._drop_stale()
        self._size -= 1
        if self._policy is SchedulingPolicy.PRIORITY:
            return heappop(self._heap)[2]
        return self._fifo.popleft()

    def discard(self, seq: Seq) -> None:
        """Forget an aborted request; the heap drops it lazily, the deque at once."""
        self._size -= 1
        if self._policy is not SchedulingPolicy.PRIORITY:
            self._fifo.remove(seq)

    def drain(self) -> list[Seq]:
        seqs = [entry[2] for entry in self._heap if entry[2].state is SeqState.WAITING] + list(self._fifo)
        self._heap.clear()
        self._fifo.clear()
        self._size = 0
        return seqs

    def _drop_stale(self) -> None:
        while self._heap and self._heap[0][2].state is not SeqState.WAITING:
            heappop(self._heap)


@dataclass
class StepPlan:
    """`steps` steps from `start`, the first lasting `step_s` and each later one `growth_s` longer.

    A stretch of identical decode steps still grows: every sequence's context gains a token per step,
    and attention reads it all. `work` maps a sequence to its tokens in each step.
    """

    start: float
    step_s: float
    steps: int
    growth_s: float = 0.0
    work: dict[Seq, int] = field(default_factory=dict)
    preempted: list[Seq] = field(default_factory=list)

    def duration(self, steps: int) -> float:
        return steps * self.step_s + self.growth_s * steps * (steps - 1) / 2

    def end(self, steps: int) -> float:
        """Model time at which the first `steps` steps are done."""
        return self.start + self.duration(steps)

    def steps_started(self, elapsed: float) -> int:
        """Steps begun within `elapsed` model seconds of the start, the one in flight included (at least 1)."""
        if self.growth_s == 0.0:
            steps = math.ceil(elapsed / self.step_s)
        else:
            half = self.growth_s / 2
            linear = self.step_s - half
            steps = math.ceil((-linear + math.sqrt(linear * linear + 4 * half * elapsed)) / (2 * half))
        steps = max(1, steps)
        while steps > 1 and self.duration(steps - 1) >= elapsed:
            steps -= 1
        while self.duration(steps) < elapsed:
            steps += 1
        return steps

    def steps_within(self, span: float) -> int:
        """The most steps that end within `span` model seconds (at least 1)."""
        steps = self.steps_started(span)
        return steps if self.duration(steps) <= span or steps == 1 else steps - 1


@dataclass
class CommitResult:
    progressed: list[Seq] = field(default_factory=list)
    finished: list[Seq] = field(default_factory=list)


class Scheduler:
    """State of one GPU's engine: the running batch, the waiting queue and the KV block pool."""

    def __init__(self, config: SimConfig, stats: EngineStats, *, max_macro_steps: int | None = None) -> None:
        self._config = config
        self.stats = stats
        self.running: list[Seq] = []
        self.waiting = WaitingQueue(config.scheduling_policy)
        self.free_blocks = config.kv_blocks
        self.free_swap_blocks = config.swap_blocks
        self._max_macro_steps = max_macro_steps

    @property
    def used_blocks(self) -> int:
        return self._config.kv_blocks - self.free_blocks

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def add(self, seq: Seq) -> None:
        seq.state = SeqState.WAITING
        self.waiting.push(seq)

    def abort(self, seq: Seq) -> bool:
        """Drop a request and free its blocks at once; False when it had already left the engine."""
        if seq.state is SeqState.RUNNING:
            self.running.remove(seq)
        elif seq.state is SeqState.WAITING:
            self.waiting.discard(seq)
        else:
            return False
        self._release(seq)
        seq.state = SeqState.ABORTED
        seq.finish_reason = "abort"
        self.stats.aborted += 1
        return True

    def fail_all(self) -> list[Seq]:
        """Empty the engine (an OOM crash): every running and waiting request fails, all blocks free."""
        failed = self.running + self.waiting.drain()
        self.running = []
        for seq in failed:
            self._release(seq)
            seq.state = SeqState.FAILED
        self.free_blocks = self._config.kv_blocks
        self.free_swap_blocks = self._config.swap_blocks
        return failed

    def next_arrival(self) -> float | None:
        head = self.waiting.peek()
        return None if head is None else head.arrival

    def schedule(self, clock: float, max_span_s: float) -> StepPlan | None:
        """Plan the steps starting at `clock`, a macro step lasting at most about `max_span_s`.

        None when nothing can run yet: the waiting head has not arrived by `clock`.
        """
        plan = StepPlan(start=clock, step_s=0.0, steps=1)
        budget, swap_s = self._schedule_running(plan)
        admitted = False
        if not plan.preempted:
            admitted, swap_in_s, budget = self._admit(plan, clock, budget)
            swap_s += swap_in_s
        if not plan.work:
            # A sequence that preempted itself ends vLLM's step with nothing run; the next one starts
            # at once. Each such round has fewer running sequences, so this ends.
            return self.schedule(clock, max_span_s) if plan.preempted else None
        plan.step_s = self._step_seconds(plan) + swap_s
        decoding_only = all(seq.decoding for seq in plan.work)
        uniform = not admitted and not plan.preempted and swap_s == 0.0 and decoding_only
        if uniform and len(plan.work) == len(self.running):
            # Each step every context grows by a token, and attention reads all of it.
            plan.growth_s = self._config.decode_attention_s * len(plan.work)
            plan.steps = self._uniform_steps(plan, clock, plan.steps_within(max_span_s))
        return plan

    def _schedule_running(self, plan: StepPlan) -> tuple[int, float]:
        """Give the running sequences their tokens, preempting as vLLM does; returns (budget left, swap s)."""
        budget = self._config.max_num_batched_tokens
        swap_s = 0.0
        for seq in list(self.running):
            if seq.state is not SeqState.RUNNING:
                continue  # preempted earlier in this loop
            if budget == 0:
                break
            tokens = min(seq.total_tokens - seq.computed, budget)
            needed = self._blocks_for(seq.computed + tokens) - seq.blocks
            while needed > self.free_blocks:
                if self._config.oom_mode is OomMode.CRASH:
                    raise KvCacheExhausted(needed, self.free_blocks)
                victim = self._victim()
                budget += plan.work.pop(victim, 0)
                swap_s += self._preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            if seq.state is not SeqState.RUNNING:
                break  # as vLLM: once a sequence preempts itself, no later one runs this step
            self.free_blocks -= needed
            seq.blocks += needed
            plan.work[seq] = tokens
            budget -= tokens
        return budget, swap_s

    def _step_seconds(self, plan: StepPlan) -> float:
        """The step model: a base, a cost per sequence, per prefill token, and attention over the context."""
        config = self._config
        prefill_tokens = 0
        prefill_pairs = 0
        decode_context = 0
        for seq, tokens in plan.work.items():
            if seq.decoding:
                decode_context += seq.total_tokens
            else:
                prefill_tokens += tokens
                # Each new token attends to the context before it and to the chunk up to itself.
                prefill_pairs += tokens * seq.computed + tokens * (tokens + 1) // 2
        return (
            config.decode_step_s
            + config.per_seq_slowdown_s * len(plan.work)
            + prefill_tokens / config.prefill_tokens_per_s
            + config.decode_attention_s * decode_context
            + config.prefill_attention_s * prefill_pairs
        )

    def commit(self, plan: StepPlan, steps: int) -> CommitResult:
        """Apply the first `steps` steps of `plan`: tokens computed and sampled, finished requests freed."""
        result = CommitResult()
        step_end = plan.end(1)
        for seq, tokens in plan.work.items():
            if seq.state is not SeqState.RUNNING:
                continue  # aborted while the step ran
            if plan.steps > 1:
                self._commit_decode(seq, plan, steps)
            else:
                seq.computed += tokens
                if seq.computed == seq.total_tokens:
                    self._emit(seq, step_end, 1, plan)
            result.progressed.append(seq)
            if seq.output_tokens >= seq.target_tokens:
                self._finish(seq)
                result.finished.append(seq)
        return result

    # -- internals ---------------------------------------------------------------------------------

    def _admit(self, plan: StepPlan, clock: float, budget: int) -> tuple[bool, float, int]:
        admitted = False
        swap_s = 0.0
        while budget > 0 and len(self.running) < self._config.max_num_seqs:
            head = self.waiting.peek()
            if head is None or head.arrival > clock:
                break
            remaining = head.total_tokens - head.computed if head.swapped_blocks else head.total_tokens
            if remaining > budget and (head.swapped_blocks or not self._config.enable_chunked_prefill):
                break
            tokens = min(remaining, budget)
            # vLLM 0.32 admits a request only when its whole sequence fits in the free blocks
            # (`scheduler_reserve_full_isl`), not only its first chunk.
            if self._blocks_for(head.total_tokens) > self.free_blocks:
                break
            needed = self._blocks_for(head.computed + tokens if head.swapped_blocks else tokens)
            self.waiting.pop()
            if head.swapped_blocks:
                swap_s += head.swapped_blocks * self._config.swap_s_per_block
                self.free_swap_blocks += head.swapped_blocks
                head.swapped_blocks = 0
            else:
                head.computed = 0
            head.state = SeqState.RUNNING
            head.blocks = needed
            self.free_blocks -= needed
            if head.scheduled_at is None:
                head.scheduled_at = clock
                self.stats.queue_time.observe(max(0.0, clock - head.arrival))
            self.running.append(head)
            plan.work[head] = tokens
            budget -= tokens
            admitted = True
        return admitted, swap_s, budget

    def _victim(self) -> Seq:
        if self._config.scheduling_policy is SchedulingPolicy.PRIORITY:
            return max(self.running, key=lambda seq: (seq.priority, seq.arrival_index))
        return self.running[-1]

    def _preempt(self, victim: Seq) -> float:
        """Move a running sequence back to waiting; returns the swap-out time it costs this step."""
        self.running.remove(victim)
        swap_s = 0.0
        can_swap = victim.blocks <= self.free_swap_blocks
        if self._config.preemption_mode is PreemptionMode.SWAP and can_swap and victim.decoding:
            victim.swapped_blocks = victim.blocks
            self.free_swap_blocks -= victim.blocks
            swap_s = victim.blocks * self._config.swap_s_per_block
        else:
            victim.computed = 0
        self.free_blocks += victim.blocks
        victim.blocks = 0
        victim.state = SeqState.WAITING
        victim.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.push_preempted(victim)
        return swap_s

    def _uniform_steps(self, plan: StepPlan, clock: float, max_steps: int) -> int:
        """How many identical decode steps can run before anything changes the batch."""
        limit = max_steps if self._max_macro_steps is None else min(max_steps, self._max_macro_steps)
        limit = min(limit, *(seq.target_tokens - seq.output_tokens for seq in plan.work))
        next_arrival = self.next_arrival()
        if next_arrival is not None and next_arrival > clock:
            # Stop at the step in which a not-yet-arrived head arrives; it may be admissible then.
            limit = min(limit, plan.steps_started(next_arrival - clock))
        if limit <= 1:
            return 1
        if self._extra_blocks(plan, limit) <= self.free_blocks:
            return limit
        low, high = 1, limit  # extra_blocks(low) fits (step 1 is allocated), extra_blocks(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            if self._extra_blocks(plan, middle) <= self.free_blocks:
                low = middle
            else:
                high = middle
        return low

    def _extra_blocks(self, plan: StepPlan, steps: int) -> int:
        """Blocks beyond those already held that `steps` decode steps would allocate."""
        return sum(max(0, self._blocks_for(seq.computed + steps) - seq.blocks) for seq in plan.work)

    def _commit_decode(self, seq: Seq, plan: StepPlan, steps: int) -> None:
        seq.computed += steps
        needed = self._blocks_for(seq.computed) - seq.blocks
        if needed > 0:
            seq.blocks += needed
            self.free_blocks -= needed
        self._emit(seq, plan.end(steps), steps, plan)

    def _emit(self, seq: Seq, last_at: float, tokens: int, plan: StepPlan) -> None:
        """Record `tokens` sampled tokens of `plan`'s first steps, one a step, the last at `last_at`."""
        first_at = plan.end(1)
        # The gaps between them are steps 2..tokens, each `growth_s` longer than the one before.
        later_gap, growth = plan.step_s + plan.growth_s, plan.growth_s
        if seq.first_token_at is None:
            seq.first_token_at = first_at
            self.stats.ttft.observe(max(0.0, first_at - seq.arrival))
            self.stats.prompt_tokens += seq.prompt_tokens
        else:
            previous = seq.last_token_at if seq.last_token_at is not None else first_at
            self.stats.itl.observe(max(0.0, first_at - previous))
        self.stats.itl.observe_series(later_gap, growth, tokens - 1)
        seq.output_tokens += tokens
        seq.last_token_at = last_at
        self.stats.generation_tokens += tokens

    def _finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.state = SeqState.FINISHED
        seq.finished_at = seq.last_token_at
        seq.finish_reason = "length" if seq.output_tokens >= seq.max_tokens else "stop"
        self.stats.finished[seq.finish_reason] += 1
        finished_at = seq.finished_at if seq.finished_at is not None else seq.arrival
        self.stats.e2e.observe(max(0.0, finished_at - seq.arrival))
        if seq.output_tokens > 1 and seq.first_token_at is not None:
            self.stats.tpot.observe((finished_at - seq.first_token_at) / (seq.output_tokens - 1))

    def _release(self, seq: Seq) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0
        if seq.swapped_blocks:
            self.free_swap_blocks += seq.swapped_blocks
            seq.swapped_blocks = 0

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self._config.block_size)
