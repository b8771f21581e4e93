"""Fencing, lease renewal, the fallback route, the degraded cap and the worker's metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.models import TicketRequest, TicketStatus
from shared.policy import Policy
from shared.queue import EnqueueOptions, TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from worker.execution import capped_max_tokens
from worker.inflight import AbortReason, InFlight, RunningTicket
from worker.leases import LeaseKeeper
from worker.result_writer import ResultWriter
from worker.telemetry import WorkerGauges, worker_registry
from worker.vllm_client import Completion


def request(policy: Policy, **fields: object) -> TicketRequest:
    body = {"type": "complaint", "branch_id": "b1", "prompt": "why was my fee charged twice", **fields}
    return TicketRequest.model_validate(body, context={"policy": policy})


def answer(text: str) -> Completion:
    return Completion(text, 5, 2, "stop", 0.01, 0.02, None, "m")


def test_a_worker_whose_lease_was_taken_over_cannot_write(
    fast_queue: TicketQueue, fast_policy: Policy, redis_client: Redis
) -> None:
    fast_queue.enqueue(request(fast_policy))
    (first,) = fast_queue.claim("slow", 1, lease_seconds=0.05)
    stalled = RunningTicket(first.ticket, first.token, gpu=0)
    wait_until(
        lambda: fast_queue.reap("test", 0.01).requeued == 1, 5, "the reaper to take the lapsed lease back"
    )
    (second,) = fast_queue.claim("fast", 1)
    current = RunningTicket(second.ticket, second.token, gpu=0)

    for running in (stalled, current):  # each in its own worker
        keeper = LeaseKeeper(fast_queue, InFlight(), lease_seconds=2)
        keeper.inflight.add(running)
        keeper.tick()
    assert stalled.handle.reason == AbortReason.LEASE_LOST, "the stale holder is told to stop"
    assert current.handle.reason is None

    assert not ResultWriter(fast_queue, "slow").done(stalled, answer("late"))
    assert ResultWriter(fast_queue, "fast").done(current, answer("on time"))
    ticket = fast_queue.get(first.ticket.id)
    assert ticket is not None and ticket.status is TicketStatus.DONE and ticket.result == "on time"
    assert fast_queue.stats().outcome_count("complaint", "done") == 1


def test_an_answer_to_a_cancelled_ticket_is_dropped_quietly(
    fast_queue: TicketQueue, fast_policy: Policy, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancel is the branch's choice, not a fault: no warning, whether the cancel reached the
    request (its abort says so) or came as the answer was finishing (only the ticket says so)."""
    caplog.set_level(logging.INFO, logger="worker.result_writer")
    for aborted in (True, False):
        fast_queue.enqueue(request(fast_policy))
        (claimed,) = fast_queue.claim("w", 1)
        running = RunningTicket(claimed.ticket, claimed.token, gpu=0)
        assert fast_queue.cancel(running.id) == "running"
        if aborted:
            running.handle.abort(AbortReason.CANCELLED)
        caplog.clear()
        assert not ResultWriter(fast_queue, "w").done(running, answer("unwanted"))
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (
                logging.INFO,
                f"ticket {running.id}: cancelled by its branch while running; its answer is not stored",
            )
        ]
        ticket = fast_queue.get(running.id)
        assert ticket is not None and ticket.status is TicketStatus.CANCELLED and ticket.result is None


def test_an_answer_after_a_takeover_still_warns(
    fast_queue: TicketQueue, fast_policy: Policy, caplog: pytest.LogCaptureFixture
) -> None:
    fast_queue.enqueue(request(fast_policy))
    (first,) = fast_queue.claim("slow", 1, lease_seconds=0.05)
    wait_until(lambda: fast_queue.reap("test", 0.01).requeued == 1, 5, "the reaper to take the lease back")
    with caplog.at_level(logging.INFO, logger="worker.result_writer"):
        assert not ResultWriter(fast_queue, "slow").done(
            RunningTicket(first.ticket, first.token, 0), answer("x")
        )
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "lease lost before its answer was written" in caplog.records[0].getMessage()


@contextmanager
def kept_lease(queue: TicketQueue, policy: Policy, lease_seconds: float) -> Iterator[RunningTicket]:
    """One claimed ticket, in flight, with a running LeaseKeeper renewing it (stopped on exit)."""
    queue.enqueue(request(policy))
    (claimed,) = queue.claim("w", 1, lease_seconds=lease_seconds)
    running = RunningTicket(claimed.ticket, claimed.token, gpu=0)
    inflight = InFlight()
    inflight.add(running)
    keeper = LeaseKeeper(queue, inflight, lease_seconds=lease_seconds)
    keeper.start()
    try:
        yield running
    finally:
        keeper.stop()


def test_renewal_keeps_a_long_ticket_and_cancel_is_seen(fast_queue: TicketQueue, fast_policy: Policy) -> None:
    with kept_lease(fast_queue, fast_policy, 0.3) as running:
        for _ in range(10):  # a second: three leases long, with the reaper sweeping all along
            fast_queue.reap("test", 0.01)
            ticket = fast_queue.get(running.id)
            assert (
                ticket is not None and ticket.status is TicketStatus.RUNNING and running.handle.reason is None
            )
            time.sleep(0.1)
        assert fast_queue.cancel(running.id) == "running"
        wait_until(lambda: running.handle.reason == AbortReason.CANCELLED, 2, "the keeper to see the cancel")


def test_degraded_service_caps_max_tokens(fast_queue: TicketQueue, fast_policy: Policy) -> None:
    fast_queue.enqueue(request(fast_policy, max_tokens=2000, type="archive_query"))
    (claimed,) = fast_queue.claim("w", 1)
    running = RunningTicket(claimed.ticket, claimed.token, gpu=0)
    cap = fast_policy.types["archive_query"].degraded_max_tokens
    assert capped_max_tokens(running, fast_policy, degraded=False) == 2000
    assert capped_max_tokens(running, fast_policy, degraded=True) == cap


def test_fallback_route_goes_to_the_fallback_vllm_and_metrics_are_exported(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
    fast_policy: Policy,
) -> None:
    primary = simulator(model="primary-7b")
    fallback = simulator(model="fallback-1b")
    routed = fast_queue.enqueue(request(fast_policy), EnqueueOptions(route="fallback")).ticket_id
    direct = fast_queue.enqueue(request(fast_policy)).ticket_id
    running = start_worker(primary.base_url, fallback_vllm_url=fallback.base_url)
    tickets = wait_until(
        lambda: (
            (ts := fast_queue.get_many([routed, direct])) and all(t and t.status.terminal for t in ts) and ts
        ),
        10,
        "both tickets to end",
    )
    assert [t.usage["model"] if t and t.usage else None for t in tickets] == ["fallback-1b", "primary-7b"]

    worker = running.worker
    # A ticket ends in Redis before its runner leaves the in-flight set, and the sizer resizes on
    # its own clock: sample once the set is empty, with the limit read on both sides of the sample.
    wait_until(lambda: worker.inflight.count() == 0, 10, "the runners to leave the in-flight set")
    limit_before = worker.sizer.limit
    text = generate_latest(worker_registry(WorkerGauges(worker.config.worker_id, 0, worker.gauges))).decode()
    limits = {limit_before, worker.sizer.limit}
    samples = {
        (s.name, s.labels.get("worker"), s.labels.get("type")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("tidegate_batch_limit", worker.config.worker_id, None)] in limits
    assert samples[("tidegate_gpu_total_bytes", worker.config.worker_id, None)] > 0
    assert samples[("tidegate_worker_inflight", worker.config.worker_id, None)] == 0
    assert samples[("tidegate_latency_seconds_count", None, "complaint")] >= 2
    assert samples[("tidegate_time_to_first_token_seconds_count", None, "complaint")] >= 2


def test_a_long_lease_still_sees_a_cancel_within_a_second(
    fast_queue: TicketQueue, fast_policy: Policy
) -> None:
    """The renewal is also the cancel check: a 30 s lease must not leave a cancelled ticket running 10 s."""
    with kept_lease(fast_queue, fast_policy, 30) as running:
        assert fast_queue.cancel(running.id) == "running"
        cancelled_at = time.monotonic()
        wait_until(lambda: running.handle.reason == AbortReason.CANCELLED, 5, "the keeper to see the cancel")
        assert time.monotonic() - cancelled_at < 3.0  # a third of the lease would be 10 s
