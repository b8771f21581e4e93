"""What every arm of the overload bench shares (its setup, its `SystemRun`, simulators, progress),
and the seed's FIFO baseline arm (tidegate's arm is in `tidegate_arm.py`, the peers' in `peer_runs.py`).

Each run starts its own simulators in the memory setting's mode (crash-on-OOM when tight), plays the
plan, samples a timeline, meters CPU, reads the simulators' counters before and after, and closes its
books; what comes back is a `SystemRun`, the raw material of the figures. Whatever happens, the
processes it started are stopped and, on a Redis shared with others, the keys it created are deleted.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ops.lab.bench.baseline_player import BaselinePlayer, SeedClientSettings
from ops.lab.bench.cpu import CpuMeter, WindowCpu
from ops.lab.bench.figures import Books, record_send_lags, send_lag_figures
from ops.lab.bench.scenario import OverloadScenario
from ops.lab.bench.sim_probe import SimCounters, served_model
from ops.lab.bench.timeline import Sample, SystemState, Timeline, sum_counters
from ops.lab.procs.children import ChildProcess, child_env
from ops.lab.procs.ports import free_port, http_ok
from ops.lab.stack.stack import SimSettings, tidegate_command
from ops.lab.traffic.accounting import Ledger
from ops.lab.traffic.records import OUTCOMES, TicketRecord
from ops.lab.traffic.timeseries import AlarmChange
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import AlarmLevel, Policy

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
    client: str = ""
    """How its branches called it (a key of `ARM_CLIENTS`)."""
    send_lag: dict[str, float | None] = field(default_factory=dict)
    """How late the branches' sends were against the plan: with the harness's CPU in `cpu_cores`, it
    shows whether the load generator, not the system, set the figures."""
    alarms: list[AlarmChange] | None = None
    """The monitor's alarm transitions, oldest first; None for a system without alarms."""
    alarms_complete: bool = True
    """False when the capped event stream dropped some of the run's transitions."""

    def harness(self) -> dict[str, object]:
        """The load generator's own figures, for results.json."""
        return {
            "client": self.client,
            "send_lag": self.send_lag,
            "cpu_cores": self.cpu_cores.get(HARNESS),
            "cpu_cores_in_surge": self.cpu_cores.get(HARNESS_IN_SURGE),
        }


HARNESS, HARNESS_IN_SURGE = "harness", "harness_in_surge"
"""The bench process's names in `cpu_cores`: over the whole arm, and in the surge's plateau alone."""


def surge_meter(scenario: OverloadScenario) -> WindowCpu:
    """The harness's CPU in the surge's plateau, started with the arm's players."""
    return WindowCpu(os.getpid(), scenario.surge_window())


def surge_cores(meter: WindowCpu) -> dict[str, float]:
    cores = meter.stop()
    return {} if cores is None else {HARNESS_IN_SURGE: cores}


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
    """Runs the plan against the FIFO baseline with the run's scenario, Redis and results folder."""

    def __init__(self, setup: OverloadSetup) -> None:
        self.setup = setup

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
            cpu = CpuMeter({child.name: child.pid for child, _ in sims if child.pid} | {HARNESS: os.getpid()})
            surge = surge_meter(s)
            t0 = time.monotonic()
            timeline.start(t0)
            cpu.start()
            surge.start()
            player.start()
            try:
                watch(self.setup.progress, "fifo", timeline, lambda: player.wait(0), t0)
            finally:
                player.stop()
                samples = timeline.stop()
                cores = cpu.stop() | surge_cores(surge)
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
        if s.client == "openai":
            notes.append(
                "the FIFO baseline has no OpenAI door: its branches are the seed's own clients, not streamed"
            )
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
            client="seed",
            send_lag=send_lag_figures(record_send_lags(records, player.started_at)),
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
