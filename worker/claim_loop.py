"""Continuous batching from the queue: keep the batch full, refilling as each ticket finishes, so one
long ticket never holds a batch of short ones back.

Each step reads a snapshot of the worker's world, asks the claim plan (`claim_plan.py`) what one
claim may take, and claims it atomically in priority order (the claim script). With no room and a
critical ticket at the head it preempts the newest other one (`preemption.py`). With nothing to
claim it blocks on the queue's wake list (not polling) for at most `block_seconds` or until the
next retry is due; with no free slot it waits for a ticket to leave. Endpoint health is the shared
breaker's alone (`queue_endpoints.py`): it waits out an open circuit or a failure pause, and sends
one ticket when it wins the probe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from shared import clock
from shared.queue import ClaimedTicket
from worker import telemetry
from worker.batch_sizer import BatchSizer
from worker.claim_plan import Bound, ClaimPlan, Gate, Snapshot, plan_claim
from worker.deadlines import StartRule
from worker.inflight import InFlight, RunningTicket
from worker.preemption import Preemptor
from worker.queue_endpoints import QueueEndpoints, Routes
from worker.queue_set import Queues, QueueSet
from worker.result_writer import ResultWriter
from worker.throttle import Throttle

log = logging.getLogger(__name__)

PREEMPT_CHECK_SECONDS = 0.1
"""How often a full worker with preemption on looks for a critical ticket at the head of the queue
(a new ticket wakes idle workers only): the longest a loan waits for its preemption to begin."""


class ClaimLoop:
    def __init__(
        self,
        *,
        queue: Queues,
        worker_id: str,
        gpu: int,
        sizer: BatchSizer,
        inflight: InFlight,
        writer: ResultWriter,
        start: Callable[[RunningTicket], None],
        stop: threading.Event,
        lease_seconds: float,
        block_seconds: float,
        burst: bool,
        throttle: Throttle | None = None,
        reserve_share: float = 0.0,
        preemptor: Preemptor | None = None,
        endpoints: QueueEndpoints | None = None,
        start_rule: StartRule | None = None,
    ) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.gpu = gpu
        self.sizer = sizer
        self.inflight = inflight
        self.writer = writer
        self.start = start
        self.stop = stop
        self.lease_seconds = lease_seconds
        self.block_seconds = block_seconds
        self.burst = burst
        self.throttle = throttle
        self.reserve_share = reserve_share
        self.preemptor = preemptor
        self.critical = frozenset(queue.policy.critical_types)
        self.start_rule = start_rule
        self.endpoints = endpoints
        self.claimed_total = 0
        self._probe: str | None = None
        """The queue whose half-open probe this step holds."""
        self.last_plan: ClaimPlan | None = None
        """The last step's plan: its bound is what the registry and status show."""

    def run(self) -> None:
        """Claim and start tickets until `stop` is set (or, in burst mode, the queue is drained)."""
        while not self.stop.is_set():
            try:
                if self._step():
                    return
            except redis.RedisError as exc:
                log.warning("claiming failed (%s); retrying in %.1f s", exc, self.block_seconds)
                self.stop.wait(self.block_seconds)

    def _step(self) -> bool:
        """One round; True when a burst run has nothing left to do."""
        self._probe = None
        routes = self.endpoints.routes() if self.endpoints is not None else Routes(())
        snapshot = self._snapshot(routes)
        plan = self.last_plan = plan_claim(snapshot)
        if not plan.room:
            if snapshot.health is Gate.WAIT:
                # Open circuits or a failure pause: tickets stay queued (their TTL runs), not failing.
                self.stop.wait(min(max(routes.wait_seconds, 0.05), self.block_seconds))
            else:
                self._wait_at_limit(preempt=plan.preempt)
            return False
        if routes.probe is not None and self.endpoints is not None:
            if self.endpoints.take_probe(routes.probe):
                self._probe = routes.probe
            elif not routes.among:
                self.stop.wait(min(0.5, self.block_seconds))  # another worker is probing
                return False
        running = self.inflight.count()
        claimed = self._claim(
            (self._probe,) if self._probe else routes.among,
            1 if self._probe else plan.count,
            lease_seconds=self.lease_seconds,
            token_budget=plan.budget,
            take_first_over_budget=running == 0,
            normal_count=plan.normal_count,
            normal_budget=plan.normal_budget,
        )
        if claimed:
            if not self._start_all(claimed) and self._probe and self.endpoints is not None:
                self.endpoints.release_probe(self._probe)  # it was too late to probe with
            return False
        if self._probe and self.endpoints is not None:
            self.endpoints.release_probe(self._probe)  # nothing to probe with: let the next claimer try
        return self._idle(running, plan)

    def _snapshot(self, routes: Routes) -> Snapshot:
        """The world now: the sizer's capacity, the throttle, what runs, and endpoint health."""
        capacity = self.sizer.limit
        return Snapshot(
            capacity=capacity,
            capacity_bound=self.sizer.bound,
            running=self.inflight.count(),
            token_budget=self.sizer.token_budget(self.inflight.reserved_tokens()),
            usable_kv_tokens=self.sizer.usable_kv_tokens(),
            throttle=self.throttle.ceiling(capacity) if self.throttle is not None else None,
            reserve_share=self.reserve_share,
            health=Gate.GO if self.endpoints is None else routes.gate,
            health_bound=routes.why or Bound.OPEN,
        )

    def _claim(self, among: tuple[str, ...], count: int, **options: Any) -> list[ClaimedTicket]:
        """Claim up to `count`, from the queues `among` when several are served (without
        breakers, from every queue)."""
        if isinstance(self.queue, QueueSet) and self.endpoints is not None:
            return self.queue.claim(self.worker_id, count, among=among, **options)
        return self.queue.claim(self.worker_id, count, **options)

    def _wait_at_limit(self, *, preempt: bool) -> None:
        """No room (no free slot, or no KV budget for the head): wait for a departure, preempting
        for a critical ticket when one waits."""
        if self.preemptor is None or not preempt:
            self.inflight.wait_for_departure(self.block_seconds)
            return
        self.preemptor.make_room()
        self.inflight.wait_for_departure(min(PREEMPT_CHECK_SECONDS, self.block_seconds))

    def _start_all(self, claimed: list[ClaimedTicket]) -> bool:
        """Start what may still start; False when none did (each was past its deadline), so a
        half-open probe taken for them goes back to the next claimer instead of waiting for a call
        that never comes."""
        now = clock.now()
        started = False
        for item in claimed:
            self.claimed_total += 1
            if self.start_rule is not None and self.start_rule.too_late(item.ticket, now):
                self.writer.deadline_passed(item, self.start_rule.reason(item.ticket, now))
                continue
            running = RunningTicket(item.ticket, item.token, self.gpu, probe=self._probe is not None)
            if not self.inflight.add(running):
                self.writer.give_back(running, "worker shutting down before the ticket started")
                continue
            self.sizer.observe(item.ticket.cost_tokens)
            telemetry.observe_claim(item.ticket)
            self.start(running)
            started = True
        return started

    def _idle(self, running: int, plan: ClaimPlan) -> bool:
        """Nothing was claimed: wait for work, or for room when the budget held tickets back."""
        pending, delayed, leased = self.queue.sizes()
        if pending > 0 and running > 0:
            # The budget or the normal share held the head back: a departure makes room, or a
            # preemption when the head is a critical ticket that did not fit.
            self._wait_at_limit(preempt=plan.preempt and not self._probe)
            return False
        if self.burst and pending + delayed + leased == 0 and self.inflight.count() == 0:
            log.info("burst: the queue is drained; %d tickets claimed", self.claimed_total)
            return True
        wait = self.block_seconds
        next_retry = self.queue.seconds_until_next_retry() if delayed else None
        if next_retry is not None:
            wait = min(wait, max(next_retry, 0.01))
        if self.burst and leased > 0 and pending + delayed == 0:
            # Other workers' leases may lapse and come back; the reaper's wake-up brings them here.
            wait = min(wait, 1.0)
        self.queue.wait_for_work(wait)
        return False
