"""tidegate's own record of the requests: the queue's tickets read back from Redis with their times."""

from __future__ import annotations

import json

from redis import Redis

from ops.lab.bench.iperf.tickets import outcome_counts, parse_ticket, read_tickets
from producer.producer import Producer
from shared.keys import QueueKeys
from shared.policy import Policy


def test_a_done_ticket_reads_its_times_and_tokens() -> None:
    ticket = parse_ticket(
        "t1", ["done", "100.0", "100.25", "101.5", "110.0", json.dumps({"completion_tokens": 128})]
    )
    assert ticket is not None
    assert ticket.ttft == 0.25
    assert ticket.latency == 1.5
    assert ticket.completion_tokens == 128
    assert ticket.answered and ticket.in_time


def test_a_late_or_unfinished_ticket_is_not_in_time() -> None:
    late = parse_ticket("t2", ["done", "100.0", "100.2", "112.0", "110.0", None])
    queued = parse_ticket("t3", ["queued", "100.0", None, None, "110.0", None])
    assert late is not None and not late.in_time and late.completion_tokens is None
    assert queued is not None and (queued.ttft, queued.latency, queued.answered) == (None, None, False)


def test_a_vanished_hash_reads_as_none() -> None:
    assert parse_ticket("t4", [None, None, None, None, None, None]) is None


def test_read_tickets_finds_every_ticket_of_the_queue(
    producer: Producer, redis_client: Redis, queue_name: str
) -> None:
    submitted = [
        producer.submit({"type": "complaint", "branch_id": "b1", "prompt": f"p{n}", "max_tokens": 8})
        for n in range(3)
    ]
    keys = QueueKeys(queue_name)
    first = submitted[0].ticket_id
    created = float(str(redis_client.hget(keys.ticket(first), "created_at")))
    redis_client.hset(
        keys.ticket(first),
        mapping={
            "status": "done",
            "first_token_at": created + 0.1,
            "finished_at": created + 0.5,
            "usage": json.dumps({"completion_tokens": 8}),
        },
    )
    tickets, missing = read_tickets(redis_client, keys)
    assert missing == []
    assert sorted(t.id for t in tickets) == sorted(s.ticket_id for s in submitted)
    done = next(t for t in tickets if t.id == first)
    assert done.ttft is not None and abs(done.ttft - 0.1) < 1e-6
    assert done.completion_tokens == 8
    assert {t.status for t in tickets if t.id != first} == {"queued"}
    assert outcome_counts(redis_client, keys, "complaint")["submitted"] == 3


def test_a_shed_call_named_by_its_caller_reads_as_rejected_with_its_code(
    producer: Producer, redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    cap = policy.type_policy("complaint").cap
    assert cap is not None
    results = [
        producer.submit({"type": "complaint", "branch_id": "b1", "prompt": "p", "max_tokens": 8})
        for _ in range(cap + 1)
    ]
    shed = results[-1]  # past the cap, or the red line drawn once the depth reads as busy
    assert shed.outcome == "rejected"
    queued = sum(1 for r in results if r.outcome == "queued")
    tickets, missing = read_tickets(redis_client, QueueKeys(queue_name), [shed.ticket_id, "0unknown"])
    assert missing == ["0unknown"]
    assert len(tickets) == queued + 1, "the queue's tickets and the one shed call named"
    refused = next(t for t in tickets if t.id == shed.ticket_id)
    assert (refused.status, refused.shed_code, refused.answered) == ("rejected", shed.code, False)
