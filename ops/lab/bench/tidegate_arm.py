"""The tidegate arm of the overload bench: its real processes and its branches, called the way
`--client` says.

The stack is the simulators in the memory setting's mode, one worker per GPU, the monitor and the API,
on a queue of its own. Its branches call it either way:

- `tickets` (the default): `POST /v1/tickets`, then poll, by `TrafficPlayer` (one player for the branches
  that honour Retry-After, one for those that retry after 1 s);
- `openai`: one streamed `POST /v1/completions` per submission through its OpenAI front door, the branch
  key as the API key and the ticket type in the body's `tidegate` object, by `OpenLoopPlayer`, the
  asyncio open loop every OpenAI-speaking arm is played by.

Either way its books are Redis's outcome counters against the branches' own, and must agree.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from redis import Redis

from ops.lab.bench.cpu import CpuMeter
from ops.lab.bench.figures import Books, record_send_lags, send_lag_figures
from ops.lab.bench.open_loop import OpenLoopPlayer, OpenLoopSettings, RequestShape
from ops.lab.bench.redis_memory import MemoryWatch, memory_figures
from ops.lab.bench.scenario import split_by_branch
from ops.lab.bench.systems import (
    HARNESS,
    OverloadSetup,
    SystemRun,
    read_counters,
    surge_cores,
    surge_meter,
    unanswered_codes,
    watch,
)
from ops.lab.bench.timeline import SystemState, Timeline
from ops.lab.demo.run import delete_queue_keys, rq_key_prefix
from ops.lab.stack.stack import Stack, StackConfig, WorkerSettings
from ops.lab.traffic.accounting import AccountingCheck, check_accounting
from ops.lab.traffic.player import PlayerSettings, RetryPolicy, TrafficPlayer
from ops.lab.traffic.records import OUTCOMES, TicketRecord
from ops.lab.traffic.timeseries import events_trimmed_after, read_alarm_changes, take_sample
from ops.lab.traffic.workload import PlannedArrival
from shared.live_workers import read_live_workers
from shared.policy import AlarmLevel
from shared.queue import TicketQueue

SERVED_MODEL = "tidegate"
"""The front door's alias for whatever its workers serve."""
SETTLE_S = 10.0
"""How long Redis's books may take to close the tickets the branches left as the run ended."""


def tidegate_fields(arrival: PlannedArrival) -> dict[str, Any]:
    """The front door's `tidegate` body object: the ticket type and its factors."""
    body = arrival.body()
    return {k: body[k] for k in ("type", "urgent_level", "vip_level", "is_bulk") if k in body}


def front_door_shape(api_url: str, keys: Mapping[str, str]) -> RequestShape:
    """A branch's call to tidegate's OpenAI front door: its key as the API key, the ticket type and
    factors in the body's `tidegate` object; `keys` maps every branch of the plan to its key."""

    def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
        ticket = arrival.body()
        body = {
            "model": SERVED_MODEL,
            "prompt": ticket["prompt"],
            "max_tokens": ticket["max_tokens"],
            "tidegate": tidegate_fields(arrival),
        }
        return api_url, body, {"Authorization": f"Bearer {keys[arrival.branch_id]}"}

    return shape


class _Branches(Protocol):
    """tidegate's branches, whichever client they use."""

    client: str

    def start(self) -> float: ...
    def finished(self) -> bool: ...
    def close(self) -> None: ...
    def records(self) -> list[TicketRecord]: ...
    def check(self, counts: Mapping[str, int], types: Sequence[str]) -> AccountingCheck: ...
    def tokens(self, queue: TicketQueue, records: Sequence[TicketRecord]) -> dict[int, int]: ...
    def shed_codes(
        self, records: Sequence[TicketRecord], types: Sequence[str]
    ) -> dict[str, dict[str, int]]: ...
    def send_lag(self, records: Sequence[TicketRecord]) -> dict[str, float | None]: ...
    def notes(self) -> list[str]: ...


class TidegateRunner:
    """Runs the plan against a fresh tidegate stack with the run's scenario, Redis and results folder."""

    def __init__(self, setup: OverloadSetup) -> None:
        self.setup = setup

    def run(self, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        queue_name = f"bench-overload-{time.strftime('%H%M%S')}-{secrets.token_hex(3)}"
        config = StackConfig(
            redis_url=self.setup.redis_url,
            queue_name=queue_name,
            run_dir=self.setup.results_dir / "tidegate",
            gpus=s.gpus,
            sim=s.sim_settings(),
            worker=WorkerSettings(extra_args=s.worker_args),
            ablate=s.ablate,
            env={"RQ_KEY_PREFIX": rq_key_prefix(queue_name)},  # rq's keys go with the queue's at the end
        )
        self.setup.progress(
            f"tidegate: starting {s.gpus} simulator(s) in {s.oom_mode} mode, worker(s), monitor, API; "
            f"branches call it with the {s.client} client"
        )
        try:
            with Stack(config) as stack:
                return self._play(stack, plan)
        finally:
            if self.setup.redis_shared:
                client = Redis.from_url(self.setup.redis_url)
                try:
                    delete_queue_keys(client, queue_name)
                finally:
                    client.close()

    def _play(self, stack: Stack, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        for branch in sorted({a.branch_id for a in plan}):
            stack.branch_key(branch)
        queue = TicketQueue(stack.redis, self.setup.policy, stack.queue_name)
        counts_before = queue.stats().counts
        branches: _Branches = (
            _StreamedBranches(self.setup, stack, plan)
            if s.client == "openai"
            else _TicketBranches(self.setup, stack, plan)
        )

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
            {child.name: child.pid for child in stack.children if child.pid} | {HARNESS: os.getpid()}
        )
        surge = surge_meter(s)
        memory = MemoryWatch(stack.redis)
        t0, wall_t0 = time.monotonic(), time.time()
        timeline.start(t0)
        cpu.start()
        surge.start()
        memory.start()
        started_at = branches.start()
        watch(self.setup.progress, "tidegate", timeline, branches.finished, t0)
        branches.close()
        samples = timeline.stop()
        cores = cpu.stop() | surge_cores(surge)
        memory.stop()
        after = read_counters(stack.vllm_urls)
        records = branches.records()
        redis_memory = memory_figures(memory, stack.redis, queue.keys, records)
        counts = _settled_counts(queue, counts_before, self.setup.types)
        check = branches.check(counts, self.setup.types)
        alarms, _ = read_alarm_changes(stack.redis, queue.keys, "-", wall_t0)
        alarms_complete = not events_trimmed_after(stack.redis, queue.keys, "-")
        return SystemRun(
            "tidegate",
            records,
            samples,
            started_at,
            branches.tokens(queue, records),
            Books.from_check(check),
            after.since(before),
            cores,
            branches.notes(),
            redis_memory,
            shed_codes=branches.shed_codes(records, self.setup.types),
            client=branches.client,
            send_lag=branches.send_lag(records),
            alarms=alarms,
            alarms_complete=alarms_complete,
        )


def _settled_counts(queue: TicketQueue, before: Mapping[str, int], types: Sequence[str]) -> dict[str, int]:
    """The run's outcome counters, once every ticket it submitted has ended (or after `SETTLE_S`): a
    stream closed as the run ended is cancelled by the API a moment later."""

    def counts() -> dict[str, int]:
        now = queue.stats().counts
        return {k: v - before.get(k, 0) for k, v in now.items()}

    deadline = time.monotonic() + SETTLE_S
    while True:
        seen = counts()
        ended = all(
            sum(seen.get(f"{t}:{o}", 0) for o in OUTCOMES) == seen.get(f"{t}:submitted", 0) for t in types
        )
        if ended or time.monotonic() >= deadline:
            return seen
        time.sleep(0.1)


class _TicketBranches:
    """`--client tickets`: one `TrafficPlayer` per retry rule, submitting and polling over HTTP."""

    client = "tickets"

    def __init__(self, setup: OverloadSetup, stack: Stack, plan: Sequence[PlannedArrival]) -> None:
        s = setup.scenario
        honouring, fixed = split_by_branch(plan, s.honour_retry_after, s.seed)
        self.players = [
            TrafficPlayer(
                stack.api_url,
                stack.branch_key,
                part,
                setup.policy,
                PlayerSettings(
                    retry=retry, drain_timeout_s=s.drain_timeout_s, run_tag=f"{stack.queue_name}-{retry.mode}"
                ),
                seed=s.seed,
            )
            for part, retry in (
                (honouring, RetryPolicy(mode="retry-after", max_attempts=s.max_attempts)),
                (fixed, RetryPolicy(mode="fixed", fixed_delay_s=1.0, max_attempts=s.max_attempts)),
            )
            if part
        ]

    def start(self) -> float:
        for player in self.players:
            player.start()
        return min(player.started_at for player in self.players)

    def finished(self) -> bool:
        return all(player.wait(0) for player in self.players)

    def close(self) -> None:
        for player in self.players:
            player.close()

    def records(self) -> list[TicketRecord]:
        return sorted((r for p in self.players for r in p.snapshot()), key=lambda r: r.index)

    def check(self, counts: Mapping[str, int], types: Sequence[str]) -> AccountingCheck:
        return check_accounting(counts, self.records(), types)

    def tokens(self, queue: TicketQueue, records: Sequence[TicketRecord]) -> dict[int, int]:
        done = [r for r in records if r.outcome == "done" and r.ticket_id]
        tokens: dict[int, int] = {}
        for record, ticket in zip(done, queue.get_many([r.ticket_id or "" for r in done]), strict=True):
            usage = ticket.usage if ticket is not None else None
            if usage:
                tokens[record.index] = int(usage.get("prompt_tokens", 0)) + int(
                    usage.get("completion_tokens", 0)
                )
        return tokens

    def shed_codes(self, records: Sequence[TicketRecord], types: Sequence[str]) -> dict[str, dict[str, int]]:
        return {
            t: {"429/degraded": sum(r.rejections for r in records if r.type == t)}
            | unanswered_codes([r for r in records if r.type == t])
            for t in types
        }

    def send_lag(self, records: Sequence[TicketRecord]) -> dict[str, float | None]:
        lags = [lag for p in self.players for lag in record_send_lags(p.snapshot(), p.started_at)]
        return send_lag_figures(lags)

    def notes(self) -> list[str]:
        notes = [
            "branches called tidegate with the tickets client (a thread pool per retry rule; send lag "
            "from each request's first send)",
            f"{sum(p.cancelled_leftovers for p in self.players)} tickets still open after the drain were cancelled",
        ]
        for player in self.players:
            mine = player.snapshot()
            notes.append(
                f"branches retrying {player.settings.retry.mode}: {len(mine)} requests, "
                f"{sum(r.rejections for r in mine)} answered 429, {sum(r.retries for r in mine)} retries, "
                f"{sum(1 for r in mine if r.outcome == 'rejected')} gave up"
            )
        return notes


class _StreamedBranches:
    """`--client openai`: every request streamed through the front door from one asyncio open loop."""

    client = "openai"

    def __init__(self, setup: OverloadSetup, stack: Stack, plan: Sequence[PlannedArrival]) -> None:
        s = setup.scenario
        honouring, _ = split_by_branch(plan, s.honour_retry_after, s.seed)
        keys = {branch: stack.branch_key(branch) for branch in sorted({a.branch_id for a in plan})}
        settings = OpenLoopSettings(
            honouring=frozenset(a.branch_id for a in honouring),
            max_attempts=s.max_attempts,
            drain_timeout_s=s.drain_timeout_s,
            stream=True,
            tickets=True,
        )
        self.player = OpenLoopPlayer(plan, setup.policy, front_door_shape(stack.api_url, keys), settings)

    def start(self) -> float:
        self.player.start()
        return self.player.started_at

    def finished(self) -> bool:
        return self.player.wait(0)

    def close(self) -> None:
        self.player.close()

    def records(self) -> list[TicketRecord]:
        return sorted(self.player.records.values(), key=lambda r: r.index)

    def check(self, counts: Mapping[str, int], types: Sequence[str]) -> AccountingCheck:
        return check_accounting(counts, self.records(), types, self.player.ledger(types))

    def tokens(self, queue: TicketQueue, records: Sequence[TicketRecord]) -> dict[int, int]:
        return dict(self.player.usage)

    def shed_codes(self, records: Sequence[TicketRecord], types: Sequence[str]) -> dict[str, dict[str, int]]:
        return self.player.shed_by_type(types)

    def send_lag(self, records: Sequence[TicketRecord]) -> dict[str, float | None]:
        return self.player.send_lag()

    def notes(self) -> list[str]:
        records = self.records()
        return [
            "branches called tidegate's OpenAI front door, streamed, from one asyncio open loop",
            f"{self.player.cancelled_leftovers} tickets still open after the drain were cancelled",
            f"{sum(r.submissions for r in records)} submissions, {sum(r.rejections for r in records)} shed "
            f"(429 or degraded), {sum(r.retries for r in records)} retries, "
            f"{sum(1 for r in records if r.outcome == 'rejected')} gave up",
        ]
