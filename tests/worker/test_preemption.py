"""In-flight preemption end to end: a loan arriving at a worker whose batch is full of archive
queries starts within one claim interval, and the archive it displaced still ends `done`, once.

The simulator runs at real time with slow decode steps and answers that run to max_tokens, so each
archive answer takes seconds: a loan that had to wait for a departure would wait several times the
bound the tests assert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from prometheus_client import REGISTRY

from ops.lab.sim.process import SimulatorProcess
from shared.control import read_events
from shared.models import Ticket, TicketRequest, TicketStatus
from shared.queue import TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, submit, ticket, wait_all_done
from worker.execution import PREEMPTED_WORDS
from worker.inflight import RunningTicket
from worker.preemption import choose_victim

CLAIM_INTERVAL = 1.0
"""The workers' `block_seconds`: the longest a claim loop waits before it looks at the queue again."""
BATCH = 4
ARCHIVE_TOKENS = 500
"""At 10 ms a step an archive answer takes five seconds or more."""


def full_worker(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
    **overrides: Any,
) -> tuple[RunningWorker, list[str]]:
    """A worker with every slot running an archive query that has started answering."""
    sim = simulator(time_scale=1, decode_step_s=0.01, stop_median_tokens=10**6)
    producer = producer_for(fast_queue)
    # Every one streams (so none is spared for being read live): the victim's reader must hear it
    # start over.
    bodies = [ticket("archive_query", max_tokens=ARCHIVE_TOKENS, live="tokens") for _ in range(BATCH)]
    archives = submit(producer, bodies)
    running = start_worker(
        sim.base_url,
        max_batch=BATCH,
        critical_headroom=0,  # no slot kept: only preemption can start the loan now
        block_seconds=CLAIM_INTERVAL,
        **overrides,
    )
    wait_until(
        lambda: (
            len(snapshot := running.worker.inflight.snapshot()) == BATCH and all(r.started for r in snapshot)
        ),
        20,
        "every archive in the batch answering",
    )
    return running, archives


def submit_loan(fast_queue: TicketQueue) -> Ticket:
    return submit_loan_of(fast_queue)


def submit_loan_of(fast_queue: TicketQueue, **fields: Any) -> Ticket:
    """Submit a loan and wait until a worker has started it."""
    loan = producer_for(fast_queue).submit(ticket("loan_approval", **fields)).ticket_id
    return cast(
        "Ticket",
        wait_until(
            lambda: (t := fast_queue.get(loan)) and t.started_at is not None and t, 30, "the loan to start"
        ),
    )


def test_a_loan_preempts_the_newest_archive_and_every_ticket_ends_done_once(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    running, archives = full_worker(simulator, start_worker, fast_queue)
    worker_id = running.worker.config.worker_id
    loan = submit_loan(fast_queue)
    assert loan.started_at is not None and loan.started_at - loan.created_at <= CLAIM_INTERVAL
    still_running = [t for t in fast_queue.get_many(archives[:-1]) if t and t.status is TicketStatus.RUNNING]
    assert len(still_running) == BATCH - 1, "the loan started while the other archives kept running"
    tickets = wait_all_done(fast_queue, [*archives, loan.id], 90)
    by_id = {t.id: t for t in tickets}
    victim = archives[-1]  # claimed last of the batch
    assert [by_id[a].preemptions for a in archives] == [0] * (BATCH - 1) + [1]
    assert all(t.attempts == 1 for t in tickets), "a preemption is not an attempt"
    assert by_id[victim].started_at is not None and by_id[victim].started_at >= loan.started_at
    stats = fast_queue.stats()
    assert stats.outcome_count("archive_query", "done") == BATCH
    assert stats.outcome_count("loan_approval", "done") == 1
    assert stats.inflight == 0 and stats.depth == 0
    events = [e for e in read_events(fast_queue.redis, fast_queue.keys, 50) if e["kind"] == "preemption"]
    assert [(e["ticket"], e["type"], e["worker"]) for e in events] == [(victim, "archive_query", worker_id)]
    counted = REGISTRY.get_sample_value(
        "tidegate_preemptions_total", {"worker": worker_id, "type": "archive_query"}
    )
    assert counted == 1
    entries = [fields for _, fields in fast_queue.redis.xrange(fast_queue.keys.live(victim))]
    kinds = [e["kind"] for e in entries]
    restart = kinds.index("retry")
    assert "token" in kinds[:restart] and "token" in kinds[restart:], "tokens before and after the restart"
    assert entries[restart]["error"] == PREEMPTED_WORDS
    assert entries[-1]["kind"] == "end" and entries[-1]["status"] == "done"


def test_without_preemption_the_loan_waits_for_a_departure(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    _running, archives = full_worker(simulator, start_worker, fast_queue, preemption=False)
    loan = submit_loan(fast_queue)
    tickets = wait_all_done(fast_queue, [*archives, loan.id], 90)
    first_departure = min(t.finished_at or 0.0 for t in tickets[:-1])
    assert loan.started_at is not None and loan.started_at >= first_departure
    assert all(t.preemptions == 0 for t in tickets)


def test_a_ticket_preempted_twice_already_runs_to_its_end(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    sim = simulator(time_scale=1, decode_step_s=0.01, stop_median_tokens=10**6)
    archive = submit(producer_for(fast_queue), [ticket("archive_query", max_tokens=200)])[0]
    fast_queue.redis.hset(fast_queue.keys.ticket(archive), "preemptions", 2)
    running = start_worker(sim.base_url, max_batch=1, critical_headroom=0, block_seconds=CLAIM_INTERVAL)
    wait_until(
        lambda: any(r.started for r in running.worker.inflight.snapshot()), 20, "the archive answering"
    )
    loan = submit_loan(fast_queue)
    done = wait_all_done(fast_queue, [archive, loan.id], 60)
    assert done[0].finished_at is not None and loan.started_at is not None
    assert loan.started_at >= done[0].finished_at
    assert done[0].preemptions == 2 and done[0].attempts == 1


def test_the_victim_is_the_newest_non_critical_ticket_not_yet_preempted_too_often(
    fast_queue: TicketQueue,
) -> None:
    def running(kind: str, claimed_at: float, preemptions: int = 0) -> RunningTicket:
        body = fast_queue.build_ticket(TicketRequest.model_validate(ticket(kind)))
        body = body.model_copy(update={"preemptions": preemptions})
        return RunningTicket(body, "t", 0, claimed_at=claimed_at)

    critical = frozenset(fast_queue.policy.critical_types)
    old, newer = running("archive_query", 1.0), running("complaint", 2.0)
    newest_loan, worn = running("loan_approval", 3.0), running("archive_query", 4.0, preemptions=2)
    assert choose_victim([old, newer, newest_loan, worn], critical, 2) is newer
    newer.handle.abort("preempted")
    assert choose_victim([old, newer, newest_loan, worn], critical, 2) is old, "not one already aborted"
    assert choose_victim([newest_loan, worn], critical, 2) is None


def test_a_ticket_a_client_is_reading_live_is_the_last_choice(fast_queue: TicketQueue) -> None:
    def running(claimed_at: float, live: str | None, started: bool) -> RunningTicket:
        body = fast_queue.build_ticket(TicketRequest.model_validate(ticket("archive_query")))
        entry = RunningTicket(body.model_copy(update={"live": live}), "t", 0, claimed_at=claimed_at)
        entry.handle.first_token_at = 1.0 if started else None
        return entry

    critical = frozenset(fast_queue.policy.critical_types)
    quiet = running(1.0, None, started=True)
    watched = running(2.0, "tokens", started=True)
    not_yet_streaming = running(3.0, "tokens", started=False)
    assert choose_victim([quiet, watched], critical, 2) is quiet
    assert choose_victim([quiet, watched, not_yet_streaming], critical, 2) is not_yet_streaming
    assert choose_victim([watched], critical, 2) is watched, "taken when nothing else will do"


def test_a_loan_preempts_when_the_kv_cache_not_the_batch_is_full(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    # 400 blocks of 16 tokens, less the 15% margin: room for two long archives (each counted at its
    # full size) but not for the loan beside them, while the batch has slots to spare.
    sim = simulator(time_scale=1, decode_step_s=0.004, stop_median_tokens=10**6, kv_blocks=400)
    producer = producer_for(fast_queue)
    archives = submit(producer, [ticket("archive_query", max_tokens=2400) for _ in range(2)])
    running = start_worker(
        sim.base_url,
        max_batch=8,
        critical_headroom=0,
        block_seconds=CLAIM_INTERVAL,
    )
    wait_until(
        lambda: len(snapshot := running.worker.inflight.snapshot()) == 2 and all(r.started for r in snapshot),
        20,
        "both archives answering",
    )
    # The worker has mostly seen short tickets, as in a mix of loans and complaints: by their average
    # size the batch has room for more; only the loan's own size does not fit.
    for _ in range(30):
        running.worker.sizer.observe(40)
    wait_until(lambda: running.worker.sizer.limit > 2, 5, "the batch limit to leave room")
    loan = submit_loan_of(fast_queue, max_tokens=1000)
    assert loan.started_at is not None and loan.started_at - loan.created_at <= CLAIM_INTERVAL
    tickets = wait_all_done(fast_queue, [*archives, loan.id], 90)
    assert sorted(t.preemptions for t in tickets) == [0, 0, 1]
    assert all(t.attempts == 1 for t in tickets)
