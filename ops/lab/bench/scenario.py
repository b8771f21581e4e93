"""The overload scenario: load shape, workload, simulated hardware and client behaviour of one run.

A scenario is plain data, so a run is defined by its flags and seed alone and can be repeated; the
defaults are the scenario ops/lab/bench/RESULTS.md reports.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ops.lab.stack.stack import SimSettings
from ops.lab.traffic.workload import DEFAULT_MIX, LoadPoint, LoadProfile, PlannedArrival, WorkloadSpec

MAX_MODEL_LEN = 16_896
"""Context of the simulated model: the workload's 16k-token tail plus its longest answer fits."""
SYSTEMS = ("tidegate", "fifo", "engine", "smg", "litellm")
"""The arms `--system` accepts: tidegate, the seed's FIFO, the engine's own priority scheduling, SMG,
the LiteLLM proxy."""
MEMORY_SETTINGS = ("tight", "ample")
"""tight: `kv_blocks` in crash-on-OOM mode (a gateway blind to KV memory can crash the engine);
ample: the KV cache the simulated GPU's profile sizes as vLLM does, in preempt mode as vLLM runs, so
no arm can crash it."""
RAMP_START, PLATEAU_END = 0.22, 0.62
"""Fractions of the run where the surge begins and where its plateau ends (the built-in shape)."""
STEP_S = 0.001
"""A step is a ramp this short: the load profile's points must rise strictly."""


@dataclass(frozen=True)
class OverloadScenario:
    """Everything that defines a run; the defaults are the scenario RESULTS.md reports."""

    duration_s: float = 240.0
    normal_load: float = 0.6
    surge_load: float = 2.5
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    branches: int = 200
    seed: int = 7
    gpus: int = 1
    time_scale: float = 4.0
    """The simulated GPU runs this many times faster than real time: a faster GPU, in wall seconds."""
    kv_blocks: int = 2000
    max_num_seqs: int = 32
    """Sequences a simulated GPU runs at once: tidegate's worker batch, so the engine arm, SMG's slots and
    tidegate's worker all have the same batch (the profile's 256 let the engine arm alone run wider)."""
    """KV-cache blocks per GPU (16 tokens each): small enough that the 16k-token tail can fill it."""
    oom_recovery_s: float = 90.0
    """Model seconds a simulated GPU needs to restart after an OOM crash."""
    baseline_concurrency: int = 24
    """The seed's fixed in-flight requests per GPU: enough to keep the GPU on its throughput plateau
    at normal load, with no regard for how much KV cache the requests in flight will need."""
    honour_retry_after: float = 0.5
    """Share of branches whose client waits as long as Retry-After says; the others retry after 1 s."""
    max_attempts: int = 5
    drain_timeout_s: float = 60.0
    answer_timeout_s: float = 30.0
    """How long a seed client waits for one answer before it sends the request again."""
    capacity_points: int = 4
    capacity_warmup_s: float = 3.0
    capacity_window_s: float = 8.0
    sample_interval_s: float = 0.5
    client: str = "tickets"
    """How tidegate's branches call it: `tickets` (submit and poll) or `openai` (streamed completions)."""
    worker_args: tuple[str, ...] = ()
    """Extra `tidegate worker` flags (`--no-preemption`, ...), for an ablation run."""
    ablate: tuple[str, ...] = ()
    """Worker mechanisms without a product setting taken out (ops/lab/bench/ablation.py)."""
    systems: tuple[str, ...] = ("tidegate", "fifo")
    """The arms to run, one after another, each on fresh simulators (names from `SYSTEMS`)."""
    ramp_s: float | None = None
    """Seconds from normal load to the surge (and back); 0 is a step; None: 5% of the run (12 s in 240)."""
    memory: str = "tight"
    """A name from `MEMORY_SETTINGS`."""
    peer_slots: int | None = None
    """Requests a peer gateway sends one GPU at once (SMG's `max_running_requests`, LiteLLM's
    `max_parallel_requests`); None: tidegate's worker batch. A peer blind to KV memory may need
    fewer than the batch to keep a tight GPU alive, so its best setting is searched, not assumed."""

    def __post_init__(self) -> None:
        checks = {
            "--duration": (self.duration_s >= 10, self.duration_s, "at least 10 seconds"),
            "--surge": (0 < self.surge_load <= 20, self.surge_load, "more than 0 and at most 20"),
            "--normal": (
                0 < self.normal_load <= self.surge_load,
                self.normal_load,
                "above 0, at most --surge",
            ),
            "--branches": (1 <= self.branches <= 10_000, self.branches, "1 to 10000"),
            "--gpus": (1 <= self.gpus <= 8, self.gpus, "1 to 8"),
            "--time-scale": (self.time_scale > 0, self.time_scale, "more than 0"),
            "--kv-blocks": (
                self.kv_blocks * 16 >= MAX_MODEL_LEN,
                self.kv_blocks,
                "at least 1056 (16k tokens)",
            ),
            "--baseline-concurrency": (
                self.baseline_concurrency >= 1,
                self.baseline_concurrency,
                "at least 1",
            ),
            "--honour-retry-after": (
                0 <= self.honour_retry_after <= 1,
                self.honour_retry_after,
                "a fraction from 0 to 1",
            ),
            "--drain-timeout": (self.drain_timeout_s >= 0, self.drain_timeout_s, "0 or more seconds"),
            "--client": (self.client in ("tickets", "openai"), self.client, "tickets or openai"),
            "--system": (
                bool(self.systems)
                and set(self.systems) <= set(SYSTEMS)
                and len(set(self.systems)) == len(self.systems),
                ",".join(self.systems),
                f"a comma-separated list of distinct names from {', '.join(SYSTEMS)}",
            ),
            "--ramp": (
                self.ramp_s is None or 0 <= self.ramp_s < (PLATEAU_END - RAMP_START) * self.duration_s,
                self.ramp_s,
                f"0 (a step) or more seconds, below {PLATEAU_END - RAMP_START:.0%} of --duration",
            ),
            "--memory": (self.memory in MEMORY_SETTINGS, self.memory, " or ".join(MEMORY_SETTINGS)),
            "--max-num-seqs": (1 <= self.max_num_seqs <= 1024, self.max_num_seqs, "1 to 1024"),
            "--peer-slots": (
                self.peer_slots is None or 1 <= self.peer_slots <= 1024,
                self.peer_slots,
                "1 to 1024",
            ),
        }
        for flag, (ok, value, accepted) in checks.items():
            if not ok:
                raise ValueError(f"{flag}={value} is not accepted; use {accepted}")

    @classmethod
    def quick(cls, **overrides: Any) -> OverloadScenario:
        """The CI size: the same shape in a 30-second surge, shorter drain and capacity phase."""
        sizes: dict[str, Any] = {
            "duration_s": 30.0,
            "drain_timeout_s": 10.0,
            "capacity_points": 1,
            "capacity_warmup_s": 1.5,
            "capacity_window_s": 5.0,
        }
        return cls(**(sizes | overrides))

    @property
    def oom_mode(self) -> str:
        """What the systems' simulators do when the KV cache runs out: crash (tight) or preempt (ample)."""
        return "crash" if self.memory == "tight" else "preempt"

    def sim_settings(self, oom_mode: str | None = None, scheduling_policy: str = "fcfs") -> SimSettings:
        """The simulator flags of this run; `oom_mode` None is the memory setting's own mode."""
        return SimSettings(
            time_scale=self.time_scale,
            kv_blocks=self.kv_blocks if self.memory == "tight" else ample_kv_blocks(),
            max_num_seqs=self.max_num_seqs,
            oom_mode=oom_mode or self.oom_mode,
            oom_recovery_s=self.oom_recovery_s,
            scheduling_policy=scheduling_policy,
            seed=self.seed,
        )

    def profile(self) -> LoadProfile:
        if self.ramp_s is None:
            return LoadProfile.surge(self.duration_s, self.surge_load, self.normal_load)
        d, ramp = self.duration_s, max(self.ramp_s, STEP_S)
        marks = (0.0, RAMP_START * d, RAMP_START * d + ramp, PLATEAU_END * d, PLATEAU_END * d + ramp, d)
        loads = (self.normal_load, self.normal_load, self.surge_load, self.surge_load, self.normal_load)
        points = [LoadPoint(at, load) for at, load in zip(marks, (*loads, self.normal_load), strict=True)]
        return LoadProfile(tuple(points))

    def workload(self, capacity_tickets_per_s: float) -> WorkloadSpec:
        return WorkloadSpec(
            profile=self.profile(),
            capacity_tickets_per_s=capacity_tickets_per_s,
            branches=self.branches,
            mix=dict(self.mix),
            seed=self.seed,
        )

    def surge_window(self) -> tuple[float, float]:
        """Seconds from the start where the offered load sits at its peak (the plateau)."""
        profile = self.profile()
        at_peak = [point.at for point in profile.points if point.load == profile.peak]
        return at_peak[0], at_peak[-1]


def ample_kv_blocks() -> int:
    """The simulated GPU's own KV cache, sized as vLLM sizes it (not every block that would fit: a
    KV cache that fills the GPU leaves tidegate's worker no free memory to size its batch by)."""
    return SimSettings().config().kv_blocks


def split_by_branch(
    plan: Sequence[PlannedArrival], fraction: float, seed: int
) -> tuple[list[PlannedArrival], list[PlannedArrival]]:
    """(branches that honour Retry-After, the others): a seeded choice per branch, not per ticket."""
    rng = random.Random(f"{seed}:honour-retry-after")
    branches = sorted({a.branch_id for a in plan})
    honouring = {branch for branch in branches if rng.random() < fraction}
    return [a for a in plan if a.branch_id in honouring], [a for a in plan if a.branch_id not in honouring]
