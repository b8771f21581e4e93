"""Preemption's requeue script, on real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared.models import TicketRequest, TicketStatus
from shared.queue import TicketQueue
from tests.fake_clock import FakeClock


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    yield FakeClock().install(monkeypatch)


def req(ticket_type: str, **kw: Any) -> TicketRequest:
    kw.setdefault("prompt", "hello")
    return TicketRequest(type=ticket_type, branch_id=kw.pop("branch_id", "0412"), **kw)


def test_a_preempted_ticket_goes_back_at_its_score_without_using_an_attempt(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    first = ticket_queue.enqueue(req("archive_query")).ticket_id
    fake_clock.at += 1
    second = ticket_queue.enqueue(req("archive_query")).ticket_id
    score = ticket_queue.redis.zscore(ticket_queue.keys.pending, first)
    depth_before = ticket_queue.redis.hgetall(ticket_queue.keys.branch_depth("archive_query"))
    claimed = ticket_queue.claim("w", 1)[0]
    assert claimed.ticket.id == first
    ticket_queue.redis.delete(ticket_queue.keys.wake)
    outcome = ticket_queue.preempt(first, claimed.token, "archive_query", "for a loan", max_preemptions=2)
    assert outcome == "requeued"
    ticket = ticket_queue.get(first)
    assert ticket is not None and ticket.status is TicketStatus.QUEUED
    assert ticket.attempts == 0 and ticket.preemptions == 1 and ticket.worker is None
    assert ticket_queue.redis.zscore(ticket_queue.keys.pending, first) == score
    assert ticket_queue.redis.hgetall(ticket_queue.keys.branch_depth("archive_query")) == depth_before
    assert ticket_queue.stats().inflight == 0
    assert ticket_queue.redis.llen(ticket_queue.keys.wake) == 1, "an idle worker is woken for it"
    # Still ahead of the ticket queued after it, and the old token can write nothing now.
    assert [c.ticket.id for c in ticket_queue.claim("w", 2)] == [first, second]
    assert ticket_queue.finish(first, claimed.token, "done", result="late") is False


def test_a_ticket_preempted_max_times_is_left_running(ticket_queue: TicketQueue) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint")).ticket_id
    outcomes = []
    for _ in range(3):
        claimed = ticket_queue.claim("w", 1)[0]
        outcomes.append(ticket_queue.preempt(ticket_id, claimed.token, "complaint", "x", max_preemptions=2))
    assert outcomes == ["requeued", "requeued", "exhausted"]
    ticket = ticket_queue.get(ticket_id)
    assert ticket is not None and ticket.status is TicketStatus.RUNNING and ticket.preemptions == 2
    assert ticket.attempts == 1, "preemptions used none of its attempts"
    assert ticket_queue.finish(ticket_id, claimed.token, "done", result="ok")
    assert ticket_queue.stats().outcome_count("complaint", "done") == 1


def test_preempting_needs_the_current_lease_and_a_live_ttl(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint", ttl_seconds=5)).ticket_id
    claimed = ticket_queue.claim("w", 1)[0]
    assert ticket_queue.preempt(ticket_id, "not-the-token", "complaint", "x", max_preemptions=2) == (
        "stale:running"
    )
    fake_clock.at += 6
    assert ticket_queue.preempt(ticket_id, claimed.token, "complaint", "x", max_preemptions=2) == "expired"
    ticket = ticket_queue.get(ticket_id)
    assert ticket is not None and ticket.status is TicketStatus.EXPIRED
