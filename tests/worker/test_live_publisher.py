"""The worker's live stream of a ticket: bounded, expiring, and the cancel check riding on each token."""

from __future__ import annotations

from typing import Any

from redis import Redis

from shared.live import LINGER_SECONDS, LiveKind, max_entries
from shared.queue import TicketQueue
from tests.worker.support import producer_for, ticket
from worker.live_publisher import LivePublisher


def _queued(queue: TicketQueue, **fields: Any) -> Any:
    result = producer_for(queue).submit(ticket("complaint", live="tokens", **fields))
    assert result.ticket is not None
    return result.ticket


def test_tokens_then_the_end_in_order_bounded_and_expiring(
    fast_queue: TicketQueue, redis_client: Redis
) -> None:
    queued = _queued(fast_queue, max_tokens=4)
    live = LivePublisher(redis_client, fast_queue.keys, queued)
    for i in range(300):
        live.token(f"t{i}")
    live.end("done", finish_reason="length", prompt_tokens=3, completion_tokens=300)
    key = fast_queue.keys.live(queued.id)
    entries = redis_client.xrange(key)
    # Approximate trimming drops whole nodes of up to 100 entries (Redis' stream-node-max-entries).
    assert len(entries) <= max_entries(4) + 100
    assert [int(e[1]["text"][1:]) for e in entries[:-1]] == list(range(300 - len(entries) + 1, 300))
    assert entries[-1][1] == {
        "kind": LiveKind.END,
        "status": "done",
        "error": "",
        "finish_reason": "length",
        "prompt_tokens": "3",
        "completion_tokens": "300",
    }
    assert 0 < redis_client.ttl(key) <= queued.ttl_seconds + LINGER_SECONDS


def test_a_cancelled_ticket_is_noticed_at_its_next_token(
    fast_queue: TicketQueue, redis_client: Redis
) -> None:
    queued = _queued(fast_queue)
    calls: list[str] = []
    live = LivePublisher(redis_client, fast_queue.keys, queued, on_cancel=lambda: calls.append("cancel"))
    live.token("a")
    assert calls == []
    assert fast_queue.cancel(queued.id) == "queued"
    live.token("b")
    assert calls == ["cancel"]
