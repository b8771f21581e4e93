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
    """`steps` identical steps of `step_s` each, starting at `start`; `work` maps a sequence to its tokens."""

    start: float
    step_s: float
    steps: int
    work: dict[Seq, int] = field(default_factory=dict)
    preempted: list[Seq] = field(default_factory=list)


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
                continue
            self.free_blocks -= needed
            seq.blocks += needed
            plan.work[seq] = tokens
            budget -= tokens
        admitted = False
        if not plan.preempted:
            admitted, swap_in_s, budget = self._admit(plan, clock, budget)
            swap_s += swap_in_s
        if not plan.work:
            return None
        prefill_tokens = sum(tokens for seq, tokens in plan.work.items() if not seq.decoding)
        plan.step_s = (
            self._config.decode_step_s
            + self._config.per_seq_slowdown_s * len(plan.work)
            + prefill_tokens / self._config.prefill_tokens_per_s
            + swap_s
        )
        uniform = not admitted and not plan.preempted and swap_s == 0.0 and prefill_tokens == 0
        if uniform and len(plan.work) == len(self.running):
            plan.steps = self._uniform_steps(plan, clock, max(1, int(max_span_s / plan.step_s)))
        return plan

    def commit(self, plan: StepPlan, steps: int) -> CommitResult:
        """Apply the first `steps` steps of `plan`: tokens computed and sampled, finished requests freed."""
        result = CommitResult()
        step_end = plan.start + plan.step_s
        for seq, tokens in plan.work.items():
            if seq.state is not SeqState.RUNNING:
                continue  # aborted while the step ran
            if plan.steps > 1:
                self._commit_decode(seq, plan, steps)
            else:
                seq.computed += tokens
                if seq.computed == seq.total_tokens:
                    self._emit(seq, step_end, 1, plan.step_s)
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
            if head.swapped_blocks:
                tokens = head.total_tokens - head.computed
            else:
                tokens = min(head.total_tokens, budget)
            needed = self._blocks_for(head.computed + tokens if head.swapped_blocks else tokens)
            if tokens > budget or needed > self.free_blocks:
                break
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
            limit = min(limit, max(1, math.ceil((next_arrival - clock) / plan.step_s)))
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
        self._emit(seq, plan.start + plan.step_s * steps, steps, plan.step_s)

    def _emit(self, seq: Seq, last_at: float, tokens: int, step_s: float) -> None:
        """Record `tokens` sampled tokens, the last at `last_at`, one step apart."""
        first_at = last_at - step_s * (tokens - 1)
        if seq.first_token_at is None:
            seq.first_token_at = first_at
            self.stats.ttft.observe(max(0.0, first_at - seq.arrival))
            self.stats.prompt_tokens += seq.prompt_tokens
            self.stats.itl.observe(step_s, tokens - 1)
        else:
            previous = seq.last_token_at if seq.last_token_at is not None else first_at
            self.stats.itl.observe(max(0.0, first_at - previous))
            self.stats.itl.observe(step_s, tokens - 1)
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
