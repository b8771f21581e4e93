"""One system under the overload workload: tidegate's real processes, or the seed's FIFO baseline.

Each run starts its own simulators in the memory setting's mode (crash-on-OOM when tight), plays the
plan, samples a timeline, meters CPU, reads the simulators' counters before and after, and closes its
books; what comes back is a `SystemRun`, the raw material of the figures (the peer arms' runs are in
`peer_runs.py`). Whatever happens, the processes it started are stopped and, on a Redis shared with
others, the keys it created are deleted.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from redis import Redis

from ops.lab.bench.baseline_player import BaselinePlayer, SeedClientSettings
from ops.lab.bench.cpu import CpuMeter
from ops.lab.bench.figures import Books
from ops.lab.bench.redis_memory import MemoryWatch, memory_figures
from ops.lab.bench.scenario import OverloadScenario, split_by_branch
from ops.lab.bench.sim_probe import SimCounters, served_model
from ops.lab.bench.timeline import Sample, SystemState, Timeline, sum_counters
from ops.lab.demo.run import delete_queue_keys, rq_key_prefix
from ops.lab.procs.children import ChildProcess, child_env
from ops.lab.procs.ports import free_port, http_ok
from ops.lab.stack.stack import SimSettings, Stack, StackConfig, WorkerSettings, tidegate_command
from ops.lab.traffic.accounting import Ledger, check_accounting
from ops.lab.traffic.player import PlayerSettings, RetryPolicy, TrafficPlayer
from ops.lab.traffic.records import OUTCOMES, TicketRecord
from ops.lab.traffic.timeseries import take_sample
from ops.lab.traffic.workload import PlannedArrival
from shared.live_workers import read_live_workers
from shared.policy import AlarmLevel, Policy
from shared.queue import TicketQueue

log = logging.getLogger(__name__)

SIM_STARTUP_SECONDS = 30.0
PROGRESS_EVERY_S = 10.0


class OverloadError(RuntimeError):
    """The benchmark could not run; the message says which part failed and where its logs are."""


@dataclass
class SystemRun:
    """What one system did with the workload, before it is turned into figures."""

    name: str
    records: list[TicketRecord]
    samples: list[Sample]
    started_at: float
    tokens_by_index: dict[int, int]
    books: Books
    sim: SimCounters
    cpu_cores: dict[str, float]
    notes: list[str] = field(default_factory=list)
    redis_memory: dict[str, float] = field(default_factory=dict)
    shed_codes: dict[str, dict[str, int]] = field(default_factory=dict)
    """type -> code -> submissions shed or ended unanswered with that code ("429", "expired", ...)."""
    harness: dict[str, object] = field(default_factory=dict)
    """What the load generator says about itself (send lag), to show it was not the bottleneck."""


def start_simulators(
    settings: SimSettings, gpus: int, run_dir: Path, name: str
) -> list[tuple[ChildProcess, str]]:
    """`gpus` simulator processes (one GPU each, as the stack runs them), started together."""
    sims: list[tuple[ChildProcess, str]] = []
    for gpu in range(gpus):
        port = free_port()
        command = tidegate_command(
            "sim-vllm", "--host", "127.0.0.1", "--port", str(port), *settings.args(gpu)
        )
        child = ChildProcess(f"{name}-gpu{gpu}", command, run_dir / f"{name}-gpu{gpu}.log", env=child_env())
        sims.append((child.start(), f"http://127.0.0.1:{port}"))
    try:
        for child, url in sims:
            child.wait_ready(partial(http_ok, url + "/health"), SIM_STARTUP_SECONDS, "/health 200")
    except BaseException:
        for child, _ in sims:
            child.stop(2.0)
        raise
    return sims


def no_progress(line: str) -> None:
    """A progress callback that says nothing."""


@dataclass(frozen=True)
class OverloadSetup:
    """What one overload run plays against: the scenario, the Redis, the policy and the results folder."""

    scenario: OverloadScenario
    redis_url: str
    policy: Policy
    results_dir: Path
    redis_shared: bool = True
    progress: Callable[[str], None] = no_progress

    @property
    def types(self) -> list[str]:
        return self.policy.type_names


class SystemRunner:
    """Runs the plan against each system with the same scenario, Redis and results folder."""

    def __init__(self, setup: OverloadSetup) -> None:
        self.setup = setup

    def tidegate(self, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        queue_name = f"bench-overload-{time.strftime('%H%M%S')}-{secrets.token_hex(3)}"
        config = StackConfig(
            redis_url=self.setup.redis_url,
            queue_name=queue_name,
            run_dir=self.setup.results_dir / "tidegate",
            gpus=s.gpus,
            sim=s.sim_settings(),
            worker=WorkerSettings(extra_args=s.worker_args, ablate=s.ablate),
            env={"RQ_KEY_PREFIX": rq_key_prefix(queue_name)},  # rq's keys go with the queue's at the end
        )
        self.setup.progress(
            f"tidegate: starting {s.gpus} simulator(s) in {s.oom_mode} mode, worker(s), monitor, API"
        )
        try:
            with Stack(config) as stack:
                return self._play_tidegate(stack, plan)
        finally:
            if self.setup.redis_shared:
                client = Redis.from_url(self.setup.redis_url)
                try:
                    delete_queue_keys(client, queue_name)
                finally:
                    client.close()

    def _play_tidegate(self, stack: Stack, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        for branch in sorted({a.branch_id for a in plan}):
            stack.branch_key(branch)
        queue = TicketQueue(stack.redis, self.setup.policy, stack.queue_name)
        counts_before = queue.stats().counts
        players = self._players(stack, plan)

        def probe() -> SystemState:
            sample = take_sample(queue, self.setup.policy, 0.0)
            bounds = ",".join(
                sorted({w.bound for w in read_live_workers(queue.redis, queue.keys) if w.bound})
            )
            return SystemState(
                sample.depth, sample.inflight, int(AlarmLevel.parse(sample.level)), bounds or None
            )

        before = read_counters(stack.vllm_urls)
        timeline = Timeline(probe, stack.vllm_urls, s.sample_interval_s)
        cpu = CpuMeter(
            {child.name: child.pid for child in stack.children if child.pid} | {"harness": os.getpid()}
        )
        memory = MemoryWatch(stack.redis)
        t0 = time.monotonic()
        timeline.start(t0)
        cpu.start()
        memory.start()
        for player in players:
            player.start()
        started_at = min(player.started_at for player in players)
        watch(self.setup.progress, "tidegate", timeline, lambda: all(p.wait(0) for p in players), t0)
        for player in players:
            player.close()
        samples = timeline.stop()
        cores = cpu.stop()
        memory.stop()
        after = read_counters(stack.vllm_urls)
        records = sorted((r for p in players for r in p.snapshot()), key=lambda r: r.index)
        redis_memory = memory_figures(memory, stack.redis, queue.keys, records)
        counts_now = queue.stats().counts
        counts = {k: v - counts_before.get(k, 0) for k, v in counts_now.items()}
        check = check_accounting(counts, records, self.setup.types)
        done = [r for r in records if r.outcome == "done" and r.ticket_id]
        tokens: dict[int, int] = {}
        for record, ticket in zip(done, queue.get_many([r.ticket_id or "" for r in done]), strict=True):
            usage = ticket.usage if ticket is not None else None
            if usage:
                tokens[record.index] = int(usage.get("prompt_tokens", 0)) + int(
                    usage.get("completion_tokens", 0)
                )
        notes = [
            f"branches called tidegate with the {s.client} client",
            f"{sum(p.cancelled_leftovers for p in players)} tickets still open after the drain were cancelled",
        ]
        for player in players:
            mine = player.snapshot()
            notes.append(
                f"branches retrying {player.settings.retry.mode}: {len(mine)} requests, "
                f"{sum(r.rejections for r in mine)} answered 429, {sum(r.retries for r in mine)} retries, "
                f"{sum(1 for r in mine if r.outcome == 'rejected')} gave up"
            )
        return SystemRun(
            "tidegate",
            records,
            samples,
            started_at,
            tokens,
            Books.from_check(check),
            after.since(before),
            cores,
            notes,
            redis_memory,
            shed_codes={
                t: {"429/degraded": sum(r.rejections for r in records if r.type == t)}
                | unanswered_codes([r for r in records if r.type == t])
                for t in self.setup.types
            },
        )

    def _players(self, stack: Stack, plan: Sequence[PlannedArrival]) -> list[TrafficPlayer]:
        """One player for the branches that honour Retry-After, one for those that retry after 1 s."""
        s = self.setup.scenario
        honouring, fixed = split_by_branch(plan, s.honour_retry_after, s.seed)
        players = [
            TrafficPlayer(
                stack.api_url,
                stack.branch_key,
                part,
                self.setup.policy,
                PlayerSettings(
                    retry=retry,
                    drain_timeout_s=s.drain_timeout_s,
                    run_tag=f"{stack.queue_name}-{retry.mode}",
                    client="openai" if s.client == "openai" else "tickets",
                ),
                seed=s.seed,
            )
            for part, retry in (
                (honouring, RetryPolicy(mode="retry-after", max_attempts=s.max_attempts)),
                (fixed, RetryPolicy(mode="fixed", fixed_delay_s=1.0, max_attempts=s.max_attempts)),
            )
            if part
        ]
        return players

    def baseline(self, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        self.setup.progress(
            f"fifo: {s.gpus} simulator(s) in {s.oom_mode} mode behind a Redis LIST with "
            f"{s.baseline_concurrency} consumers per GPU, no admission control"
        )
        with ExitStack() as cleanup:
            sims = start_simulators(s.sim_settings(), s.gpus, self.setup.results_dir / "fifo", "sim")
            for child, _ in sims:
                cleanup.callback(child.stop, 5.0)
            urls = [url for _, url in sims]
            player = BaselinePlayer(
                self.setup.redis_url,
                urls,
                plan,
                self.setup.policy,
                concurrency=s.baseline_concurrency,
                settings=SeedClientSettings(
                    answer_timeout_s=s.answer_timeout_s,
                    max_attempts=s.max_attempts,
                    drain_timeout_s=s.drain_timeout_s,
                ),
                model=served_model(urls[0]),
                seed=s.seed,
            )

            def probe() -> SystemState:
                return SystemState(player.depth(), player.inflight(), None)

            before = read_counters(urls)
            timeline = Timeline(probe, urls, s.sample_interval_s)
            cpu = CpuMeter(
                {child.name: child.pid for child, _ in sims if child.pid} | {"harness": os.getpid()}
            )
            t0 = time.monotonic()
            timeline.start(t0)
            cpu.start()
            player.start()
            try:
                watch(self.setup.progress, "fifo", timeline, lambda: player.wait(0), t0)
            finally:
                player.stop()
                samples = timeline.stop()
                cores = cpu.stop()
                after = read_counters(urls)
                for child, _ in sims:  # in-hand requests fail at once instead of running on
                    child.stop(5.0)
                player.close()
        records = list(player.records)
        outcomes: dict[str, dict[str, int]] = {
            t: dict.fromkeys(("submitted", *OUTCOMES), 0) for t in self.setup.types
        }
        for (ticket_type, outcome), count in player.submission_outcomes.items():
            outcomes[ticket_type][outcome] += count
        for record in records:
            outcomes[record.type]["submitted"] += record.submissions
        books = Books.from_ledger(Ledger("clients", outcomes), records)
        tokens = {index: prompt + completion for index, (prompt, completion) in player.usage.items()}
        notes = [f"{player.baseline.requests_sent} requests sent to the model servers"]
        return SystemRun(
            "fifo",
            records,
            samples,
            player.started_at,
            tokens,
            books,
            after.since(before),
            cores,
            notes,
            shed_codes={t: unanswered_codes([r for r in records if r.type == t]) for t in self.setup.types},
        )


def unanswered_codes(records: Sequence[TicketRecord]) -> dict[str, int]:
    """Requests that ended without an answer by their final outcome (expired, failed, cancelled)."""
    counts: dict[str, int] = {}
    for record in records:
        if record.outcome in ("expired", "failed", "cancelled"):
            counts[record.outcome] = counts.get(record.outcome, 0) + 1
    return counts


def watch(
    progress: Callable[[str], None], name: str, timeline: Timeline, finished: Callable[[], bool], t0: float
) -> None:
    """Wait for `finished`, printing the last sample every `PROGRESS_EVERY_S` seconds."""
    next_line = PROGRESS_EVERY_S
    while not finished():
        time.sleep(0.5)
        elapsed = time.monotonic() - t0
        if elapsed >= next_line and timeline.samples:
            last = timeline.samples[-1]
            level = "-" if last.alarm_level is None else AlarmLevel(last.alarm_level).label
            progress(
                f"{name} {elapsed:5.0f} s: queued {last.depth}, in flight {last.inflight}, alarm {level}, "
                f"KV {last.kv_usage_max if last.kv_usage_max is not None else '-'}, "
                f"OOM crashes {last.oom_crashes}" + (f", bound by {last.bound}" if last.bound else "")
            )
            next_line += PROGRESS_EVERY_S


def read_counters(urls: Sequence[str]) -> SimCounters:
    counters = sum_counters(urls)
    if counters is None:
        raise OverloadError(f"cannot read the simulators' /metrics at {', '.join(urls)}")
    return counters
