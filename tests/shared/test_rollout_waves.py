"""Canary waves by branch digit, the stored rollout state, shadow sampling and call outcomes."""

from __future__ import annotations

import pytest

from shared.models import TicketRequest
from shared.queue import TicketQueue
from shared.rollout import LAST_WAVE, WAVES, RolloutState, RolloutStatus, branch_digit, routes_to_candidate
from worker.rollout_routing import call_outcome
from worker.shadow import sampled, shadow_copy
from worker.vllm_client import ErrorKind, VllmClient, VllmError


@pytest.mark.parametrize(("branch", "digit"), [("b0412", 2), ("7", 7), ("branch-30", 0), ("b9", 9)])
def test_a_branch_ending_in_a_digit_is_in_that_wave(branch: str, digit: int) -> None:
    assert branch_digit(branch) == digit


def test_a_branch_without_a_final_digit_gets_a_stable_hash_digit() -> None:
    names = [f"branch-{chr(97 + i)}{chr(97 + j)}" for i in range(26) for j in range(26)]
    digits = [branch_digit(name) for name in names]
    assert digits == [branch_digit(name) for name in names], "the same digit every time"
    assert set(digits) == set(range(10)), "spread over every wave"
    assert max(digits.count(d) for d in range(10)) < 2 * len(names) / 10


def test_wave_k_routes_every_branch_whose_digit_is_k_or_lower() -> None:
    for wave in range(WAVES):
        on = {d for d in range(10) if routes_to_candidate(f"b{d}", RolloutStatus.RUNNING, wave)}
        assert on == set(range(wave + 1))
    assert routes_to_candidate("b3", RolloutStatus.PAUSED, 3), "a pause holds the wave, it does not undo it"
    assert not routes_to_candidate("b0", RolloutStatus.ROLLED_BACK, 5)
    assert routes_to_candidate("b9", RolloutStatus.COMPLETE, WAVES)


def state(**fields: object) -> RolloutState:
    base: dict[str, object] = {
        "id": "r1",
        "candidate_url": "http://c",
        "version": "v2",
        "interval_seconds": 100.0,
        "shadow_fraction": 0.1,
        "status": RolloutStatus.RUNNING,
        "wave": 0,
        "started_at": 1000.0,
        "wave_started_at": 1000.0,
    }
    base.update(fields)
    return RolloutState(**base)  # type: ignore[arg-type]


def test_the_last_wave_completes_the_rollout_and_a_pause_does_not_count() -> None:
    last = state(wave=LAST_WAVE).advanced(2000.0)
    assert last.status is RolloutStatus.COMPLETE and last.wave == WAVES and last.ended_at == 2000.0
    resumed = state().paused(1040.0).resumed(1540.0)
    assert resumed.status is RolloutStatus.RUNNING and resumed.wave_due_at() == 1600.0
    stored = resumed.rolled_back(1700.0, "worse").to_redis()
    assert RolloutState.from_redis(stored) == resumed.rolled_back(1700.0, "worse")
    assert RolloutState.from_redis({}) is None


def test_shadow_sampling_takes_its_fraction_the_same_way_everywhere() -> None:
    ids = [f"ticket-{n}" for n in range(20_000)]
    share = sum(sampled(i, 0.1) for i in ids) / len(ids)
    assert abs(share - 0.1) < 0.01
    assert [sampled(i, 0.1) for i in ids[:100]] == [sampled(i, 0.1) for i in ids[:100]]
    assert not any(sampled(i, 0.0) for i in ids[:1000]) and all(sampled(i, 1.0) for i in ids[:1000])


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, "ok"),
        (VllmError(ErrorKind.CONNECT, "refused"), "error"),
        (VllmError(ErrorKind.SERVER, "boom", status_code=500), "error"),
        (VllmError(ErrorKind.SERVER, "busy", status_code=429, retry_after=1.0), "shed"),
        (VllmError(ErrorKind.SERVER, "busy", status_code=503, retry_after=2.0), "shed"),
        (VllmError(ErrorKind.SERVER, "down", status_code=503), "error"),  # no Retry-After: a failure
        (VllmError(ErrorKind.CLIENT, "bad request", status_code=400), "client"),
    ],
)
def test_each_call_counts_as_one_outcome(error: VllmError | None, outcome: str) -> None:
    assert call_outcome(error) == outcome


def test_a_shadow_request_asks_vllm_for_less_priority_than_any_real_ticket(ticket_queue: TicketQueue) -> None:
    client = VllmClient("http://127.0.0.1:9", model="m")  # building a request sends nothing
    policy = ticket_queue.policy
    for name in policy.types:
        for factors in ({"is_bulk": True}, {"urgent_level": 0, "vip_level": 0}):
            body = {"type": name, "branch_id": "b1", "prompt": "hi", **factors}
            ticket = ticket_queue.build_ticket(TicketRequest.model_validate(body, context={"policy": policy}))
            _, real = client.build_request(ticket, 8)
            _, shadow = client.build_request(shadow_copy(ticket, 60), 8)
            assert shadow["request_id"] == f"{ticket.id}-shadow"
            assert shadow["priority"] > real["priority"], "vLLM serves lower numbers first"
