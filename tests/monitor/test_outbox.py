"""Finished tickets' callbacks move from the outbox to rq without loss or duplication."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis
from rq.job import Job

from ops.monitor.dispatch import CALLBACK_FUNCTION
from ops.monitor.outbox import OutboxDrainer
from tests.monitor.conftest import MonitorFactory
from tests.monitor.support import RqQueues, fill, ticket
from tests.redis_cluster import ON_CLUSTER


def test_outbox_ids_become_callback_jobs_oldest_first(
    redis_client: Redis, rq_queues: RqQueues, queue_name: str, make_monitor: MonitorFactory
) -> None:
    monitor = make_monitor()
    for ticket_id in ("t1", "t2", "t3"):
        redis_client.lpush(monitor.keys.outbox, ticket_id)  # what finishing a ticket does
    result = monitor.tick()
    assert result.callbacks_handed == 3
    jobs = [Job.fetch(job_id, connection=rq_queues.conn) for job_id in rq_queues.callbacks.job_ids]
    assert [tuple(job.args) for job in jobs] == [(queue_name, "t1"), (queue_name, "t2"), (queue_name, "t3")]
    assert {job.func_name for job in jobs} == {CALLBACK_FUNCTION}
    assert redis_client.llen(monitor.keys.outbox) == 0
    assert redis_client.llen(monitor.keys.outbox_processing) == 0


def test_a_crash_between_move_and_enqueue_loses_nothing(
    redis_client: Redis, rq_conn: Redis, rq_queues: RqQueues, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drainer = OutboxDrainer(rq_conn, queue_name, rq_queues.jobs, redis_client if ON_CLUSTER else None)
    redis_client.lpush(drainer.keys.outbox, "t1", "t2")

    def crash(ticket_ids: list[str]) -> int:
        raise ConnectionError("monitor killed here")

    monkeypatch.setattr(drainer, "_hand_over", crash)
    with pytest.raises(ConnectionError):
        drainer.drain()
    assert sorted(redis_client.lrange(drainer.keys.outbox_processing, 0, -1)) == ["t1", "t2"]
    assert rq_queues.callbacks.job_ids == []

    monkeypatch.undo()
    restarted = OutboxDrainer(rq_conn, queue_name, rq_queues.jobs, redis_client if ON_CLUSTER else None)
    assert restarted.drain() == 2
    assert len(rq_queues.callbacks.job_ids) == 2
    assert redis_client.llen(restarted.keys.outbox_processing) == 0


def test_handing_the_same_ticket_over_twice_keeps_one_job(
    redis_client: Redis, rq_conn: Redis, rq_queues: RqQueues, queue_name: str
) -> None:
    drainer = OutboxDrainer(rq_conn, queue_name, rq_queues.jobs, redis_client if ON_CLUSTER else None)
    redis_client.lpush(drainer.keys.outbox, "t1")
    drainer.drain()
    redis_client.lpush(drainer.keys.outbox_processing, "t1")  # as if a crash had left it behind
    drainer.drain()
    assert len(set(rq_queues.callbacks.job_ids)) == 1


def test_real_finished_tickets_reach_the_outbox_only_with_a_callback_url(
    redis_client: Redis, rq_queues: RqQueues, make_monitor: MonitorFactory
) -> None:
    monitor = make_monitor()
    [plain] = fill(monitor.queue, 1, "complaint")
    with_url = monitor.queue.enqueue(ticket("complaint", callback_url="https://branch.example/cb")).ticket_id
    for claimed in monitor.queue.claim("w1", 10):
        assert monitor.queue.finish(claimed.ticket.id, claimed.token, "done", result="ok")
    assert monitor.tick().callbacks_handed == 1
    [job_id] = rq_queues.callbacks.job_ids
    assert Job.fetch(job_id, connection=rq_queues.conn).args[1] == with_url
    assert plain != with_url


def test_a_finished_tickets_callback_is_delivered_through_rq(
    rq_queues: RqQueues,
    make_monitor: MonitorFactory,
    hook_server: tuple[str, list[dict[str, Any]]],
    loopback_callbacks_policy: str,
) -> None:
    url, received = hook_server
    monitor = make_monitor()
    ticket_id = monitor.queue.enqueue(ticket("loan_approval", callback_url=url)).ticket_id
    [claimed] = monitor.queue.claim("w1", 1)
    assert monitor.queue.finish(claimed.ticket.id, claimed.token, "done", result="approved")
    assert monitor.tick().callbacks_handed == 1
    rq_queues.work(rq_queues.callbacks)
    assert [(r["id"], r["status"], r["result"]) for r in received] == [(ticket_id, "done", "approved")]
