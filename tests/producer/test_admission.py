"""Admission control: the alarm level, the operator mode and KV watermarks decide admit or reject."""

from __future__ import annotations

import random

import pytest
from redis import Redis

from producer.admission import RETRY_AFTER_MAX, RETRY_AFTER_MIN, decide, retry_after_seconds, shed_rule
from producer.producer import Producer
from shared.control import ControlState, Mode, set_mode
from shared.keys import QueueKeys
from shared.models import TicketStatus
from shared.policy import AlarmLevel, Policy
from shared.shed import ShedCode
from tests.fake_clock import FakeClock
from tests.monitor.conftest import MonitorFactory
from tests.monitor.support import fill


def state(level: AlarmLevel = AlarmLevel.GREEN, **fields: object) -> ControlState:
    base: dict[str, object] = dict(
        level=level,
        level_since=None,
        published_at=None,
        mode=Mode.NORMAL,
        depth=0,
        drain_rate=None,
        kv_free_min=None,
        desired_workers=None,
    )
    base.update(fields)
    return ControlState(**base)  # type: ignore[arg-type]


def submit(producer: Producer, ticket_type: str, **fields: object):  # type: ignore[no-untyped-def]
    return producer.submit({"type": ticket_type, "branch_id": "b0412", "prompt": "hello", **fields})


def register_worker(client: Redis, keys: QueueKeys, worker_id: str, kv_usage: float, deadline: float) -> None:
    client.hset(keys.worker(worker_id), mapping={"gpu": "0", "kv_usage": kv_usage, "batch_limit": 8})
    client.zadd(keys.workers, {worker_id: deadline})


# ---- on a real queue with the monitor publishing ----------------------------------------------------
def test_red_rejects_complaints_with_retry_after_and_admits_loans(
    make_monitor: MonitorFactory, producer: Producer, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    fill(monitor.queue, 81)
    assert monitor.tick().level is AlarmLevel.RED
    rejected = submit(producer, "complaint", vip_level=2)
    assert rejected.outcome == "rejected"
    assert rejected.retry_after is not None and RETRY_AFTER_MIN <= rejected.retry_after <= RETRY_AFTER_MAX
    assert rejected.code is ShedCode.QUEUE_RED and "peak load" in rejected.reason
    stored = producer.get(rejected.ticket_id)
    assert stored is not None and stored.status is TicketStatus.REJECTED and stored.error == rejected.reason
    assert stored.shed_code == "queue_red"
    loan = submit(producer, "loan_approval", urgent_level=3, max_tokens=2000)
    assert loan.outcome == "queued"
    # Admission leaves max_tokens alone: the worker caps it once, at run time (tests/worker).
    assert loan.ticket is not None and loan.ticket.max_tokens == 2000
    counts = monitor.queue.stats().counts
    assert counts["complaint:rejected"] == 1 and counts["complaint:submitted"] == 1
    assert counts.get("loan_approval:rejected", 0) == 0


def test_orange_admits_archive_queries_while_their_deadline_can_be_met(
    make_monitor: MonitorFactory, producer: Producer, redis_client: Redis, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    fill(monitor.queue, 51)
    assert monitor.tick().level is AlarmLevel.ORANGE
    archive = submit(producer, "archive_query")
    assert archive.outcome == "queued"  # no drain measured yet: nothing says it would be late
    complaint = submit(producer, "complaint", max_tokens=1000)
    loan = submit(producer, "loan_approval", max_tokens=100)
    assert complaint.outcome == "queued" and loan.outcome == "queued"
    # Draining half a ticket a second, the tickets ahead would hold a new one past its 60 s SLO.
    redis_client.hset(monitor.keys.monitor_state, mapping={"service_rate": 0.5, "updated_at": fake_clock.at})
    late = submit(producer, "archive_query")
    assert late.outcome == "rejected" and late.code is ShedCode.DEADLINE_UNREACHABLE
    assert late.retry_after is not None and late.retry_after > 1


def test_an_archive_policy_that_sheds_at_orange_still_can(policy: Policy) -> None:
    shedding = policy.types["archive_query"].model_copy(update={"orange_action": "shed"})
    assert shed_rule(shedding, state(AlarmLevel.ORANGE, depth=60)) is ShedCode.QUEUE_ORANGE


def test_yellow_admits_everything_unchanged(
    make_monitor: MonitorFactory, producer: Producer, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    fill(monitor.queue, 31)
    assert monitor.tick().level is AlarmLevel.YELLOW
    archive = submit(producer, "archive_query", max_tokens=1000)
    assert archive.outcome == "queued" and archive.ticket is not None and archive.ticket.max_tokens == 1000


def test_red_admits_loans_only_up_to_their_own_cap(
    make_monitor: MonitorFactory,
    redis_client: Redis,
    policy: Policy,
    queue_name: str,
    fake_clock: FakeClock,
) -> None:
    loans = policy.types["loan_approval"].model_copy(update={"cap": 3})
    small = policy.model_copy(update={"types": {**policy.types, "loan_approval": loans}})
    monitor = make_monitor(small)
    fill(monitor.queue, 81)
    assert monitor.tick().level is AlarmLevel.RED
    producer = Producer(redis_client, small, queue_name, admission_cache_seconds=0)
    outcomes = [submit(producer, "loan_approval") for _ in range(4)]
    assert [r.outcome for r in outcomes] == ["queued"] * 3 + ["rejected"]
    assert outcomes[-1].code is ShedCode.TYPE_CAP and outcomes[-1].retry_after is not None
    assert "3 loan approval requests are already waiting" in outcomes[-1].reason


def test_kv_watermarks_shed_archive_then_complaint_never_loans(
    make_monitor: MonitorFactory, redis_client: Redis, producer: Producer, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    deadline = fake_clock.at + 60
    register_worker(redis_client, monitor.keys, "w-a", kv_usage=0.50, deadline=deadline)
    register_worker(redis_client, monitor.keys, "w-b", kv_usage=0.88, deadline=deadline)  # 12% free
    result = monitor.tick()
    assert result.sample is not None and result.sample.kv_free_min == pytest.approx(0.12)
    assert result.level is AlarmLevel.GREEN
    archive = submit(producer, "archive_query")
    assert archive.outcome == "rejected" and archive.code is ShedCode.KV_CACHE_FULL
    assert submit(producer, "complaint").outcome == "queued"
    redis_client.hset(monitor.keys.worker("w-b"), "kv_usage", 0.95)  # 5% free
    monitor.tick()
    assert submit(producer, "complaint").outcome == "rejected"
    assert submit(producer, "loan_approval").outcome == "queued"


def test_a_dead_monitors_kv_figure_is_not_trusted(
    make_monitor: MonitorFactory, redis_client: Redis, producer: Producer, fake_clock: FakeClock
) -> None:
    monitor = make_monitor()
    register_worker(redis_client, monitor.keys, "w-a", kv_usage=0.99, deadline=fake_clock.at + 600)
    monitor.tick()
    assert submit(producer, "archive_query").outcome == "rejected"
    fake_clock.advance(30)  # the monitor stopped publishing long ago
    assert submit(producer, "archive_query").outcome == "queued"


def test_level_is_derived_from_depth_when_no_monitor_publishes(
    producer: Producer, fake_clock: FakeClock
) -> None:
    fill(producer.queue, 81)
    assert submit(producer, "complaint").outcome == "rejected"
    assert submit(producer, "loan_approval").outcome == "queued"


def test_critical_only_mode_admits_only_loans(
    producer: Producer, redis_client: Redis, queue_name: str, fake_clock: FakeClock
) -> None:
    set_mode(redis_client, QueueKeys(queue_name), Mode.CRITICAL_ONLY, actor="test")
    complaint = submit(producer, "complaint")
    assert complaint.outcome == "rejected" and complaint.code is ShedCode.CRITICAL_ONLY
    assert submit(producer, "loan_approval").outcome == "queued"
    set_mode(redis_client, QueueKeys(queue_name), Mode.NORMAL, actor="test")
    assert submit(producer, "complaint").outcome == "queued"


# ---- the pure rule -----------------------------------------------------------------------------------
def test_retry_after_follows_depth_over_drain_with_jitter(policy: Policy) -> None:
    rng = random.Random(7)
    values = [retry_after_seconds(state(depth=100, drain_rate=5.0), rng) for _ in range(200)]
    assert all(16.0 <= v <= 24.0 for v in values)  # 100 / 5 = 20 s, ±20%
    assert len(set(values)) > 40  # 200 branches do not come back in the same second


@pytest.mark.parametrize(
    ("depth", "drain", "low", "high"),
    [(1000, 1.0, 60.0, 60.0), (1, 100.0, 1.0, 1.0), (50, 0.0, 24.0, 36.0), (50, None, 24.0, 36.0)],
)
def test_retry_after_is_clamped_and_has_a_default_without_drain(
    depth: int, drain: float | None, low: float, high: float
) -> None:
    rng = random.Random(1)
    for _ in range(50):
        assert low <= retry_after_seconds(state(depth=depth, drain_rate=drain), rng) <= high


def test_fallback_route_only_when_configured(policy: Policy) -> None:
    rng = random.Random(0)
    orange = state(AlarmLevel.ORANGE, depth=60)
    complaint = policy.types["complaint"]
    with_fallback = decide(complaint, orange, fallback_configured=True, rng=rng)
    without = decide(complaint, orange, fallback_configured=False, rng=rng)
    assert with_fallback.options.route == "fallback" and without.options.route is None
    loan = decide(policy.types["loan_approval"], orange, fallback_configured=True, rng=rng)
    assert loan.admitted and loan.options.route is None


def test_defer_policy_admits_with_a_deferral(policy: Policy) -> None:
    deferring = policy.types["archive_query"].model_copy(update={"orange_action": "defer"})
    decision = decide(
        deferring,
        state(AlarmLevel.ORANGE, depth=60, drain_rate=3.0),
        fallback_configured=False,
        rng=random.Random(3),
    )
    assert decision.admitted and 16.0 <= decision.options.defer_seconds <= 24.0


@pytest.mark.parametrize(
    ("ticket_type", "control", "code"),
    [
        ("complaint", state(mode=Mode.CRITICAL_ONLY), ShedCode.CRITICAL_ONLY),
        ("complaint", state(AlarmLevel.RED, depth=90), ShedCode.QUEUE_RED),
        ("archive_query", state(AlarmLevel.ORANGE, depth=60), None),
        ("archive_query", state(kv_free_min=0.01), ShedCode.KV_CACHE_FULL),
        ("complaint", state(AlarmLevel.ORANGE, depth=60), None),
        ("loan_approval", state(AlarmLevel.RED, depth=90, mode=Mode.CRITICAL_ONLY, kv_free_min=0.0), None),
    ],
)
def test_each_rule_names_its_code_and_the_decision_carries_it(
    policy: Policy, ticket_type: str, control: ControlState, code: ShedCode | None
) -> None:
    type_policy = policy.types[ticket_type]
    assert shed_rule(type_policy, control) is code
    decision = decide(type_policy, control, fallback_configured=False, rng=random.Random(0))
    assert decision.code is code and decision.admitted is (code is None)
    assert (
        decision.enqueue_options.shed is code and decision.enqueue_options.retry_after == decision.retry_after
    )


def test_a_cap_the_script_hit_is_refused_from_memory_until_the_cache_lapses(
    redis_client: Redis, policy: Policy, queue_name: str, fake_clock: FakeClock
) -> None:
    complaints = policy.types["complaint"].model_copy(update={"cap": 2})
    small = policy.model_copy(update={"types": {**policy.types, "complaint": complaints}})
    producer = Producer(redis_client, small, queue_name, admission_cache_seconds=1.0)
    queued = [submit(producer, "complaint") for _ in range(2)]
    refused = submit(producer, "complaint")  # the script's cap
    assert refused.code is ShedCode.TYPE_CAP
    for ticket in queued:  # room again, but admission does not ask for a second
        producer.cancel(ticket.ticket_id)
    fake_clock.advance(0.5)
    remembered = submit(producer, "complaint")
    assert remembered.code is ShedCode.TYPE_CAP and remembered.reason == refused.reason
    other_branch = producer.submit({"type": "complaint", "branch_id": "b0999", "prompt": "hello"})
    assert other_branch.outcome == "queued"  # the memory is the refused branch's alone
    fake_clock.advance(0.6)  # a second after the script's refusal; the remembered one renewed nothing
    assert submit(producer, "complaint").outcome == "queued"
    counts = producer.queue.stats()
    assert (
        counts.outcome_count("complaint", "rejected") == 2
        and counts.outcome_count("complaint", "submitted") == 6
    )
