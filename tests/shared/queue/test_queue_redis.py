"""The ticket queue on a real redis-server: order, TTLs, idempotency, caps, leases, retries."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis

from shared.models import TicketRequest, TicketStatus
from shared.policy import Policy
from shared.queue import EnqueueOptions, TicketQueue
from shared.rejected import slot, unpacked
from shared.shed import ShedCode
from tests.fake_clock import FakeClock


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    yield FakeClock().install(monkeypatch)


def req(ticket_type: str, **kw: Any) -> TicketRequest:
    kw.setdefault("prompt", "hello")
    return TicketRequest(type=ticket_type, branch_id=kw.pop("branch_id", "0412"), **kw)


def claim_order(queue: TicketQueue, n: int = 100) -> list[str]:
    return [c.ticket.id for c in queue.claim("w", n)]


def test_priority_order_across_types_and_factors(ticket_queue: TicketQueue, fake_clock: FakeClock) -> None:
    specs = [
        ("archive_query", {"is_bulk": True}),  # 2.2
        ("archive_query", {}),  # 2.0
        ("complaint", {}),  # 1.0
        ("complaint", {"vip_level": 2}),  # 0.9
        ("loan_approval", {}),  # 0
        ("loan_approval", {"urgent_level": 3}),  # -0.3
    ]
    ids = []
    for ticket_type, kw in specs:
        ids.append(ticket_queue.enqueue(req(ticket_type, **kw)).ticket_id)
        fake_clock.advance(0.001)
    assert claim_order(ticket_queue) == list(reversed(ids))


def test_fifo_within_a_priority(ticket_queue: TicketQueue, fake_clock: FakeClock) -> None:
    ids = []
    for _ in range(50):
        ids.append(ticket_queue.enqueue(req("complaint")).ticket_id)
        fake_clock.advance(0.0001)
    assert claim_order(ticket_queue) == ids


def test_same_instant_ties_break_fifo_by_id(ticket_queue: TicketQueue, fake_clock: FakeClock) -> None:
    results = ticket_queue.enqueue_many([req("complaint") for _ in range(20)])
    assert claim_order(ticket_queue) == [r.ticket_id for r in results]


def test_aging_lets_an_old_archive_query_overtake_a_fresh_loan(
    ticket_queue: TicketQueue, fake_clock: FakeClock, policy: Policy
) -> None:
    archive = ticket_queue.enqueue(req("archive_query", ttl_seconds=3600)).ticket_id
    fake_clock.advance(2 * policy.queue.aging_seconds - 1)
    early_loan = ticket_queue.enqueue(req("loan_approval")).ticket_id
    fake_clock.advance(2)
    late_loan = ticket_queue.enqueue(req("loan_approval")).ticket_id
    assert claim_order(ticket_queue) == [early_loan, archive, late_loan]


def test_strict_priority_when_aging_is_off(redis_client: Redis, policy: Policy, queue_name: str) -> None:
    strict = policy.model_copy(update={"queue": policy.queue.model_copy(update={"aging_seconds": 0})})
    queue = TicketQueue(redis_client, strict, queue_name)
    archive = queue.enqueue(req("archive_query")).ticket_id
    loan = queue.enqueue(req("loan_approval")).ticket_id
    assert claim_order(queue) == [loan, archive]


def test_expired_tickets_are_never_processed(ticket_queue: TicketQueue, fake_clock: FakeClock) -> None:
    short = ticket_queue.enqueue(req("loan_approval", ttl_seconds=1)).ticket_id
    long = ticket_queue.enqueue(req("complaint")).ticket_id
    fake_clock.advance(2)
    assert claim_order(ticket_queue) == [long]
    expired = ticket_queue.get(short)
    assert expired is not None and expired.status is TicketStatus.EXPIRED
    assert expired.error == "TTL passed while queued"
    assert ticket_queue.stats().outcome_count("loan_approval", "expired") == 1


def test_reaper_expires_queued_tickets_without_a_worker(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    ids = [ticket_queue.enqueue(req("loan_approval", ttl_seconds=5)).ticket_id for _ in range(3)]
    fake_clock.advance(6)
    result = ticket_queue.reap("test")
    assert result.swept and result.expired == 3
    assert all(t is not None and t.status is TicketStatus.EXPIRED for t in ticket_queue.get_many(ids))
    assert ticket_queue.stats().depth == 0


def test_idempotency_key_returns_the_existing_ticket(ticket_queue: TicketQueue) -> None:
    first = ticket_queue.enqueue(req("complaint", idempotency_key="abc"))
    second = ticket_queue.enqueue(req("complaint", idempotency_key="abc"))
    other_branch = ticket_queue.enqueue(req("complaint", idempotency_key="abc", branch_id="0999"))
    assert (first.outcome, second.outcome, other_branch.outcome) == ("queued", "existing", "queued")
    assert second.ticket_id == first.ticket_id != other_branch.ticket_id
    assert ticket_queue.stats().depth == 2


def test_type_cap_rejects_and_records(redis_client: Redis, policy: Policy, queue_name: str) -> None:
    types = dict(policy.types)
    types["complaint"] = types["complaint"].model_copy(update={"cap": 3})
    queue = TicketQueue(redis_client, policy.model_copy(update={"types": types}), queue_name)
    results = queue.enqueue_many([req("complaint") for _ in range(5)])
    assert [r.outcome for r in results] == ["queued"] * 3 + ["rejected"] * 2
    answered = results[-1].ticket  # what the submitter is told at once names the cap too
    assert results[-1].code is ShedCode.TYPE_CAP
    assert (
        answered is not None
        and answered.error == "3 complaint requests are already waiting, the most we hold at once"
    )
    rejected = queue.get(results[-1].ticket_id)
    assert rejected is not None and rejected.status is TicketStatus.REJECTED
    assert rejected.error == answered.error and rejected.shed_code == "type_cap_reached"
    assert queue.enqueue(req("loan_approval")).outcome == "queued"  # other types unaffected
    assert queue.stats().outcome_count("complaint", "rejected") == 2


def test_claim_leases_with_fresh_fencing_tokens(ticket_queue: TicketQueue) -> None:
    ticket_queue.enqueue_many([req("complaint") for _ in range(3)])
    claimed = ticket_queue.claim("w1", 3)
    assert len({c.token for c in claimed}) == 3
    assert all(c.ticket.status is TicketStatus.RUNNING and c.ticket.attempts == 1 for c in claimed)
    first = claimed[0]
    assert ticket_queue.extend(first.ticket.id, "999999") == "stale:running"
    assert ticket_queue.finish(first.ticket.id, "999999", "done", result="forged") is False
    assert ticket_queue.finish(first.ticket.id, first.token, "done", result="answer", usage={"x": 1})
    done = ticket_queue.get(first.ticket.id)
    assert done is not None and done.status is TicketStatus.DONE and done.result == "answer"
    assert ticket_queue.finish(first.ticket.id, first.token, "done", result="twice") is False
    assert ticket_queue.stats().inflight == 2


def test_dead_lease_returns_to_queue_and_old_holder_cannot_write(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint")).ticket_id
    old = ticket_queue.claim("dead-worker", 1, lease_seconds=5)[0]
    fake_clock.advance(6)
    assert ticket_queue.reap("test").requeued == 1
    requeued = ticket_queue.get(ticket_id)
    assert requeued is not None and requeued.status is TicketStatus.QUEUED
    new = ticket_queue.claim("live-worker", 1)[0]
    assert new.ticket.id == ticket_id and new.ticket.attempts == 2
    assert ticket_queue.finish(ticket_id, old.token, "done", result="late answer") is False
    assert ticket_queue.extend(ticket_id, old.token) == "stale:running"
    assert ticket_queue.finish(ticket_id, new.token, "done", result="answer")
    final = ticket_queue.get(ticket_id)
    assert final is not None and final.result == "answer" and final.worker == "live-worker"


def test_max_attempts_ends_failed_with_the_reason(ticket_queue: TicketQueue, policy: Policy) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint")).ticket_id
    outcomes = []
    for _ in range(policy.queue.max_attempts):
        claimed = ticket_queue.claim("w", 1)[0]
        outcomes.append(ticket_queue.retry(ticket_id, claimed.token, "complaint", "vLLM 503", backoff=0))
    assert outcomes == ["retry"] * (policy.queue.max_attempts - 1) + ["failed"]
    failed = ticket_queue.get(ticket_id)
    assert failed is not None and failed.status is TicketStatus.FAILED
    assert failed.error == f"failed after {policy.queue.max_attempts} attempts: vLLM 503"


def test_lease_expiry_counts_toward_max_attempts(
    ticket_queue: TicketQueue, fake_clock: FakeClock, policy: Policy
) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint", ttl_seconds=3600)).ticket_id
    for _ in range(policy.queue.max_attempts):
        assert ticket_queue.claim("w", 1, lease_seconds=1)
        fake_clock.advance(2)
        ticket_queue.redis.delete(ticket_queue.keys.reaper_lock)  # the last round's, in real time
        assert ticket_queue.reap("test", interval_seconds=0.001).swept
    failed = ticket_queue.get(ticket_id)
    assert failed is not None and failed.status is TicketStatus.FAILED
    assert "lease expired" in (failed.error or "")


def test_retry_backoff_waits_in_delayed_set(ticket_queue: TicketQueue, fake_clock: FakeClock) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint")).ticket_id
    claimed = ticket_queue.claim("w", 1)[0]
    assert ticket_queue.retry(ticket_id, claimed.token, "complaint", "timeout", backoff=10) == "retry"
    stats = ticket_queue.stats()
    assert (stats.pending, stats.delayed, stats.depth_by_type["complaint"]) == (0, 1, 1)
    assert ticket_queue.claim("w", 1) == []
    fake_clock.advance(11)
    again = ticket_queue.claim("w", 1)
    assert [c.ticket.id for c in again] == [ticket_id]


def test_uncounted_retry_keeps_attempts(ticket_queue: TicketQueue) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint")).ticket_id
    claimed = ticket_queue.claim("w", 1)[0]
    ticket_queue.retry(ticket_id, claimed.token, "complaint", "shutdown", backoff=0, count_attempt=False)
    assert ticket_queue.claim("w", 1)[0].ticket.attempts == 1


def test_cancel_queued_and_running(ticket_queue: TicketQueue) -> None:
    queued = ticket_queue.enqueue(req("complaint")).ticket_id
    running = ticket_queue.enqueue(req("loan_approval")).ticket_id
    lease = ticket_queue.claim("w", 1)[0]
    assert lease.ticket.id == running
    assert ticket_queue.cancel(queued) == "queued"
    # Gone from every index, the per-type waiting set included (the type is read inside the script).
    keys = ticket_queue.keys
    for index in (keys.pending, keys.deadlines, keys.waiting("complaint")):
        assert ticket_queue.redis.zscore(index, queued) is None
    assert ticket_queue.cancel(running) == "running"
    assert ticket_queue.extend(running, lease.token) == "stale:cancelled"
    assert ticket_queue.finish(running, lease.token, "done", result="x") is False
    assert ticket_queue.cancel(running) == "cancelled"
    assert ticket_queue.cancel("no-such-id") == "missing"
    stats = ticket_queue.stats()
    assert (stats.depth, stats.inflight) == (0, 0)


def test_finished_tickets_expire_after_retention(
    ticket_queue: TicketQueue, redis_client: Redis, policy: Policy
) -> None:
    ticket_id = ticket_queue.enqueue(req("complaint")).ticket_id
    assert redis_client.ttl(ticket_queue.keys.ticket(ticket_id)) == -1  # queued tickets never vanish
    lease = ticket_queue.claim("w", 1)[0]
    ticket_queue.finish(ticket_id, lease.token, "done", result="x")
    ttl = int(redis_client.ttl(ticket_queue.keys.ticket(ticket_id)))  # type: ignore[arg-type]
    assert policy.queue.retention_seconds - 5 < ttl <= policy.queue.retention_seconds


def test_stats_depth_and_oldest_age_per_type(ticket_queue: TicketQueue, fake_clock: FakeClock) -> None:
    ticket_queue.enqueue(req("archive_query"))
    fake_clock.advance(10)
    ticket_queue.enqueue_many([req("complaint"), req("complaint")])
    fake_clock.advance(5)
    stats = ticket_queue.stats()
    assert stats.depth_by_type == {"loan_approval": 0, "complaint": 2, "archive_query": 1}
    assert stats.oldest_age_by_type["archive_query"] == pytest.approx(15, abs=0.01)
    assert stats.oldest_age_by_type["complaint"] == pytest.approx(5, abs=0.01)
    assert stats.depth == 3


def test_token_budget_stops_before_an_oversized_ticket(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    small = [ticket_queue.enqueue(req("complaint", max_tokens=100)).ticket_id for _ in range(3)]
    fake_clock.advance(0.01)
    big = ticket_queue.enqueue(req("complaint", prompt="x" * 40_000, max_tokens=1000)).ticket_id
    taken = ticket_queue.claim("w", 10, token_budget=1000)
    assert [c.ticket.id for c in taken] == small  # 3 × 102 fit, the 11k-token one does not
    assert [c.ticket.id for c in ticket_queue.claim("w", 10, token_budget=1000)] == [big]  # idle: taken alone
    assert ticket_queue.claim("w", 10, token_budget=1000, take_first_over_budget=False) == []


def test_deferred_ticket_waits_then_runs(ticket_queue: TicketQueue, fake_clock: FakeClock) -> None:
    ticket_id = ticket_queue.enqueue(req("archive_query"), EnqueueOptions(defer_seconds=30)).ticket_id
    assert ticket_queue.claim("w", 1) == []
    assert ticket_queue.stats().depth_by_type["archive_query"] == 1
    fake_clock.advance(31)
    assert claim_order(ticket_queue) == [ticket_id]


def test_degrade_options_route_and_leave_max_tokens_to_the_worker(ticket_queue: TicketQueue) -> None:
    ticket_id = ticket_queue.enqueue(
        req("complaint", max_tokens=500), EnqueueOptions(route="fallback")
    ).ticket_id
    ticket = ticket_queue.get(ticket_id)
    assert ticket is not None and ticket.max_tokens == 500 and ticket.route == "fallback"


def test_a_shed_ticket_leaves_a_lean_record_in_a_shared_bucket_with_its_own_retention(
    ticket_queue: TicketQueue, redis_client: Redis
) -> None:
    prompt = "why was my card blocked? " * 400
    shed = EnqueueOptions(shed=ShedCode.QUEUE_RED, retry_after=12.5)
    result = ticket_queue.enqueue(req("complaint", prompt=prompt), shed)
    assert result.outcome == "rejected" and result.code is ShedCode.QUEUE_RED
    assert not redis_client.exists(ticket_queue.keys.ticket(result.ticket_id))  # no key of its own
    bucket, field = slot(ticket_queue.keys, result.ticket_id)
    stored = unpacked(result.ticket_id, redis_client.hget(bucket, field))
    assert "prompt" not in stored and "messages" not in stored and "callback_url" not in stored
    assert stored["shed_code"] == "queue_red" and stored["retry_after"] == "12.5"
    assert int(stored["prompt_chars"]) == len(prompt) and len(stored["prompt_digest"]) == 16
    assert 0 < redis_client.ttl(bucket) <= ticket_queue.policy.queue.rejected_retention_seconds
    ticket = ticket_queue.get(result.ticket_id)
    assert ticket is not None and ticket.status is TicketStatus.REJECTED and ticket.prompt is None
    assert ticket.error == ticket_queue.shed_words(ShedCode.QUEUE_RED, "complaint")
    assert ticket.expires_at == pytest.approx(ticket.created_at + ticket.ttl_seconds)
    assert ticket_queue.get_many([result.ticket_id, "0" * 26]) == [ticket, None]
    assert ticket_queue.get(result.ticket_id[:7]) is None  # a bucket is no ticket
    assert ticket_queue.cancel(result.ticket_id) == "rejected"  # ended already: nothing changes


@pytest.mark.parametrize("with_key", [False, True])
def test_a_thousand_shed_submissions_cost_at_most_300_bytes_each(
    ticket_queue: TicketQueue, redis_client: Redis, with_key: bool
) -> None:
    shed = EnqueueOptions(shed=ShedCode.QUEUE_RED, retry_after=1.0)
    requests_ = [
        req(
            "complaint",
            prompt=f"my card was charged twice, case {i}",
            idempotency_key=f"{uuid.uuid4()}" if with_key else None,
        )
        for i in range(1000)
    ]
    results = ticket_queue.enqueue_many(requests_, [shed] * len(requests_))
    assert {r.outcome for r in results} == {"rejected"}
    tag = ticket_queue.keys.prefix.replace("{", "\\{").replace("}", "\\}")
    stored = [k for k in redis_client.scan_iter(match=tag + "*") if ":t:" in k or ":idem:" in k]
    total = sum(int(redis_client.memory_usage(k, samples=0)) for k in stored)
    assert total / len(results) <= 300, f"{total / len(results):.0f} B per shed submission"


def test_retries_under_one_idempotency_key_reuse_one_record_until_admitted(
    ticket_queue: TicketQueue, redis_client: Redis
) -> None:
    shed = EnqueueOptions(shed=ShedCode.QUEUE_ORANGE, retry_after=3.0)
    tries = [ticket_queue.enqueue(req("archive_query", idempotency_key="retry-me"), shed) for _ in range(5)]
    assert {t.outcome for t in tries} == {"rejected"} and len({t.ticket_id for t in tries}) == 1
    tag = ticket_queue.keys.ticket_prefix.replace("{", "\\{").replace("}", "\\}")
    assert len(list(redis_client.scan_iter(match=tag + "*"))) == 1
    admitted = ticket_queue.enqueue(req("archive_query", idempotency_key="retry-me"))
    assert admitted.outcome == "queued" and admitted.ticket_id == tries[0].ticket_id
    ticket = ticket_queue.get(admitted.ticket_id)
    assert ticket is not None and ticket.status is TicketStatus.QUEUED and ticket.prompt == "hello"
    assert ticket.shed_code is None and redis_client.ttl(ticket_queue.keys.ticket(ticket.id)) == -1
    again = ticket_queue.enqueue(req("archive_query", idempotency_key="retry-me"))
    assert again.outcome == "existing" and again.ticket_id == ticket.id
    counts = ticket_queue.stats().counts
    assert counts["archive_query:submitted"] == 6 and counts["archive_query:rejected"] == 5


def test_retention_per_outcome_and_prompts_dropped_when_not_kept(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    queue_policy = policy.queue.model_copy(
        update={"keep_prompts": False, "retention_by_outcome": {"done": 100, "cancelled": 50}}
    )
    queue = TicketQueue(redis_client, policy.model_copy(update={"queue": queue_policy}), queue_name)
    done_id, cancelled_id = (queue.enqueue(req("complaint", prompt=f"p{i}")).ticket_id for i in range(2))
    assert queue.cancel(cancelled_id) == "queued"
    lease = queue.claim("w", 1)[0]
    assert queue.finish(lease.ticket.id, lease.token, "done", result="the answer")
    done = queue.get(done_id)
    assert done is not None and done.result == "the answer" and done.prompt is None
    assert done.prompt_digest is not None and done.prompt_chars == 2
    assert 90 < redis_client.ttl(queue.keys.ticket(done_id)) <= 100
    assert 40 < redis_client.ttl(queue.keys.ticket(cancelled_id)) <= 50


def test_every_key_carries_the_queue_hash_tag(ticket_queue: TicketQueue, redis_client: Redis) -> None:
    ticket_queue.enqueue(req("complaint", idempotency_key="k"))
    lease = ticket_queue.claim("w", 1)[0]
    ticket_queue.retry(lease.ticket.id, lease.token, "complaint", "x", backoff=5)
    ticket_queue.reap("t")
    tag = ticket_queue.keys.prefix
    keys = list(redis_client.scan_iter(match=tag.replace("{", "\\{").replace("}", "\\}") + "*"))
    assert len(keys) >= 6 and all(k.startswith(tag + ":") for k in keys)


def test_wait_for_work_wakes_on_enqueue(ticket_queue: TicketQueue) -> None:
    assert ticket_queue.wait_for_work(0.05) is False
    ticket_queue.enqueue(req("complaint"))
    assert ticket_queue.wait_for_work(1.0) is True


def test_lua_scripts_run_on_fakeredis(policy: Policy) -> None:
    """The embedded demo fallback runs the same Lua on fakeredis."""
    fakeredis = pytest.importorskip("fakeredis")
    queue = TicketQueue(fakeredis.FakeRedis(decode_responses=True), policy, "fake")
    ids = [
        r.ticket_id for r in queue.enqueue_many([req("archive_query"), req("loan_approval", urgent_level=1)])
    ]
    claimed = queue.claim("w", 2)
    assert [c.ticket.id for c in claimed] == list(reversed(ids))
    for c in claimed:
        assert queue.finish(c.ticket.id, c.token, "done", result="ok")
    assert queue.reap("x").swept
    assert list(itertools.chain(queue.stats().counts)) != []


def test_normal_share_full_claims_on_only_while_the_head_is_critical(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    old_complaint = ticket_queue.enqueue(req("complaint")).ticket_id
    fake_clock.advance(61)  # aged by more than the one point between the types: ahead of new loans
    loans = [ticket_queue.enqueue(req("loan_approval")).ticket_id for _ in range(2)]
    complaint = ticket_queue.enqueue(req("complaint")).ticket_id
    # No normal room: the complaint at the head is not skipped, so nothing is taken.
    assert ticket_queue.claim("w", 5, normal_count=0) == []
    # One normal slot: the old complaint takes it, the loans behind it go on into the headroom, and
    # the next complaint stops the claim although slots are left.
    taken = ticket_queue.claim("w", 5, normal_count=1)
    assert [c.ticket.id for c in taken] == [old_complaint, *loans]
    assert [c.ticket.id for c in ticket_queue.claim("w", 5)] == [complaint]


def test_normal_budget_holds_back_other_types_but_not_critical_ones(
    ticket_queue: TicketQueue, fake_clock: FakeClock
) -> None:
    loan = ticket_queue.enqueue(req("loan_approval", max_tokens=400)).ticket_id
    fake_clock.advance(0.01)
    complaint = ticket_queue.enqueue(req("complaint", max_tokens=400)).ticket_id
    # 1,000 tokens in all, 500 of them for other types: the loan uses the headroom's part of the
    # budget, and the complaint would take the total over the normal 500.
    taken = ticket_queue.claim("w", 5, token_budget=1000, normal_budget=500, take_first_over_budget=False)
    assert [c.ticket.id for c in taken] == [loan]
    assert (
        ticket_queue.claim("w", 5, token_budget=1000, normal_budget=300, take_first_over_budget=False) == []
    )
    taken = ticket_queue.claim("w", 5, token_budget=1000, normal_budget=500, take_first_over_budget=False)
    assert [c.ticket.id for c in taken] == [complaint]
