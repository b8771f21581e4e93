"""Token-weighted fair share (the virtual token counter of "Fairness in Serving Large Language
Models", OSDI'24) in the claim script, on a real Redis.

The bound, adapted from the paper's theorem for two clients that stay backlogged: with U the most
weighted tokens one ticket costs (input_weight · prompt + output_weight · max_tokens, divided by
its branch's weight), the weighted service of any two backlogged branches differs by at most 2U at
any moment. A batch claim picks ticket by ticket and counts each pick before the next, so a batch
is the paper's sequence of dispatches and the same bound holds after every claim.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from redis import Redis

from producer.producer import Producer
from shared.models import Ticket, TicketRequest
from shared.policy import AlarmPolicy, FairnessPolicy, Policy
from shared.queue import TicketQueue

SHORT_PROMPT = "my card was charged twice " * 8
LONG_PROMPT = SHORT_PROMPT * 10
MAX_TOKENS = 8
BATCH = 4


def _policy(policy: Policy, weights: dict[str, float] | None = None) -> Policy:
    types = dict(policy.types)
    types["complaint"] = types["complaint"].model_copy(update={"cap": 10_000})
    fairness = FairnessPolicy(input_weight=1.0, output_weight=2.0, branch_weights=weights or {})
    alarms = AlarmPolicy(yellow=10_000, orange=20_000, red=30_000)  # a long backlog, no shedding
    return policy.model_copy(update={"types": types, "fairness": fairness, "alarms": alarms})


def _submit(producer: Producer, branch: str, prompt: str, count: int) -> None:
    request = TicketRequest(type="complaint", branch_id=branch, prompt=prompt, max_tokens=MAX_TOKENS)
    for _ in range(count):
        assert producer.submit(request).outcome == "queued"


def _cost(fairness: FairnessPolicy, ticket: Ticket) -> float:
    """What the claim counts for `ticket`, before its branch's weight."""
    return fairness.input_weight * ticket.prompt_tokens_estimate + fairness.output_weight * ticket.max_tokens


def _serve_while_backlogged(
    queue: TicketQueue, pending: Counter[str], fairness: FairnessPolicy, bound: float
) -> tuple[dict[str, float], int]:
    """Claim batches while every branch still has tickets queued; after each claim, check that
    weighted service per unit of weight differs by at most `bound` between any two branches."""
    served: dict[str, float] = defaultdict(float)
    claims = 0
    while all(n > 0 for n in pending.values()):
        batch = queue.claim("w", BATCH)
        assert batch, "backlogged branches left nothing to claim"
        claims += 1
        for item in batch:
            branch = item.ticket.branch_id
            served[branch] += _cost(fairness, item.ticket)
            pending[branch] -= 1
        normalized = [served[b] / fairness.branch_weights.get(b, 1.0) for b in pending]
        assert max(normalized) - min(normalized) <= bound, (claims, dict(served))
    return served, claims


def test_a_branch_with_ten_times_longer_prompts_gets_no_more_tokens(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    fair = _policy(policy)
    producer = Producer(redis_client, fair, queue_name, admission_cache_seconds=0)
    _submit(producer, "long", LONG_PROMPT, 60)  # the long one's flood arrives first
    _submit(producer, "short", SHORT_PROMPT, 300)
    queue = TicketQueue(redis_client, fair, queue_name)
    bound = 2 * _largest_cost(fair.fairness)

    served, claims = _serve_while_backlogged(queue, Counter({"long": 60, "short": 300}), fair.fairness, bound)
    assert claims >= 10, "measured over a long enough backlog"
    assert abs(served["long"] - served["short"]) <= bound
    assert served["short"] > 0 and served["long"] > 0


def test_a_branch_of_weight_two_gets_twice_the_tokens(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    fair = _policy(policy, {"heavy": 2.0})
    producer = Producer(redis_client, fair, queue_name, admission_cache_seconds=0)
    for branch, prompt in (("heavy", SHORT_PROMPT), ("plain", LONG_PROMPT), ("other", SHORT_PROMPT)):
        _submit(producer, branch, prompt, 120)
    queue = TicketQueue(redis_client, fair, queue_name)
    bound = 2 * _largest_cost(fair.fairness)  # the long prompts of a branch of weight 1

    served, _ = _serve_while_backlogged(
        queue, Counter({"heavy": 120, "plain": 120, "other": 120}), fair.fairness, bound
    )
    assert served["heavy"] / 2 == pytest.approx(served["plain"], abs=bound)
    assert served["heavy"] / 2 == pytest.approx(served["other"], abs=bound)
    assert served["heavy"] > 1.5 * max(served["plain"], served["other"])


def _largest_cost(fairness: FairnessPolicy) -> float:
    """U: the weighted tokens of one long-prompt ticket (the costliest here, at weight 1)."""
    prompt = TicketRequest(type="complaint", branch_id="x", prompt=LONG_PROMPT).prompt_tokens_estimate
    return fairness.input_weight * prompt + fairness.output_weight * MAX_TOKENS


def test_a_branch_that_starts_waiting_is_lifted_to_the_least_service(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    fair = _policy(policy)
    producer = Producer(redis_client, fair, queue_name, admission_cache_seconds=0)
    queue = TicketQueue(redis_client, fair, queue_name)
    _submit(producer, "early", SHORT_PROMPT, 40)
    _submit(producer, "busy", SHORT_PROMPT, 40)
    for _ in range(5):
        queue.claim("w", BATCH)
    service_key = queue.keys.branch_service("complaint")
    least = min(score for _, score in redis_client.zrange(service_key, 0, -1, withscores=True))
    _submit(producer, "late", SHORT_PROMPT, 10)
    assert redis_client.zscore(service_key, "late") == pytest.approx(least)
    taken = [c.ticket.branch_id for c in queue.claim("w", 6)]
    assert taken.count("late") <= 3, "the newcomer takes its turn, not every turn it missed"


def test_a_stale_entry_in_the_least_served_branchs_queue_is_dropped_and_its_next_ticket_taken(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    """The pick reads the least served branch's first ticket with its fields; one whose hash is
    gone (its retention ran out) leaves the branch's queue and the next one is taken."""
    fair = _policy(policy)
    producer = Producer(redis_client, fair, queue_name, admission_cache_seconds=0)
    queue = TicketQueue(redis_client, fair, queue_name)
    _submit(producer, "ahead", SHORT_PROMPT, 3)
    _submit(producer, "behind", SHORT_PROMPT, 3)
    service_key = queue.keys.branch_service("complaint")
    redis_client.zadd(service_key, {"ahead": 1_000.0, "behind": 0.0})
    branch_queue = queue.keys.branch_queue("complaint", "behind")
    stale, *live = redis_client.zrange(branch_queue, 0, -1)
    redis_client.delete(queue.keys.ticket(stale))
    redis_client.zrem(queue.keys.pending, stale)  # as the claim drops an entry whose hash is gone

    (taken,) = queue.claim("w", 1)
    assert taken.ticket.id == live[0], "the least served branch's next live ticket"
    assert redis_client.zrange(branch_queue, 0, -1) == live[1:]
