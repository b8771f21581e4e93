"""Priority order end to end: producer → Redis → worker → simulator → result."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from ops.lab.sim.process import SimulatorProcess
from shared.queue import TicketQueue
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, submit, ticket, wait_all_done, wait_inflight


def test_priority_order_holds_with_max_batch_one(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    submitted = [
        ticket("archive_query", is_bulk=True),
        ticket("archive_query"),
        ticket("complaint"),
        ticket("complaint", vip_level=5),
        ticket("loan_approval"),
        ticket("loan_approval", urgent_level=5),
        ticket("archive_query"),
        ticket("loan_approval", urgent_level=2),
    ]
    ids = submit(producer_for(fast_queue), submitted)
    sim = simulator()
    start_worker(sim.base_url, max_batch=1, burst=True)
    done = wait_all_done(fast_queue, ids, 30)
    by_start = sorted(done, key=lambda t: t.started_at)
    assert [t.priority for t in by_start] == sorted(t.priority for t in done)
    # One at a time: each started only after the previous one finished.
    for earlier, later in itertools.pairwise(by_start):
        assert later.started_at >= earlier.finished_at


def test_new_urgent_loan_starts_before_queued_archive_queries(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    producer = producer_for(fast_queue)
    archives = submit(producer, [ticket("archive_query", max_tokens=200) for _ in range(9)])
    sim = simulator(time_scale=1, decode_step_s=0.01)  # each archive answer takes about a second
    start_worker(sim.base_url, max_batch=3, critical_headroom=0)  # no slot kept: the loan must queue
    wait_inflight(fast_queue, 3, 10, "the worker to fill its batch of 3")
    loan = producer.submit(ticket("loan_approval", urgent_level=3)).ticket_id
    enqueued_at = time.time()
    tickets = wait_all_done(fast_queue, [*archives, loan], 60)
    loan_ticket = tickets[-1]
    later_archives = [t for t in tickets[:-1] if t.started_at > enqueued_at]
    assert later_archives, "the loan arrived after every archive had started; the test proves nothing"
    assert all(loan_ticket.started_at <= t.started_at for t in later_archives)


def test_headroom_starts_a_loan_while_the_normal_share_is_busy(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    producer = producer_for(fast_queue)
    archives = submit(producer, [ticket("archive_query", max_tokens=400) for _ in range(8)])
    sim = simulator(time_scale=1, decode_step_s=0.01)  # each archive answer takes about four seconds
    start_worker(sim.base_url, max_batch=5, critical_headroom=0.2)  # 4 slots for archives, 1 kept
    wait_inflight(fast_queue, 4, 10, "the worker to fill its normal share of 4")
    time.sleep(0.3)  # watching that nothing happens: no archive query may take the kept slot
    assert fast_queue.stats().inflight == 4, "an archive query took the slot kept for critical tickets"
    loan = producer.submit(ticket("loan_approval")).ticket_id
    tickets = wait_all_done(fast_queue, [*archives, loan], 60)
    loan_ticket = tickets[-1]
    first_batch = sorted(tickets[:-1], key=lambda t: t.started_at)[:4]
    assert all(t.started_at < loan_ticket.started_at for t in first_batch)
    # Read from the tickets' own times, not from a poll racing the batch: the loan started before
    # any archive query of the batch that held the normal share had finished.
    assert loan_ticket.started_at < min(t.finished_at for t in first_batch), (
        "the loan should start while the archive batch is still running"
    )
