"""Fair share within a type: one branch's flood cannot lock other branches out of the type.

While other branches have queued tickets of a type, a branch holds at most its share of them; the
share is counted in weighted tokens (tests/shared/queue/test_token_share.py), and with tickets of
one size, as here, it is cap ÷ (waiting branches) tickets. A branch below its share is admitted
even when the flood filled the cap (up to twice it). The per-branch counts the rule reads stay
exact through every way a ticket leaves the queue.
"""

from __future__ import annotations

import pytest
from redis import Redis

from producer.producer import Producer, SubmitResult
from shared import clock
from shared.models import TicketRequest, TicketStatus
from shared.policy import Policy
from shared.shed import ShedCode
from tests.fake_clock import FakeClock

CAP = 6


@pytest.fixture
def small_cap(policy: Policy) -> Policy:
    types = dict(policy.types)
    types["complaint"] = types["complaint"].model_copy(update={"cap": CAP})
    return policy.model_copy(update={"types": types})


@pytest.fixture
def fair(redis_client: Redis, small_cap: Policy, queue_name: str) -> Producer:
    return Producer(redis_client, small_cap, queue_name, admission_cache_seconds=0)


def _complaint(producer: Producer, branch: str, **extra: object) -> SubmitResult:
    return producer.submit(TicketRequest(type="complaint", branch_id=branch, prompt="charged twice", **extra))


def _held(redis_client: Redis, producer: Producer) -> dict[str, int]:
    raw = redis_client.hgetall(producer.queue.keys.branch_depth("complaint"))
    return {k: int(v) for k, v in raw.items()}


def test_a_flood_does_not_lock_out_a_second_branch(fair: Producer, redis_client: Redis) -> None:
    flood = [_complaint(fair, "A") for _ in range(CAP)]
    assert all(r.outcome == "queued" for r in flood)  # alone, a branch may fill the whole cap
    lone = _complaint(fair, "A")
    assert (lone.outcome, lone.code) == ("rejected", ShedCode.TYPE_CAP)

    second = _complaint(fair, "B")
    assert second.outcome == "queued"  # below its share: admitted although the cap is full
    again = _complaint(fair, "A")
    assert (again.outcome, again.code) == ("rejected", ShedCode.BRANCH_SHARE)
    assert again.reason and "fair share" in again.reason
    third = _complaint(fair, "C")
    assert third.outcome == "queued"
    assert _held(redis_client, fair) == {"A": CAP, "B": 1, "C": 1}
    # B holds 1 of its share of 2 (6 ÷ 3 branches): one more is fine, the one after is not.
    assert _complaint(fair, "B").outcome == "queued"
    assert _complaint(fair, "B").code is ShedCode.BRANCH_SHARE


def test_the_share_grows_back_as_other_branches_leave(fair: Producer, redis_client: Redis) -> None:
    a_tickets = [_complaint(fair, "A").ticket_id for _ in range(CAP // 2)]
    b_ticket = _complaint(fair, "B").ticket_id
    assert _complaint(fair, "A").code is ShedCode.BRANCH_SHARE  # 3 of 6 with two branches waiting
    assert fair.cancel(b_ticket) == "queued"
    assert _held(redis_client, fair) == {"A": CAP // 2}
    assert _complaint(fair, "A").outcome == "queued"  # alone again: the whole cap
    assert fair.cancel(a_tickets[0]) == "queued"
    assert _held(redis_client, fair) == {"A": CAP // 2}


def test_even_under_share_branches_stop_at_twice_the_cap(fair: Producer) -> None:
    for _ in range(CAP):
        assert _complaint(fair, "A").outcome == "queued"
    admitted = [_complaint(fair, f"B{i}").outcome for i in range(2 * CAP)]
    assert admitted.count("queued") == CAP
    assert fair.queue.stats().depth_by_type["complaint"] == 2 * CAP


def test_counts_follow_claims_expiry_and_lost_leases(
    fair: Producer, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _complaint(fair, "A")
    _complaint(fair, "B")
    short = _complaint(fair, "B", ttl_seconds=0.05).ticket_id
    [claimed] = fair.queue.claim("w-fair", 1)
    assert claimed.ticket.branch_id == "A"
    assert _held(redis_client, fair) == {"B": 2}
    # A lost lease puts A's ticket back, and its count with it.
    redis_client.zadd(fair.queue.keys.inflight, {claimed.ticket.id: 0})
    redis_client.delete(fair.queue.keys.reaper_lock)
    FakeClock(clock.now() + 0.1).install(monkeypatch)  # the short ticket's TTL has passed
    result = fair.queue.reap("r-fair")
    assert (result.requeued, result.expired) == (1, 1)
    ended = fair.get(short)
    assert ended is not None and ended.status is TicketStatus.EXPIRED
    assert _held(redis_client, fair) == {"A": 1, "B": 1}
    while fair.queue.claim("w-fair", 10):
        pass
    assert _held(redis_client, fair) == {}


def test_a_retried_ticket_takes_its_count_back(fair: Producer, redis_client: Redis) -> None:
    _complaint(fair, "A")
    [claimed] = fair.queue.claim("w-fair", 1)
    assert _held(redis_client, fair) == {}
    outcome = fair.queue.retry(claimed.ticket.id, claimed.token, "complaint", "vLLM answered 503", backoff=0)
    assert outcome == "retry"
    assert _held(redis_client, fair) == {"A": 1}, "waiting again, so counted again"
    assert [c.ticket.id for c in fair.queue.claim("w-fair", 1)] == [claimed.ticket.id]
    assert _held(redis_client, fair) == {}


def _claim_order(producer: Producer) -> list[str]:
    """Ids in the order one-at-a-time claims take them, until the queue is empty."""
    order = []
    while batch := producer.queue.claim("w-turns", 1):
        order.append(batch[0].ticket.id)
    return order


def test_a_second_branch_is_served_before_the_floods_later_tickets(fair: Producer) -> None:
    flood = [_complaint(fair, "A").ticket_id for _ in range(CAP)]
    second = _complaint(fair, "B").ticket_id
    order = _claim_order(fair)
    assert order.index(second) == 1, "B's ticket takes the turn after A's first"
    assert order == [flood[0], second, *flood[1:]]


def test_three_branches_take_turns_and_priority_still_comes_first(fair: Producer) -> None:
    flood = [_complaint(fair, "A").ticket_id for _ in range(4)]
    b1, b2 = _complaint(fair, "B").ticket_id, _complaint(fair, "B").ticket_id
    vip = _complaint(fair, "C", vip_level=5).ticket_id  # a higher priority than any of them
    loan = fair.submit(TicketRequest(type="loan_approval", branch_id="A", prompt="approve?")).ticket_id
    order = _claim_order(fair)
    assert order[:2] == [loan, vip]  # other priorities are untouched by the turns
    assert order[2:] == [flood[0], b1, flood[1], b2, *flood[2:]]
