"""Helpers shared by the worker scenarios, against the simulator (tests/worker) and real vLLM (tests/lab/vllm_cpu).

Tickets and producers for a test's queue, polls for ticket outcomes and for vLLM /metrics values, the
flags of `python -m worker` processes, and the checks of a dead worker's batch being rescued.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from redis import Redis

from producer.producer import Producer
from shared.models import Ticket, TicketStatus
from shared.queue import TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import sim_metric
from worker.vllm_client import Completion


def completion(*, ttft: float, tpot: float, prompt: int = 400, tokens: int = 101) -> Completion:
    """One streamed answer, as the worker's client returns it: `ttft + tpot × (tokens - 1)` seconds."""
    return Completion(
        text="x",
        prompt_tokens=prompt,
        completion_tokens=tokens,
        finish_reason="length",
        ttft_seconds=ttft,
        total_seconds=ttft + tpot * (tokens - 1),
        first_token_at=None,
        model="m",
    )


def running_ticket(kind: str = "complaint", **fields: Any) -> Ticket:
    """A running ticket of type `kind`, created at 0 with a minute to live; `fields` override any field."""
    defaults: dict[str, Any] = {
        "id": "t1",
        "branch_id": "b1",
        "status": TicketStatus.RUNNING,
        "priority": 1.0,
        "prompt": "hi",
        "max_tokens": 8,
        "ttl_seconds": 60,
        "created_at": 0.0,
        "expires_at": 60.0,
    }
    return Ticket(type=kind, **(defaults | fields))


def ticket(kind: str, **extra: Any) -> dict[str, Any]:
    """A ticket body of type `kind` for branch b1 with a short answer; `extra` adds or overrides fields."""
    return {"type": kind, "branch_id": "b1", "prompt": f"{kind} request " * 20, "max_tokens": 16, **extra}


def producer_for(queue: TicketQueue, *, max_attempts: int | None = None) -> Producer:
    """A producer for `queue` (same Redis, policy and name) that checks admission on every submit.

    `max_attempts` replaces the policy's limit for the tickets it submits.
    """
    policy = queue.policy
    if max_attempts is not None:
        policy = policy.model_copy(
            update={"queue": policy.queue.model_copy(update={"max_attempts": max_attempts})}
        )
    return Producer(queue.redis, policy, queue.keys.queue, admission_cache_seconds=0)


def submit(producer: Producer, bodies: list[dict[str, Any]]) -> list[str]:
    """Submit each body in order; their ticket ids."""
    return [producer.submit(body).ticket_id for body in bodies]


def submit_many(producer: Producer, count: int, **fields: Any) -> list[str]:
    """Submit `count` identical complaints (`fields` override the body); their ticket ids."""
    body = {"type": "complaint", "branch_id": "b1", "prompt": "my card was declined " * 10, "max_tokens": 64}
    return [producer.submit({**body, **fields}).ticket_id for _ in range(count)]


def submit_numbered(producer: Producer, count: int, prompt_repeats: int, **fields: Any) -> list[str]:
    """Submit `count` complaints whose prompts differ (`complaint {i}: ` repeated), so no prefix is shared."""
    return [
        submit_many(producer, 1, prompt=f"complaint {i}: " * prompt_repeats, **fields)[0]
        for i in range(count)
    ]


def all_ended(queue: TicketQueue, ids: list[str]) -> list[Ticket] | None:
    """The tickets once every one has a terminal status; None while any is missing or not ended."""
    tickets = queue.get_many(ids)
    if all(t is not None and t.status.terminal for t in tickets):
        return [t for t in tickets if t is not None]
    return None


def all_done(queue: TicketQueue, ids: list[str]) -> list[Ticket] | None:
    """The tickets once every one is DONE; None while any is missing or not done."""
    tickets = queue.get_many(ids)
    if tickets and all(t is not None and t.status is TicketStatus.DONE for t in tickets):
        return [t for t in tickets if t is not None]
    return None


def wait_all_ended(queue: TicketQueue, ids: list[str], timeout: float, message: str) -> list[Ticket]:
    """Wait until every ticket has ended; the tickets, in the order of `ids`."""
    return cast("list[Ticket]", wait_until(lambda: all_ended(queue, ids), timeout, message))


def wait_all_done(queue: TicketQueue, ids: list[str], timeout: float, interval: float = 0.02) -> list[Ticket]:
    """Wait until every ticket is DONE; the tickets, in the order of `ids`."""
    return cast(
        "list[Ticket]",
        wait_until(lambda: all_done(queue, ids), timeout, "every ticket done", interval=interval),
    )


def wait_inflight(queue: TicketQueue, count: int, timeout: float, message: str) -> None:
    """Wait until exactly `count` tickets of `queue` are leased."""
    wait_until(lambda: queue.stats().inflight == count, timeout, message)


def wait_metric(base_url: str, name: str, value: float, timeout: float, message: str) -> None:
    """Wait until the /metrics sample `name` at `base_url` (simulator or vLLM) equals `value`.

    Polled every 0.1 s: vLLM's /metrics is a large page, and parsing it flat out only loads the
    2-core machine that the scenario under test runs on."""
    wait_until(lambda: sim_metric(base_url, name) == value, timeout, message, interval=0.1)


def leased_by(redis_client: Redis, queue: TicketQueue, worker_id: str) -> list[str]:
    """The ids of the tickets of `queue` that `worker_id` holds leased."""
    ids = cast("list[str]", redis_client.zrange(queue.keys.inflight, 0, -1))
    return [i for i in ids if redis_client.hget(queue.keys.ticket(i), "worker") == worker_id]


def worker_process_flags(*backend: str) -> tuple[str, ...]:
    """`python -m worker` flags for tests: `backend` (GPU backend flags), then half-second loops."""
    return (*backend, "--heartbeat-seconds", "0.5", "--resize-seconds", "0.5", "--block-seconds", "0.5")


def assert_rescued_exactly_once(
    queue: TicketQueue, ids: list[str], lost: list[str], rescuer: str, done_before: Sequence[str] = ()
) -> None:
    """After a burst `rescuer` ran: every complaint done, once; by the rescuer unless it is one of
    `done_before` (finished before the crash, on its first attempt); the `lost` ones on a second."""
    tickets = all_ended(queue, ids)
    assert tickets is not None, "the burst worker exited with tickets unfinished"
    assert all(t.status is TicketStatus.DONE for t in tickets)
    assert all(t.worker == rescuer for t in tickets if t.id not in done_before)
    for t in tickets:
        assert t.attempts == (2 if t.id in lost else 1)
    # Exactly once: one `done` per ticket in the outcome counts, nothing left leased or queued.
    stats = queue.stats()
    assert stats.outcome_count("complaint", "done") == len(ids)
    assert stats.inflight == 0 and stats.depth == 0
