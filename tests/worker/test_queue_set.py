"""One worker serving several queues in priority order: the first queue's tickets are claimed
first whenever it has any ready, the next queue's as soon as it has none, and every ticket's
outcome, lease and heartbeat land in its own queue (on a Cluster: on its own slot and node)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.cli_support import parse_queue_names
from shared.policy import Policy
from shared.queue import TicketQueue
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, submit_many, wait_all_done
from worker import queue_set
from worker.config import WorkerConfig
from worker.gpu_memory import make_provider
from worker.queue_set import QueueSet
from worker.registry import live_workers
from worker.worker import Worker


def test_queue_names_come_from_repeated_flags_and_comma_lists_first_seen_first() -> None:
    assert parse_queue_names(["gold", "silver,bronze", " gold ,", ""]) == ("gold", "silver", "bronze")


def test_a_claim_takes_the_first_queue_before_the_second_and_never_passes_over_its_head(
    redis_client: Redis, fast_policy: Policy, queue_name: str, second_queue: str
) -> None:
    first = TicketQueue(redis_client, fast_policy, queue_name)
    second = TicketQueue(redis_client, fast_policy, second_queue)
    later = submit_many(producer_for(second), 5, max_tokens=8)
    earlier = submit_many(producer_for(first), 2, max_tokens=8)
    queues = QueueSet([first, second])

    claimed = queues.claim("w", 4)
    assert [c.ticket.id for c in claimed] == earlier + later[:2], "the first queue's, then the second's"
    assert [queues.owner(c.ticket.id) for c in claimed] == [first, first, second, second]
    for item in claimed:
        assert queues.finish(item.ticket.id, item.token, "done", result="ok")
    assert first.stats().outcome_count("complaint", "done") == 2
    assert second.stats().outcome_count("complaint", "done") == 2

    big = submit_many(producer_for(first), 1, max_tokens=2000)[0]
    cost = first.get(big).cost_tokens  # type: ignore[union-attr]
    held = queues.claim("w", 4, token_budget=cost - 1, take_first_over_budget=False)
    assert held == [], "a second-queue ticket that fits does not overtake the first queue's head"
    (taken,) = queues.claim("w", 1, token_budget=cost)
    assert taken.ticket.id == big and queues.owner(big) is first
    assert second.sizes()[0] == 3


def test_an_idle_worker_wakes_for_work_in_any_of_its_queues(
    redis_client: Redis, fast_policy: Policy, queue_name: str, second_queue: str
) -> None:
    first = TicketQueue(redis_client, fast_policy, queue_name)
    second = TicketQueue(redis_client, fast_policy, second_queue)
    queues = QueueSet([first, second])
    while queues.wait_for_work(0.01):  # drain markers left by nobody
        pass
    submitter = threading.Timer(0.2, lambda: submit_many(producer_for(second), 1))
    submitter.start()
    try:
        assert queues.wait_for_work(8.0), "the second queue's new ticket woke the wait"
    finally:
        submitter.join()
        queues.close()


def test_a_worker_serves_its_queues_in_priority_order_and_writes_each_ticket_to_its_own_queue(
    redis_client: Redis,
    fast_policy: Policy,
    queue_name: str,
    second_queue: str,
    simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = simulator()
    first = TicketQueue(redis_client, fast_policy, queue_name)
    second = TicketQueue(redis_client, fast_policy, second_queue)
    waiting = submit_many(producer_for(second), 6, max_tokens=8)  # older, but in the later queue
    urgent = submit_many(producer_for(first), 4, max_tokens=8)
    config = WorkerConfig(
        gpu=0,
        vllm_url=sim.base_url,
        worker_id=f"w-{queue_name}",
        queue_name=queue_name,
        extra_queues=(second_queue,),
        max_batch=1,  # one ticket at a time, so the claim order is the finishing order
        lease_seconds=fast_policy.queue.lease_seconds,
        grace_seconds=5.0,
        heartbeat_seconds=0.5,
        resize_seconds=0.2,
        block_seconds=0.2,
    )
    running = RunningWorker(
        Worker(config, redis_client, fast_policy, gpu_provider=make_provider("sim", sim.base_url))
    )
    running.thread.start()
    try:
        done_first = wait_all_done(first, urgent, 30)
        done_second = wait_all_done(second, waiting, 30)
        assert max(t.started_at or 0 for t in done_first) < min(t.started_at or 0 for t in done_second)
        assert [w.worker_id for w in live_workers(redis_client, first.keys)] == [config.worker_id]
        assert [w.worker_id for w in live_workers(redis_client, second.keys)] == [config.worker_id]
        late = submit_many(producer_for(second), 2, max_tokens=8)
        wait_all_done(second, late, 30)  # an empty first queue does not hold the second back
    finally:
        running.stop()
    for queue, count in ((first, 4), (second, 8)):
        stats = queue.stats()
        assert (
            stats.outcome_count("complaint", "submitted") == count == stats.outcome_count("complaint", "done")
        )
        assert stats.inflight == 0
    assert live_workers(redis_client, second.keys) == [], "it left every queue's registry"


def test_a_ticket_that_ended_without_a_write_of_ours_is_forgotten_once_out_of_flight(
    redis_client: Redis,
    fast_policy: Policy,
    queue_name: str,
    second_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = TicketQueue(redis_client, fast_policy, queue_name)
    second = TicketQueue(redis_client, fast_policy, second_queue)
    submit_many(producer_for(second), 2, max_tokens=8)
    queues = QueueSet([first, second])
    running, cancelled = queues.claim("w", 2)
    monkeypatch.setattr(queue_set, "OWNER_GRACE_SECONDS", 0.0)
    replies = queues.extend_many([(running.ticket.id, running.token)])
    assert replies == {running.ticket.id: "ok"}, "the lease is renewed in the ticket's own queue"
    assert queues.owner(running.ticket.id) is second, "a ticket in flight is remembered"
    assert queues.owner(cancelled.ticket.id) is first, "one no longer in flight is not"


def test_preemption_reads_the_next_queue_head_and_puts_a_ticket_back_in_its_own_queue(
    redis_client: Redis, fast_policy: Policy, queue_name: str, second_queue: str
) -> None:
    first = TicketQueue(redis_client, fast_policy, queue_name)
    second = TicketQueue(redis_client, fast_policy, second_queue)
    queues = QueueSet([first, second])
    assert queues.head() is None
    archive = submit_many(producer_for(second), 1, type="archive_query", max_tokens=8)[0]
    assert (head := queues.head()) is not None and head.type == "archive_query"
    (claimed,) = queues.claim("w", 1)
    submit_many(producer_for(second), 1, type="loan_approval", max_tokens=8)
    assert (head := queues.head()) is not None and head.type == "loan_approval", "the next ticket claimed"
    outcome = queues.preempt(archive, claimed.token, "archive_query", "for a loan", max_preemptions=2)
    assert outcome == "requeued"
    ticket = second.get(archive)
    assert ticket is not None and ticket.preemptions == 1 and ticket.attempts == 0
    assert first.sizes() == (0, 0, 0) and second.sizes()[0] == 2
