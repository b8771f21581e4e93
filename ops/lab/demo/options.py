"""What a demo run is asked to do (the `tidegate demo` flags, checked) and the workload it plays."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ops.lab.embedded_redis import Embedded
from ops.lab.stack.stack import Engine
from ops.lab.traffic.player import RetryMode
from ops.lab.traffic.workload import LoadProfile, WorkloadSpec

DEFAULT_DURATION_S = 75.0
"""With start-up, the backlog's drain and shutdown, about 95 s: all of it well inside two minutes."""


@dataclass(frozen=True)
class DemoOptions:
    duration: float = DEFAULT_DURATION_S
    surge: float = 2.5
    normal: float = 0.6
    branches: int = 200
    gpus: int = 2
    live: bool = True
    seed: int = 7
    engine: Engine = "sim"
    keep_running: bool = False
    redis_url: str | None = None
    embedded: Embedded = "auto"
    run_dir: Path | None = None
    retry: RetryMode = "retry-after"
    max_attempts: int = 5
    time_scale: float = 4.0
    """Simulated GPU speed: at 4 a loan answer at normal load takes what the seed's production saw
    (P99 1.2 s, calibrated in ops/lab/bench/RESULTS.md); at 1 the simulated A100 is 4× slower than that."""
    drain_timeout: float = 45.0
    capacity: float | None = None
    """Tickets/s that 100% load means; None: estimated (simulator) or measured (vLLM-CPU)."""
    policy_file: str | None = None
    max_batch: int = 32
    """What the workers run with (TIDEGATE_MAX_BATCH), for the capacity estimate."""
    safety_margin: float = 0.15
    json_output: bool = False

    def __post_init__(self) -> None:
        checks = [
            ("--duration", self.duration, self.duration >= 5, "at least 5 seconds"),
            ("--surge", self.surge, 0 < self.surge <= 20, "more than 0 and at most 20"),
            ("--normal", self.normal, 0 <= self.normal <= 20, "0 to 20"),
            ("--branches", self.branches, 1 <= self.branches <= 10_000, "1 to 10000"),
            ("--gpus", self.gpus, 1 <= self.gpus <= 16, "1 to 16"),
            ("--time-scale", self.time_scale, self.time_scale > 0, "more than 0"),
            ("--drain-timeout", self.drain_timeout, self.drain_timeout >= 0, "0 or more"),
            ("--max-attempts", self.max_attempts, self.max_attempts >= 1, "at least 1"),
            (
                "--capacity",
                self.capacity,
                self.capacity is None or self.capacity > 0,
                "more than 0 tickets/s",
            ),
        ]
        for flag, value, ok, accepted in checks:
            if not ok:
                raise ValueError(f"{flag}={value} is not accepted; use {accepted}")
        if self.engine == "vllm-cpu" and self.gpus != 1:
            raise ValueError(
                f"--gpus={self.gpus} is not accepted with --engine vllm-cpu; it serves one device"
            )


def workload(options: DemoOptions, capacity: float) -> WorkloadSpec:
    """The seed mix on the simulator; short prompts and answers on vLLM-CPU's 2k-token test model."""
    profile = LoadProfile.surge(options.duration, options.surge, options.normal)
    spec = WorkloadSpec(
        profile=profile, capacity_tickets_per_s=capacity, branches=options.branches, seed=options.seed
    )
    if options.engine == "vllm-cpu":
        spec = dataclasses.replace(
            spec,
            prompt_tokens=120,
            tail_min_tokens=400,
            tail_max_tokens=1200,
            max_tokens={
                "loan_approval": ((16, 0.5), (32, 0.5)),
                "complaint": ((32, 1.0),),
                "archive_query": ((64, 1.0),),
            },
        )
    return spec
