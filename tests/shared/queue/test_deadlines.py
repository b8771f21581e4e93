"""Deadlines: every ticket carries one (its type's SLO from the first submission, or the caller's
sooner one), and the enqueue script refuses a ticket that cannot start before it, estimated from the
tickets ahead of it and the monitor's drain rate (shared/lua/lib/deadline.lua)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError
from redis import Redis

from producer.producer import Producer
from producer.status import operator_status
from shared import clock
from shared.metrics import build_registry
from shared.models import TicketRequest, TicketStatus
from shared.policy import Policy
from shared.queue import TicketQueue
from shared.shed import ShedCode
from tests.fake_clock import FakeClock


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock(clock.now())
    monkeypatch.setattr(clock, "now", fake)
    yield fake


def req(ticket_type: str, **kw: Any) -> TicketRequest:
    kw.setdefault("prompt", "hello")
    return TicketRequest(type=ticket_type, branch_id=kw.pop("branch_id", "0412"), **kw)


def publish_drain(redis: Redis, queue: TicketQueue, rate: float, at: float) -> None:
    redis.hset(queue.keys.monitor_state, mapping={"service_rate": rate, "updated_at": at})


def test_the_deadline_is_the_slo_or_the_callers_sooner_one(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    plain = ticket_queue.enqueue(req("complaint"))
    sooner = ticket_queue.enqueue(req("complaint", deadline_ms=2500))
    later = ticket_queue.enqueue(req("complaint", deadline_ms=60_000))
    stored = [ticket_queue.get(r.ticket_id) for r in (plain, sooner, later)]
    assert [t.deadline for t in stored if t] == pytest.approx([fake_clock.at + d for d in (10, 2.5, 10)])
    assert all(t is not None and t.first_seen_at == fake_clock.at for t in stored)


def test_a_bad_deadline_names_the_field() -> None:
    for bad in (0, -5, "soon", 10**12):
        with pytest.raises(ValidationError) as info:
            req("complaint", deadline_ms=bad)
        assert info.value.errors()[0]["loc"] == ("deadline_ms",)


def test_no_drain_measured_admits_whatever_the_queue(
    ticket_queue: TicketQueue, redis_client: Redis, fake_clock: FakeClock
) -> None:
    ticket_queue.enqueue_many([req("complaint") for _ in range(50)])
    assert ticket_queue.enqueue(req("complaint", deadline_ms=1)).outcome == "queued"
    publish_drain(redis_client, ticket_queue, 1.0, fake_clock.at - 30)  # a dead monitor's figure
    assert ticket_queue.enqueue(req("complaint", deadline_ms=1)).outcome == "queued"


def test_a_ticket_that_cannot_start_in_time_is_refused_with_the_estimate(
    producer: Producer, redis_client: Redis, fake_clock: FakeClock
) -> None:
    queue = producer.queue
    queue.enqueue_many([req("complaint") for _ in range(40)])
    publish_drain(redis_client, queue, 2.0, fake_clock.at)  # 40 ahead at 2/s: a 20 s wait
    late = producer.submit(req("complaint"))  # SLO 10 s
    assert (late.outcome, late.code) == ("rejected", ShedCode.DEADLINE_UNREACHABLE)
    # The 20 s wait past the 7.5 s it may queue (a quarter of its SLO is left for its answer).
    assert late.retry_after == pytest.approx(12.5)
    assert "past its deadline" in late.reason
    stored = queue.get(late.ticket_id)
    assert stored is not None and stored.status is TicketStatus.REJECTED
    assert stored.shed_code == "deadline_unreachable"
    # An archive query may wait 60 s; a loan is never refused by this rule; a better priority
    # has fewer tickets ahead of it.
    assert producer.submit(req("archive_query")).outcome == "queued"
    assert producer.submit(req("loan_approval")).outcome == "queued"
    assert producer.submit(req("complaint", vip_level=5)).outcome == "queued"
    counts = queue.stats().counts
    assert counts["complaint:rejected"] == 1


def test_tickets_that_find_a_free_slot_start_now_whatever_the_rate(
    producer: Producer, redis_client: Redis, fake_clock: FakeClock
) -> None:
    """A rate measured while the workers had room (an idle queue's trickle) is no evidence of a
    wait: the tickets ahead that the free slots take at once are not counted."""
    queue = producer.queue
    queue.enqueue_many([req("complaint") for _ in range(40)])
    redis_client.hset(
        queue.keys.monitor_state,
        mapping={"service_rate": 0.06, "free_slots": 45, "updated_at": fake_clock.at},
    )
    assert producer.submit(req("complaint")).outcome == "queued"  # 41 ahead, 45 free: starts now
    redis_client.hset(queue.keys.monitor_state, mapping={"service_rate": 2.0, "free_slots": 11})
    # 41 ahead, 11 take a free slot: 30 more to leave at 2/s, 15 s against the 7.5 s it may wait.
    late = producer.submit(req("complaint"))
    assert (late.outcome, late.code) == ("rejected", ShedCode.DEADLINE_UNREACHABLE)
    assert late.retry_after == pytest.approx(7.5)


def test_a_retry_counts_the_slo_from_the_first_submission(
    producer: Producer, redis_client: Redis, fake_clock: FakeClock
) -> None:
    queue = producer.queue
    queue.enqueue_many([req("complaint") for _ in range(40)])
    publish_drain(redis_client, queue, 2.0, fake_clock.at)
    first_at = fake_clock.at
    shed = producer.submit(req("complaint", idempotency_key="k1"))
    assert shed.code is ShedCode.DEADLINE_UNREACHABLE
    fake_clock.advance(7)
    publish_drain(redis_client, queue, 100.0, fake_clock.at)  # 0.4 s: it starts 7.4 s in, answer time left
    retry = producer.submit(req("complaint", idempotency_key="k1"))
    assert (retry.outcome, retry.ticket_id) == ("queued", shed.ticket_id)
    stored = queue.get(retry.ticket_id)
    assert stored is not None and stored.first_seen_at == pytest.approx(first_at)
    assert stored.deadline == pytest.approx(first_at + 10)


def test_refused_early_and_expired_before_start_are_counted_per_class(
    producer: Producer, redis_client: Redis, fake_clock: FakeClock, policy: Policy
) -> None:
    queue = producer.queue
    queue.enqueue_many([req("complaint") for _ in range(40)])
    publish_drain(redis_client, queue, 2.0, fake_clock.at)
    producer.submit(req("complaint"))
    producer.submit(req("complaint"))
    claimed = queue.claim("w1", 1)[0]
    assert queue.finish(claimed.ticket.id, claimed.token, "expired", error="deadline_passed: test")
    status = operator_status(redis_client, policy, queue.keys.queue)
    assert status["by_class"]["complaint"] == {
        "refused": {"deadline_unreachable": 2},
        "expired_before_start": 1,
    }
    assert status["by_class"]["loan_approval"] == {"refused": {}, "expired_before_start": 0}
    exposition = generate_latest(build_registry(redis_client, policy, queue.keys.queue)).decode()
    assert 'tidegate_tickets_shed_total{code="deadline_unreachable",queue=' in exposition
    expired = [
        line
        for line in exposition.splitlines()
        if line.startswith("tidegate_tickets_expired_before_start_total") and 'type="complaint"' in line
    ]
    assert len(expired) == 1 and expired[0].endswith(" 1.0")


def test_arrivals_of_better_types_are_taken_off_the_service_rate(
    producer: Producer, redis_client: Redis, fake_clock: FakeClock
) -> None:
    queue = producer.queue
    queue.enqueue_many([req("complaint") for _ in range(5)])
    redis_client.hset(
        queue.keys.monitor_state,
        mapping={
            "service_rate": 4.0,
            "service_peak": 10.0,  # what the workers did at their best lately: the rate used
            "arrival_rate:loan_approval": 3.0,
            "arrival_rate:complaint": 7.0,
            "updated_at": fake_clock.at,
        },
    )
    # A complaint waits behind 5 at 10 - 3 (loans) per second; an archive query never starts while
    # loans and complaints keep arriving as fast as the workers serve them.
    assert producer.submit(req("complaint")).outcome == "queued"
    archive = producer.submit(req("archive_query"))
    assert (archive.outcome, archive.code) == ("rejected", ShedCode.DEADLINE_UNREACHABLE)
    assert archive.retry_after == 60  # the longest Retry-After
    redis_client.hset(queue.keys.monitor_state, "arrival_rate:complaint", 2.0)  # 5 left: 6 ahead, 1.2 s
    assert producer.submit(req("archive_query")).outcome == "queued"
