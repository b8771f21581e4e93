"""Measure capacity with a short burst, for engines whose speed no formula predicts (vLLM-CPU).

The burst goes straight into the queue (no HTTP), sized by the workload's own ticket mix, and the
rate is the burst divided by the time from its first claim to its last finish, read from the
tickets' own timestamps. The counts it adds to Redis are subtracted by the run's recorder baseline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis import Redis

from ops.lab.traffic.prompts import prompt_text
from ops.lab.traffic.workload import WorkloadSpec, sample_tickets
from shared.models import TicketRequest
from shared.policy import Policy
from shared.queue import TicketQueue

CALIBRATION_BRANCH = "calibration"


class CalibrationError(RuntimeError):
    """The burst did not finish in time, or finished without any ticket done."""


@dataclass(frozen=True)
class Calibration:
    tickets_per_s: float
    tickets: int
    seconds: float

    def describe(self) -> str:
        return f"measured: {self.tickets} tickets in {self.seconds:.1f} s"


def measure_capacity(
    redis: Redis,
    policy: Policy,
    queue_name: str,
    spec: WorkloadSpec,
    tickets: int = 24,
    timeout: float = 180.0,
) -> Calibration:
    queue = TicketQueue(redis, policy, queue_name)
    requests = [
        TicketRequest(
            type=t.type,
            branch_id=CALIBRATION_BRANCH,
            prompt=prompt_text(t.type, CALIBRATION_BRANCH, t.index, t.prompt_tokens),
            max_tokens=t.max_tokens,
            ttl_seconds=timeout,
        )
        for t in sample_tickets(spec, tickets)
    ]
    ids = [result.ticket_id for result in queue.enqueue_many(requests)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [t for t in queue.get_many(ids) if t is not None]
        if len(found) == len(ids) and all(t.status.terminal for t in found):
            done = [t for t in found if t.status.value == "done" and t.started_at and t.finished_at]
            if not done:
                raise CalibrationError(f"none of the {len(ids)} calibration tickets ended done")
            start = min(t.started_at for t in done if t.started_at is not None)
            end = max(t.finished_at for t in done if t.finished_at is not None)
            span = max(end - start, 1e-3)
            return Calibration(len(done) / span, len(done), span)
        time.sleep(0.25)
    raise CalibrationError(f"the {len(ids)} calibration tickets had not ended after {timeout:.0f} s")
