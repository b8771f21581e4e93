"""Many competing consumer processes on a real Redis: no ticket taken twice, none lost."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter

from shared.models import TicketRequest, TicketStatus
from shared.policy import Policy, load_policy
from shared.queue import Outcome, TicketQueue
from tests.redis_cluster import suite_client
from tests.waiting import wait_until

TICKETS = 3000
CONSUMERS = 8


def consume(
    redis_url: str, queue_name: str, worker: str, abandon_every: int, batched: bool
) -> list[tuple[str, str]]:
    """Claim batches until the queue stays empty; return (ticket id, event) pairs.

    With `abandon_every` > 0 this consumer "dies" holding every n-th batch: it never acks it, as a
    worker killed with -9 would, and the reaper must give those tickets to someone else. A
    `batched` consumer finishes a batch in one call (`finish_many`), each ticket fenced on its own.
    """
    queue = TicketQueue(suite_client(redis_url), load_policy(), queue_name)
    _wait_for_every_consumer(queue)
    events: list[tuple[str, str]] = []
    idle_since = time.monotonic()
    batches = 0
    while time.monotonic() - idle_since < 3.0:
        queue.reap(worker, interval_seconds=0.2)
        claimed = queue.claim(worker, 16, lease_seconds=1.0)
        if not claimed:
            time.sleep(0.01)
            continue
        idle_since = time.monotonic()
        batches += 1
        if abandon_every and batches % abandon_every == 0:
            events.extend((c.ticket.id, "abandoned") for c in claimed)
            continue
        if batched:
            replies = queue.finish_many(
                [Outcome(c.ticket.id, c.token, "done", result=worker) for c in claimed]
            )
            events.extend(
                (c.ticket.id, "done" if r == "ok" else "stale") for c, r in zip(claimed, replies, strict=True)
            )
            continue
        for c in claimed:
            ok = queue.finish(c.ticket.id, c.token, "done", result=worker)
            events.append((c.ticket.id, "done" if ok else "stale"))
    return events


def _wait_for_every_consumer(queue: TicketQueue) -> None:
    """Start together: a spawned process takes seconds to import, and the first ones up would
    otherwise drain the queue before the crashing consumers claim anything."""
    barrier = queue.keys.prefix + ":test-consumers-started"  # inside the queue's tag: cleaned with it
    queue.redis.incr(barrier)
    wait_until(lambda: int(queue.redis.get(barrier) or 0) >= CONSUMERS, 60, "every consumer to start")


def run_consumers(redis_url: str, queue_name: str, abandon: dict[int, int]) -> list[tuple[str, str]]:
    # spawn, not fork: forking a pytest process that has threads once left a pool worker waiting
    # forever on a lock that was held at the fork (CI, after 120 s).
    ctx = mp.get_context("spawn")
    with ctx.Pool(CONSUMERS) as pool:
        jobs = [
            pool.apply_async(consume, (redis_url, queue_name, f"w{i}", abandon.get(i, 0), i % 2 == 1))
            for i in range(CONSUMERS)
        ]
        return [event for job in jobs for event in job.get(timeout=120)]


def fill(queue: TicketQueue) -> list[str]:
    """Queue TICKETS tickets of all types: caps raised so every one is admitted, and attempts high
    enough that a ticket abandoned by crashing consumers several times in a row still ends done."""
    roomy = {name: t.model_copy(update={"cap": TICKETS}) for name, t in queue.policy.types.items()}
    patient = queue.policy.queue.model_copy(update={"max_attempts": 50})
    queue = TicketQueue(
        queue.redis, queue.policy.model_copy(update={"types": roomy, "queue": patient}), queue.keys.queue
    )
    ids: list[str] = []
    types = ["loan_approval", "complaint", "archive_query"]
    for start in range(0, TICKETS, 500):
        batch = [
            TicketRequest(type=types[i % 3], branch_id=f"b{i % 200}", prompt=f"ticket {i}", ttl_seconds=600)
            for i in range(start, start + 500)
        ]
        results = queue.enqueue_many(batch)
        assert {r.outcome for r in results} == {"queued"}
        ids.extend(r.ticket_id for r in results)
    return ids


def test_each_ticket_taken_exactly_once(redis_url: str, ticket_queue: TicketQueue, queue_name: str) -> None:
    ids = fill(ticket_queue)
    events = run_consumers(redis_url, queue_name, abandon={})
    done = Counter(ticket_id for ticket_id, event in events if event == "done")
    assert len(events) == TICKETS  # claimed once each: no ticket was handed out twice
    assert set(done) == set(ids) and set(done.values()) == {1}
    tickets = ticket_queue.get_many(ids)
    assert all(t is not None and t.status is TicketStatus.DONE for t in tickets)
    stats = ticket_queue.stats()
    assert (stats.depth, stats.inflight) == (0, 0)
    assert (
        sum(stats.outcome_count(t, "done") for t in ("loan_approval", "complaint", "archive_query"))
        == TICKETS
    )


def test_crashed_consumers_lose_nothing(
    redis_url: str, ticket_queue: TicketQueue, queue_name: str, policy: Policy
) -> None:
    ids = fill(ticket_queue)
    events = run_consumers(redis_url, queue_name, abandon={0: 3, 1: 5})
    abandoned = {ticket_id for ticket_id, event in events if event == "abandoned"}
    done = Counter(ticket_id for ticket_id, event in events if event == "done")
    assert abandoned, "the crashing consumers should have abandoned some batches"
    assert set(done) == set(ids) and set(done.values()) == {1}  # every ticket answered exactly once
    statuses = Counter(t.status if t else None for t in ticket_queue.get_many(ids))
    assert statuses == {TicketStatus.DONE: TICKETS}
    assert ticket_queue.stats().inflight == 0
