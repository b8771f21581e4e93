"""Play a planned workload against the FIFO baseline as the seed's branch clients did.

A branch queues its request and waits for the answer. An error answer (a crashed GPU's 500 or 503)
makes it send the request again after a short pause; so does waiting longer than its answer timeout,
and the abandoned job stays in the FIFO to be run anyway. It stops trying when the ticket's TTL from
the policy has passed (`expired`) or after `max_attempts` (`failed`): the same lifetime tidegate gives
the ticket, so both systems are held to the same deadline.

Accounting mirrors tidegate's: every job queued is a submission, and each ends `done`, `failed` (an
error answer), `expired` (its branch stopped waiting) or `cancelled` (still open when the run ended).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ops.lab.bench.baseline import BaselineJob, BaselineReply, FifoBaseline
from ops.lab.traffic.records import TicketRecord
from ops.lab.traffic.timetable import Timetable
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy

log = logging.getLogger(__name__)

FinalOutcome = Literal["done", "failed", "expired", "cancelled"]


@dataclass(frozen=True)
class SeedClientSettings:
    """How the seed's branch clients behaved: wait, and send again on an error or a timeout."""

    answer_timeout_s: float = 30.0
    """How long a branch waits for one answer before it sends the request again."""
    retry_delay_s: float = 1.0
    max_attempts: int = 5
    jitter: float = 0.1
    drain_timeout_s: float = 60.0
    """After the last planned arrival, how long open tickets may still finish before the run ends."""

    def __post_init__(self) -> None:
        if self.answer_timeout_s <= 0 or self.retry_delay_s < 0 or self.drain_timeout_s < 0:
            raise ValueError(
                f"answer_timeout_s={self.answer_timeout_s} must be above 0, retry_delay_s="
                f"{self.retry_delay_s} and drain_timeout_s={self.drain_timeout_s} 0 or more"
            )
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts} is not accepted; use at least 1")


@dataclass(frozen=True)
class _Action:
    kind: Literal["submit", "timeout", "deadline"]
    record: TicketRecord
    attempt: int = 1
    job_id: str = ""


@dataclass
class _Waiting:
    job_id: str
    attempt: int


class BaselinePlayer:
    """Sends `plan` through a `FifoBaseline` on a timetable, one record per planned request."""

    def __init__(
        self,
        redis_url: str,
        model_urls: Sequence[str],
        plan: Sequence[PlannedArrival],
        policy: Policy,
        *,
        concurrency: int,
        settings: SeedClientSettings | None = None,
        model: str | None = None,
        seed: int = 0,
    ) -> None:
        self.settings = settings or SeedClientSettings()
        self.policy = policy
        self.plan = list(plan)
        self.baseline = FifoBaseline(
            redis_url, model_urls, self._on_reply, concurrency=concurrency, model=model
        )
        self.records = [TicketRecord.planned(a, policy) for a in self.plan]
        self._arrivals = {a.index: a for a in self.plan}
        self.submission_outcomes: Counter[tuple[str, str]] = Counter()
        """(type, outcome) -> submissions that ended so."""
        self.usage: dict[int, tuple[int, int]] = {}
        """Record index -> (prompt, completion) tokens of its answered request."""
        self._waiting: dict[int, _Waiting] = {}
        self._by_index = {record.index: record for record in self.records}
        self._job_owner: dict[str, int] = {}
        self._rng = random.Random(f"{seed}:seed-clients")
        self._lock = threading.Lock()
        self._timetable: Timetable[_Action] = Timetable()
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._dispatch, name="baseline-dispatcher", daemon=True)
        self._t0 = 0.0
        self.started_at = 0.0

    @property
    def duration(self) -> float:
        return max((a.at for a in self.plan), default=0.0)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0 if self._t0 else 0.0

    def depth(self) -> int:
        return self.baseline.depth()

    def inflight(self) -> int:
        return self.baseline.busy

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.baseline.start()
        self._t0 = time.monotonic()
        self.started_at = time.time()
        for record in self.records:
            self._timetable.push(self._t0 + record.planned_at, _Action("submit", record))
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        self._timetable.wake()

    def close(self, join_timeout: float = 10.0) -> None:
        """Stop the clients and the consumers, and delete the FIFO; stop the model servers first
        so a consumer's request in hand fails fast instead of running to its timeout."""
        self.stop()
        self._thread.join(timeout=5)
        self.baseline.request_stop()
        if not self.baseline.join(join_timeout):
            log.warning("baseline consumers still busy after %.0f s; leaving them to exit", join_timeout)
        self.baseline.cleanup()

    # ---- the dispatcher ------------------------------------------------------------------------
    def _dispatch(self) -> None:
        end = self._t0 + self.duration + self.settings.drain_timeout_s
        while not self._stop.is_set():
            now = time.monotonic()
            for action in self._timetable.pop_due(now):
                self._run(action)
            if all(record.terminal for record in self.records):
                break
            if now >= end:
                self._cancel_open()
                break
            self._timetable.wait(0.2)
        self._finished.set()

    def _run(self, action: _Action) -> None:
        if action.kind == "submit":
            self._submit(action.record, action.attempt)
            return
        with self._lock:
            record = action.record
            waiting = self._waiting.get(record.index)
            if record.terminal:
                return
            if action.kind == "deadline":
                if waiting is not None:
                    self._end_submission(record, "expired")
                self._finish(record, "expired", time.time())
            elif waiting is not None and waiting.job_id == action.job_id:
                self._end_submission(record, "expired")
                self._retry_or_end(record, waiting.attempt, "expired")

    # ---- client behaviour (callers hold the lock, except `_submit`) ------------------------------
    def _submit(self, record: TicketRecord, attempt: int) -> None:
        arrival = self._arrivals[record.index]
        now = time.time()
        job = BaselineJob(
            id=f"{record.request_id}-a{attempt}",
            type=record.type,
            prompt=arrival.body()["prompt"],
            max_tokens=arrival.max_tokens,
            queued_at=now,
        )
        with self._lock:
            if record.terminal:
                return
            if record.first_submit_at is None:
                record.first_submit_at = now
                ttl = self.policy.type_policy(record.type).ttl_seconds
                self._timetable.push(time.monotonic() + ttl, _Action("deadline", record))
            record.submissions += 1
            record.ticket_id = job.id
            record.status = "queued"
            self._waiting[record.index] = _Waiting(job.id, attempt)
            self._job_owner[job.id] = record.index
            timeout = _Action("timeout", record, attempt, job.id)
            self._timetable.push(time.monotonic() + self.settings.answer_timeout_s, timeout)
        self.baseline.submit(job)

    def _on_reply(self, reply: BaselineReply) -> None:
        """A consumer finished a job: deliver it if its branch still waits for that attempt."""
        with self._lock:
            index = self._job_owner.pop(reply.job_id, None)
            record = self._by_index.get(index) if index is not None else None
            waiting = self._waiting.get(index) if index is not None else None
            if record is None or waiting is None or waiting.job_id != reply.job_id or record.terminal:
                return  # an abandoned attempt: the GPU time it took is simply lost
            if reply.ok:
                self._end_submission(record, "done")
                record.latency_s = reply.finished_at - reply.queued_at
                record.queue_wait_s = reply.started_at - reply.queued_at
                self.usage[record.index] = (reply.prompt_tokens, reply.completion_tokens)
                self._finish(record, "done", reply.finished_at)
                return
            self._end_submission(record, "failed")
            record.error = f"HTTP {reply.status_code}: {reply.error}"
            self._retry_or_end(record, waiting.attempt, "failed")
        self._timetable.wake()

    def _end_submission(self, record: TicketRecord, outcome: str) -> None:
        self.submission_outcomes[(record.type, outcome)] += 1
        self._waiting.pop(record.index, None)

    def _retry_or_end(self, record: TicketRecord, attempt: int, outcome: FinalOutcome) -> None:
        if attempt >= self.settings.max_attempts:
            self._finish(record, outcome, time.time())
            return
        record.retries += 1
        delay = self.settings.retry_delay_s * (1 + self._rng.uniform(0, self.settings.jitter))
        self._timetable.push(time.monotonic() + delay, _Action("submit", record, attempt + 1))

    @staticmethod
    def _finish(record: TicketRecord, outcome: FinalOutcome, at: float) -> None:
        record.outcome = outcome
        record.status = outcome
        record.finished_at = at

    def _cancel_open(self) -> None:
        """The run is over: whatever is still open is given up by its branch."""
        now = time.time()
        with self._lock:
            self._timetable.close()
            for record in self.records:
                if record.terminal:
                    continue
                if record.index in self._waiting:
                    self._end_submission(record, "cancelled")
                self._finish(record, "cancelled", now)
