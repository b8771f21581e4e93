"""How many workers the queue needs: the yellow alarm's scale-out signal."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ScalingConfig:
    target_drain_seconds: float = 30.0
    """The backlog should be gone within this long."""
    assumed_worker_rate: float = 0.5
    """Tickets per second one worker finishes, used until a drain rate has been measured."""
    min_workers: int = 1
    max_workers: int = 64

    def __post_init__(self) -> None:
        if self.target_drain_seconds <= 0:
            raise ValueError(f"target_drain_seconds must be > 0, got {self.target_drain_seconds}")
        if self.assumed_worker_rate <= 0:
            raise ValueError(f"assumed_worker_rate must be > 0, got {self.assumed_worker_rate}")
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"need 0 <= min_workers <= max_workers, got min {self.min_workers}, max {self.max_workers}"
            )


def desired_workers(
    depth: int, drain_rate: float, arrival_rate: float, workers_alive: int, config: ScalingConfig
) -> int:
    """Workers needed to clear the backlog within the target while new tickets keep arriving.

        needed rate = depth / target_drain_seconds + arrival_rate          (tickets/s)
        per worker  = drain_rate / workers_alive, once both are measured,
                      else assumed_worker_rate
        desired     = ceil(needed rate / per worker), within [min_workers, max_workers]

    The per-worker rate is measured rather than configured because it depends on the model, the GPU
    and the prompt mix, which change more often than this file does.
    """
    per_worker = drain_rate / workers_alive if drain_rate > 0 and workers_alive > 0 else 0.0
    if per_worker <= 0:
        per_worker = config.assumed_worker_rate
    needed_rate = depth / config.target_drain_seconds + max(arrival_rate, 0.0)
    wanted = math.ceil(round(needed_rate / per_worker, 6))
    return min(max(wanted, config.min_workers), config.max_workers)
