"""`tidegate bench overload`: the seed's burst, played against tidegate and the arms `--system` names.

One run has these parts, on the same machine, with the same seeded workload, one after another:

1. capacity: a preempt-mode simulator with the scenario's flags is driven closed-loop at a few
   concurrencies; its best throughput for the workload's mix is "100%" (see `saturation.py`);
2. tidegate (`tidegate_arm.py`): the real processes (simulators in the memory setting's mode, one
   worker per GPU, the monitor, the API) with 200 branches submitting tickets over HTTP or, with
   `--client openai`, streaming completions through the front door; half of them honour Retry-After,
   half retry after a fixed pause;
3. fifo: the same simulators and workload behind a Redis LIST with a fixed number of consumers
   per GPU and no admission control (`baseline.py`), with branches that resend on errors and timeouts;
4. the peer arms (`peer_runs.py`): the engine's own priority scheduling, SMG, LiteLLM, each on fresh
   simulators with the same flags, their branches whole-answer calls or, with `--client openai`,
   streamed ones from the same asyncio open loop as tidegate's (`open_loop.py`).

Offered load ramps (or steps, `--ramp 0`) from `normal_load` to `surge_load` of capacity and back. Everything is written to
the results folder: `results.json` (figures, timelines, scenario, machine), one `*-tickets.jsonl` per
system and `overload.png`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ops.lab.bench.figures import SystemFigures, goodput_tokens_per_s, system_figures
from ops.lab.bench.machine import describe_machine
from ops.lab.bench.peer_runs import PeerRunner
from ops.lab.bench.plot import PlotSeries, plot_runs
from ops.lab.bench.saturation import Capacity, concurrency_ladder, measure_capacity
from ops.lab.bench.scenario import OverloadScenario
from ops.lab.bench.systems import (
    OverloadError,
    OverloadSetup,
    SystemRun,
    SystemRunner,
    no_progress,
    start_simulators,
)
from ops.lab.bench.tidegate_arm import TidegateRunner
from ops.lab.bench.verdict import run_verdict
from ops.lab.traffic.alarm_path import alarm_path
from ops.lab.traffic.capacity import estimate_capacity
from ops.lab.traffic.workload import PlannedArrival, plan_arrivals, sample_tickets, summarize
from shared.policy import Policy

CAPACITY_SAMPLE_TICKETS = 400


@dataclass(frozen=True)
class OverloadResult:
    scenario: OverloadScenario
    capacity: Capacity
    figures: dict[str, SystemFigures]
    verdict: dict[str, dict[str, bool]]
    results_dir: Path
    document: dict[str, Any]

    @property
    def accounting_holds(self) -> bool:
        return all(figures.books.holds for figures in self.figures.values())


class OverloadBench:
    """One run of the scenario against one Redis, writing into `results_dir`."""

    def __init__(
        self,
        scenario: OverloadScenario,
        redis_url: str,
        policy: Policy,
        results_dir: Path,
        *,
        redis_shared: bool = True,
        progress: Callable[[str], None] = no_progress,
        command: str = "tidegate bench overload",
    ) -> None:
        self.setup = OverloadSetup(
            scenario, redis_url, policy, results_dir, redis_shared=redis_shared, progress=progress
        )
        self.command = command

    # ---- the whole run ----------------------------------------------------------------------
    def run(self) -> OverloadResult:
        self.setup.results_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        machine = describe_machine(self.setup.redis_url)
        capacity = self.measure_capacity()
        s = self.setup.scenario
        if capacity.tickets_per_s <= 0:
            raise OverloadError(
                f"no answer finished in the capacity window ({s.capacity_window_s:g} s at concurrency "
                f"{capacity.concurrency}); raise --time-scale or leave out --quick"
            )
        spec = s.workload(capacity.tickets_per_s * s.gpus)
        plan = plan_arrivals(spec)
        summary = summarize(plan, spec)
        estimate = estimate_capacity(s.sim_settings("crash").config(), spec, gpus=s.gpus, max_batch=32)
        self.setup.progress(
            f"capacity {capacity.tickets_per_s * s.gpus:.1f} tickets/s, {capacity.tokens_per_s * s.gpus:,.0f} "
            f"tokens/s on {s.gpus} GPU(s), measured at concurrency {capacity.concurrency} "
            f"(step-model estimate {estimate.tickets_per_s:.1f} tickets/s); plan: {summary.total} tickets from "
            f"{summary.branches_used} branches over {s.duration_s:.0f} s, load {s.normal_load:.0%} -> "
            f"{s.surge_load:.0%} -> {s.normal_load:.0%}"
        )
        runs = [self._arm(name)(plan) for name in s.systems]
        capacity_tokens = capacity.tokens_per_s * s.gpus
        figures = {run.name: self._figures(run, capacity_tokens) for run in runs}
        verdict = run_verdict(figures, self.setup.types, self.setup.policy, s.memory)
        document = {
            "command": self.command,
            "machine": machine | {"load_average_at_end": describe_machine()["load_average_1_5_15_min"]},
            "scenario": asdict(s),
            "capacity": capacity.to_dict() | {"gpus": s.gpus, "step_model_estimate": estimate.describe()},
            "plan": asdict(summary),
            "surge_window_s": list(s.surge_window()),
            "systems": {name: f.to_dict() for name, f in figures.items()},
            "verdict": verdict,
            "redis_memory": {run.name: run.redis_memory for run in runs if run.redis_memory},
            "harness": {run.name: run.harness() for run in runs},
            "timelines": {run.name: [sample.to_dict() for sample in run.samples] for run in runs},
            "elapsed_s": round(time.monotonic() - began, 1),
        }
        (self.setup.results_dir / "results.json").write_text(json.dumps(document, indent=2, default=str))
        for run in runs:
            with (self.setup.results_dir / f"{run.name}-tickets.jsonl").open("w") as out:
                for record in run.records:
                    out.write(json.dumps(record.to_dict()) + "\n")
        arrivals = _arrivals_per_second(plan, s.duration_s)
        plot_runs(
            [PlotSeries(run.name, run.samples, run.records, run.started_at, arrivals) for run in runs],
            {t: self.setup.policy.type_policy(t).slo_seconds for t in self.setup.types},
            self.setup.results_dir / "overload.png",
        )
        return OverloadResult(s, capacity, figures, verdict, self.setup.results_dir, document)

    def _arm(self, name: str) -> Callable[[Sequence[PlannedArrival]], SystemRun]:
        """The runner of one arm; every arm starts its own simulators with the run's flags."""
        systems, peers = SystemRunner(self.setup), PeerRunner(self.setup)
        arms: dict[str, Callable[[Sequence[PlannedArrival]], SystemRun]] = {
            "tidegate": TidegateRunner(self.setup).run,
            "fifo": systems.baseline,
            "engine": peers.engine,
            "smg": peers.smg,
            "litellm": peers.litellm,
        }
        return arms[name]

    # ---- 1. capacity ------------------------------------------------------------------------
    def measure_capacity(self) -> Capacity:
        s = self.setup.scenario
        template = s.workload(1.0)
        tickets = sample_tickets(template, CAPACITY_SAMPLE_TICKETS)
        config = s.sim_settings("preempt").config()
        mean_tokens = sum(
            t.prompt_tokens + min(t.max_tokens, config.profile.stop_median_tokens) for t in tickets
        )
        ladder = concurrency_ladder(
            config.kv_blocks * config.block_size,
            mean_tokens / len(tickets),
            config.max_num_seqs,
            s.capacity_points,
        )
        self.setup.progress(
            f"measuring capacity: a preempt-mode simulator, closed loop at concurrency {ladder}"
        )
        sims = start_simulators(s.sim_settings("preempt"), 1, self.setup.results_dir / "capacity", "sim")
        try:
            return measure_capacity(
                sims[0][1], tickets, ladder, warmup_s=s.capacity_warmup_s, window_s=s.capacity_window_s
            )
        finally:
            for child, _ in sims:
                child.stop(5.0)

    def _figures(self, run: SystemRun, capacity_tokens_per_s: float) -> SystemFigures:
        start, end = self.setup.scenario.surge_window()
        window = (run.started_at + start, run.started_at + end)
        goodput = goodput_tokens_per_s(run.records, run.tokens_by_index, window)
        slo_goodput = goodput_tokens_per_s(run.records, run.tokens_by_index, window, slo_only=True)
        return system_figures(
            run.name,
            self.setup.types,
            {t: self.setup.policy.type_policy(t).slo_seconds for t in self.setup.types},
            run.records,
            books=run.books,
            oom_crashes=run.sim.oom_crashes,
            preemptions=run.sim.preemptions,
            goodput_tokens_per_s=goodput,
            slo_goodput_tokens_per_s=slo_goodput,
            capacity_tokens_per_s=capacity_tokens_per_s,
            cpu_cores=run.cpu_cores,
            notes=run.notes,
            shed_codes=run.shed_codes,
            client=run.client,
            send_lag=run.send_lag,
            alarm=alarm_path(run.alarms, run.alarms_complete) if run.alarms is not None else None,
            onset_at=start,
        )


def _arrivals_per_second(plan: Sequence[PlannedArrival], duration_s: float) -> list[float]:
    bins = [0.0] * (int(duration_s) + 1)
    for arrival in plan:
        bins[min(int(arrival.at), len(bins) - 1)] += 1
    return bins
