"""The red line: while the queue is busy, admission draws it (the policy's red threshold) and the
enqueue script refuses a ticket that is not critical once the queue holds that many tickets, per
ticket and atomically, so the queue's depth (and the level the monitor smooths from it) holds below
red instead of overshooting it and cycling red and orange."""

from __future__ import annotations

from redis import Redis

from producer.admission import AdmissionController
from shared.models import TicketRequest
from shared.policy import Policy
from shared.queue import EnqueueOptions, TicketQueue
from shared.shed import ShedCode
from tests.producer.api.conftest import publish_alarm

RED = 6
LINE = EnqueueOptions(red_line=RED)


def req(ticket_type: str, branch: str = "0412") -> TicketRequest:
    return TicketRequest(type=ticket_type, branch_id=branch, prompt="hello")


def test_past_the_red_line_other_work_is_refused_and_loans_still_come_in(ticket_queue: TicketQueue) -> None:
    batch = [req("complaint", branch=f"b{i}") for i in range(RED + 3)]
    results = ticket_queue.enqueue_many(batch, [LINE] * len(batch))
    assert [r.outcome for r in results] == ["queued"] * RED + ["rejected"] * 3, "counted within one call"
    refused = results[-1]
    assert refused.code is ShedCode.QUEUE_RED
    assert refused.ticket is not None and refused.ticket.error and refused.ticket.retry_after == 1.0
    assert ticket_queue.enqueue(req("archive_query"), LINE).code is ShedCode.QUEUE_RED
    assert ticket_queue.enqueue(req("loan_approval"), LINE).outcome == "queued", "critical ones pass"
    assert ticket_queue.enqueue(req("complaint", branch="z")).outcome == "queued", "no line drawn"
    assert ticket_queue.stats().depth == RED + 2
    counts = ticket_queue.stats().counts
    assert counts["complaint:shed:queue_red"] == 3 and counts["archive_query:shed:queue_red"] == 1


def test_a_claim_makes_room_below_the_line_again(ticket_queue: TicketQueue) -> None:
    ticket_queue.enqueue_many([req("complaint", branch=f"b{i}") for i in range(RED)], [LINE] * RED)
    assert ticket_queue.enqueue(req("complaint"), LINE).code is ShedCode.QUEUE_RED
    assert len(ticket_queue.claim("w1", 2)) == 2
    again = ticket_queue.enqueue_many([req("complaint", branch=f"c{i}") for i in range(3)], [LINE] * 3)
    assert [r.outcome for r in again] == ["queued", "queued", "rejected"]


def test_admission_draws_the_line_only_while_the_queue_is_busy(
    redis_client: Redis, policy: Policy, ticket_queue: TicketQueue
) -> None:
    admission = AdmissionController(redis_client, policy, ticket_queue.keys, cache_seconds=0)
    assert admission.decide(req("complaint")).options.red_line == 0, "green: bursts queue freely"
    publish_alarm(redis_client, ticket_queue.keys, "yellow")
    assert (
        admission.decide(req("complaint")).options.red_line == (policy.alarms.orange + policy.alarms.red) // 2
    )
