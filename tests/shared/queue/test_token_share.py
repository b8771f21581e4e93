"""Fair share at admission, counted in weighted tokens (shared/lua/enqueue.lua, docs/fairness.md).

A ticket's weighted tokens are (input_weight × prompt tokens + output_weight × max_tokens) ÷ its
branch's weight, what the claim charges. While other branches wait for a type, a branch with
tickets queued is refused (branch_share_exceeded) when a ticket would take its queued weighted
tokens past S = cap ÷ Σ (queued tickets ÷ queued weighted tokens) over the waiting branches, so
that every waiting branch holding S fills the type's cap of tickets. The per-branch sums are kept
by every script that moves a ticket into or out of the queue, and vanish with the branch's last
ticket.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable

import pytest
from redis import Redis

from producer.producer import Producer
from shared import clock
from shared.models import TicketRequest, TicketStatus
from shared.policy import AlarmPolicy, FairnessPolicy, Policy
from shared.shed import ShedCode
from tests.fake_clock import FakeClock

SHORT_PROMPT = "my card was charged twice " * 8
LONG_PROMPT = SHORT_PROMPT * 10
MAX_TOKENS = 1
CAP = 110
TOKEN_UNITS = 1000
"""The branch tokens hash counts thousandths of a weighted token (shared/lua/lib/tickets.lua)."""


def _policy(policy: Policy, *, cap: int = CAP, weights: dict[str, float] | None = None) -> Policy:
    types = dict(policy.types)
    types["complaint"] = types["complaint"].model_copy(update={"cap": cap})
    fairness = FairnessPolicy(input_weight=1.0, output_weight=2.0, branch_weights=weights or {})
    alarms = AlarmPolicy(yellow=10_000, orange=20_000, red=30_000)  # only the script's rules refuse
    return policy.model_copy(update={"types": types, "fairness": fairness, "alarms": alarms})


def _producer(redis_client: Redis, policy: Policy, queue_name: str) -> Producer:
    return Producer(redis_client, policy, queue_name, admission_cache_seconds=0)


def _request(branch: str, prompt: str, **extra: object) -> TicketRequest:
    return TicketRequest(type="complaint", branch_id=branch, prompt=prompt, max_tokens=MAX_TOKENS, **extra)


def _weighted(fairness: FairnessPolicy, branch: str, prompt: str) -> float:
    """A ticket's weighted tokens, worked out here apart from the Lua."""
    tokens = _request(branch, prompt).prompt_tokens_estimate
    cost = fairness.input_weight * tokens + fairness.output_weight * MAX_TOKENS
    return cost / fairness.branch_weights.get(branch, 1.0)


def _share(cap: int, weighted: list[float]) -> float:
    """S for waiting branches whose tickets weigh `weighted` each."""
    return cap / sum(1 / w for w in weighted)


def _counts(redis_client: Redis, producer: Producer) -> dict[str, tuple[int, float]]:
    """Each waiting branch's queued tickets and weighted tokens of the type, as the scripts keep them."""
    keys = producer.queue.keys
    depth = redis_client.hgetall(keys.branch_depth("complaint"))
    tokens = redis_client.hgetall(keys.branch_tokens("complaint"))
    assert set(depth) == set(tokens), "a branch is in both hashes or in neither"
    return {branch: (int(depth[branch]), int(tokens[branch]) / TOKEN_UNITS) for branch in depth}


def _held(redis_client: Redis, producer: Producer) -> dict[str, tuple[int, float]]:
    """The same, worked out from the tickets queued now (the waiting zset and each ticket's hash)."""
    keys = producer.queue.keys
    held: dict[str, tuple[int, float]] = {}
    for ticket_id in redis_client.zrange(keys.waiting("complaint"), 0, -1):
        branch, weighted = redis_client.hmget(keys.ticket(ticket_id), ["branch_id", "weighted_tokens"])
        count, tokens = held.get(branch, (0, 0.0))
        held[branch] = (count + 1, tokens + math.floor(float(weighted) * TOKEN_UNITS + 0.5) / TOKEN_UNITS)
    return held


def _assert_counts_match(redis_client: Redis, producer: Producer) -> dict[str, tuple[int, float]]:
    counts, held = _counts(redis_client, producer), _held(redis_client, producer)
    assert counts.keys() == held.keys()
    for branch, (count, tokens) in held.items():
        assert counts[branch][0] == count
        assert counts[branch][1] == pytest.approx(tokens, rel=1e-12)
    return counts


def _alternate(producer: Producer, prompts: dict[str, str]) -> Counter[str]:
    """Submit one ticket of each branch in turn until each is refused; the tickets each got in."""
    queued: Counter[str] = Counter()
    refused: set[str] = set()
    while len(refused) < len(prompts):
        for branch, prompt in prompts.items():
            if branch in refused:
                continue
            result = producer.submit(_request(branch, prompt))
            if result.outcome == "queued":
                queued[branch] += 1
            else:
                assert result.code is ShedCode.BRANCH_SHARE, (branch, result.code)
                refused.add(branch)
            assert sum(queued.values()) <= 2 * CAP
    return queued


def test_a_branch_of_ten_times_longer_prompts_is_refused_at_a_tenth_of_the_tickets(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    fair = _policy(policy)
    producer = _producer(redis_client, fair, queue_name)
    short = _weighted(fair.fairness, "short", SHORT_PROMPT)
    long = _weighted(fair.fairness, "long", LONG_PROMPT)
    share = _share(CAP, [short, long])

    queued = _alternate(producer, {"short": SHORT_PROMPT, "long": LONG_PROMPT})

    assert queued["short"] == math.floor(share / short)
    assert queued["long"] == math.floor(share / long)
    assert queued["short"] / queued["long"] == pytest.approx(10, rel=0.1)
    assert queued["short"] + queued["long"] <= CAP, "both at their shares: the type holds its cap"
    counts = _assert_counts_match(redis_client, producer)
    assert counts["long"][1] == pytest.approx(counts["short"][1], abs=long), "equal tokens, within a ticket"


@pytest.mark.parametrize("first", ["short", "long"])
def test_the_share_does_not_depend_on_who_floods_first(
    redis_client: Redis, policy: Policy, queue_name: str, first: str
) -> None:
    fair = _policy(policy)
    producer = _producer(redis_client, fair, queue_name)
    prompts = {"short": SHORT_PROMPT, "long": LONG_PROMPT}
    second = "long" if first == "short" else "short"
    share = _share(CAP, [_weighted(fair.fairness, b, p) for b, p in prompts.items()])

    flood = [producer.submit(_request(first, prompts[first])) for _ in range(CAP + 1)]
    assert [r.outcome for r in flood].count("queued") == CAP  # alone, a branch fills the whole cap
    assert flood[-1].code is ShedCode.TYPE_CAP
    late = _alternate(producer, {second: prompts[second]})

    assert late[second] == math.floor(share / _weighted(fair.fairness, second, prompts[second]))
    refused = producer.submit(_request(first, prompts[first]))
    assert refused.code is ShedCode.BRANCH_SHARE
    assert refused.reason and "fair share" in refused.reason and "tokens" in refused.reason
    _assert_counts_match(redis_client, producer)


def test_a_branch_of_weight_two_holds_twice_the_tokens(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    fair = _policy(policy, cap=30, weights={"heavy": 2.0})
    producer = _producer(redis_client, fair, queue_name)

    queued = _alternate(producer, {"heavy": SHORT_PROMPT, "plain": SHORT_PROMPT})

    assert (queued["heavy"], queued["plain"]) == (20, 10), "S = 30 ÷ (2/c + 1/c) = 10c: 20 and 10 tickets"
    counts = _assert_counts_match(redis_client, producer)
    assert counts["heavy"][1] == pytest.approx(counts["plain"][1]), "the same weighted tokens ..."
    heavy_tokens = counts["heavy"][1] * 2.0
    assert heavy_tokens == pytest.approx(2 * counts["plain"][1]), "... so twice the tokens"


def test_a_batch_gets_the_verdicts_of_one_ticket_at_a_time(
    redis_client: Redis, policy: Policy, queue_name: str, second_queue: str
) -> None:
    # Branches of mixed prompt lengths, so their mean tickets (and the share) move as tickets come:
    # one call must keep its figures up to date ticket by ticket, across chunks, as separate calls do.
    fair = _policy(policy, cap=40, weights={"c": 3.0})
    draw = random.Random(7)
    batch = [_request(draw.choice("abc"), SHORT_PROMPT * draw.randint(1, 10)) for _ in range(300)]

    one_by_one = [_producer(redis_client, fair, queue_name).submit(r) for r in batch]
    together = _producer(redis_client, fair, second_queue).submit_many(batch)

    assert [(r.outcome, r.code) for r in together] == [(r.outcome, r.code) for r in one_by_one]
    assert Counter(r.code for r in together)[ShedCode.BRANCH_SHARE] > 50
    _assert_counts_match(redis_client, _producer(redis_client, fair, second_queue))


def test_a_tickets_weighted_tokens_are_what_the_claim_charges(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    fair = _policy(policy, weights={"heavy": 2.0})
    producer = _producer(redis_client, fair, queue_name)
    ticket_id = producer.submit(_request("heavy", LONG_PROMPT)).ticket_id
    keys = producer.queue.keys
    stored = float(redis_client.hget(keys.ticket(ticket_id), "weighted_tokens"))
    assert stored == pytest.approx(_weighted(fair.fairness, "heavy", LONG_PROMPT))
    [claimed] = producer.queue.claim("w-share", 1)
    assert claimed.ticket.id == ticket_id
    assert redis_client.zscore(keys.branch_service("complaint"), "heavy") == pytest.approx(stored)


# ---- the branch counts through every way out of the queue and back -------------------------------
# Each path runs while other tickets of the same branches stay queued (a second round with a longer
# TTL), and the counts are checked after every step: a branch's sum is dropped with its last ticket,
# so only a check while it still has tickets would catch a sum that drifts.

Path = Callable[[Producer, Redis, FakeClock, list[str]], None]


def _claim_all(producer: Producer, redis_client: Redis) -> list[tuple[str, str]]:
    """Claim one ticket at a time (ending expired ones met on the way) until none is left."""
    leases: list[tuple[str, str]] = []
    for _ in range(100):
        if not producer.queue.stats().depth_by_type["complaint"]:
            return leases
        leases += [(c.ticket.id, c.token) for c in producer.queue.claim("w-paths", 1)]
        _assert_counts_match(redis_client, producer)
    raise AssertionError(f"tickets still queued after 100 claims; {len(leases)} claimed")


def _by_claim(producer: Producer, redis_client: Redis, fake: FakeClock, first: list[str]) -> None:
    assert len(_claim_all(producer, redis_client)) == 2 * len(first)


def _by_cancel(producer: Producer, redis_client: Redis, fake: FakeClock, first: list[str]) -> None:
    for ticket_id in first:
        assert producer.cancel(ticket_id) == "queued"
        _assert_counts_match(redis_client, producer)
    _claim_all(producer, redis_client)


def _by_expiry_at_claim(producer: Producer, redis_client: Redis, fake: FakeClock, first: list[str]) -> None:
    fake.advance(120)
    assert len(_claim_all(producer, redis_client)) == len(first), "the first round expired on the way"
    assert {_status(producer, t) for t in first} == {TicketStatus.EXPIRED}


def _by_expiry_in_sweep(producer: Producer, redis_client: Redis, fake: FakeClock, first: list[str]) -> None:
    fake.advance(120)
    assert producer.queue.reap("r-paths").expired == len(first)
    _assert_counts_match(redis_client, producer)
    assert len(_claim_all(producer, redis_client)) == len(first)


def _by_expiry_on_read(producer: Producer, redis_client: Redis, fake: FakeClock, first: list[str]) -> None:
    fake.advance(120)
    for ticket_id in first:
        assert _status(producer, ticket_id) is TicketStatus.EXPIRED
        _assert_counts_match(redis_client, producer)
    assert len(_claim_all(producer, redis_client)) == len(first)


def _status(producer: Producer, ticket_id: str) -> TicketStatus:
    ticket = producer.get(ticket_id)
    assert ticket is not None
    return ticket.status


def _back_then_claimed(put_back: Callable[[Producer, int, str, str], None]) -> Path:
    """Claim every ticket and put each back one way (the counts take it back at the weight it
    left with), then claim them all again."""

    def path(producer: Producer, redis_client: Redis, fake: FakeClock, first: list[str]) -> None:
        queued = _counts(redis_client, producer)
        leases = _claim_all(producer, redis_client)
        for index, (ticket_id, token) in enumerate(leases):
            put_back(producer, index, ticket_id, token)
            _assert_counts_match(redis_client, producer)
        fake.advance(30)  # past every retry's backoff, within every TTL
        producer.queue.reap("r-paths")  # requeues lost leases, promotes due retries
        back = _assert_counts_match(redis_client, producer)
        assert back.keys() == queued.keys()
        for branch, (count, tokens) in queued.items():
            assert back[branch][0] == count and back[branch][1] == pytest.approx(tokens, rel=1e-12)
        assert len(_claim_all(producer, redis_client)) == len(leases)

    return path


def _retry(producer: Producer, index: int, ticket_id: str, token: str) -> None:
    backoff = 5.0 if index % 2 else 0.0  # half wait in the delayed set, half go straight back
    outcome = producer.queue.retry(ticket_id, token, "complaint", "vLLM answered 503", backoff=backoff)
    assert outcome == "retry"


def _preempt(producer: Producer, index: int, ticket_id: str, token: str) -> None:
    outcome = producer.queue.preempt(ticket_id, token, "complaint", "a loan waits", max_preemptions=3)
    assert outcome == "requeued"


def _lose_lease(producer: Producer, index: int, ticket_id: str, token: str) -> None:
    producer.queue.redis.zadd(producer.queue.keys.inflight, {ticket_id: 0})


PATHS: dict[str, Path] = {
    "claim": _by_claim,
    "cancel": _by_cancel,
    "expiry at claim": _by_expiry_at_claim,
    "expiry in the sweep": _by_expiry_in_sweep,
    "expiry on read": _by_expiry_on_read,
    "retry": _back_then_claimed(_retry),
    "preempt": _back_then_claimed(_preempt),
    "lost lease, reaped": _back_then_claimed(_lose_lease),
}


@pytest.mark.parametrize("way_out", list(PATHS))
def test_the_branch_counts_return_to_zero_whichever_way_tickets_leave(
    redis_client: Redis, policy: Policy, queue_name: str, monkeypatch: pytest.MonkeyPatch, way_out: str
) -> None:
    fake = FakeClock(clock.now()).install(monkeypatch)
    fair = _policy(policy, weights={"heavy": 2.0})
    producer = _producer(redis_client, fair, queue_name)
    branches = (("short", SHORT_PROMPT), ("long", LONG_PROMPT), ("heavy", LONG_PROMPT))

    def round_of(ttl: float) -> list[str]:
        requests = [_request(b, p, ttl_seconds=ttl) for b, p in branches for _ in range(2)]
        return [producer.submit(r).ticket_id for r in requests]

    first = round_of(60)  # the tickets a path ends (expiry paths: the ones whose TTL passes)
    fake.advance(1)
    round_of(600)
    counts = _assert_counts_match(redis_client, producer)
    assert {branch: count for branch, (count, _) in counts.items()} == {"short": 4, "long": 4, "heavy": 4}

    PATHS[way_out](producer, redis_client, fake, first)

    keys = producer.queue.keys
    assert redis_client.exists(keys.branch_depth("complaint"), keys.branch_tokens("complaint")) == 0


def test_the_branch_hashes_are_hash_tables_from_their_first_ticket(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    """A type's branch hashes hold a field per waiting branch, hundreds of them at a bank: kept as a
    listpack (Redis's small encoding, up to `hash-max-listpack-entries` fields) every count a claim
    or a submission makes would scan them all. They are made hash tables when their first branch
    arrives, again after they empty, and the field that converts them is gone at once."""
    producer = _producer(redis_client, _policy(policy), queue_name)
    keys = producer.queue.keys
    hashes = (keys.branch_depth("complaint"), keys.branch_tokens("complaint"))
    for _ in range(2):
        ticket_id = producer.submit(_request("0412", SHORT_PROMPT)).ticket_id
        assert [redis_client.object("encoding", key) for key in hashes] == ["hashtable", "hashtable"]
        assert _counts(redis_client, producer).keys() == {"0412"}
        assert producer.queue.cancel(ticket_id) == "queued"
        assert redis_client.exists(*hashes) == 0
