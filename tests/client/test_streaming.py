"""The client's streams against the real API, a real worker and the simulator: a ticket's own
stream and the OpenAI front door's, sync and async; and their retry and timeout rules."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from tidegate_client import (
    ApiResponseError,
    AsyncTidegateClient,
    CompletionChunk,
    RetryEvent,
    RetryPolicy,
    StreamTimeout,
    TicketEnd,
    TicketEvent,
    TicketStatus,
    TicketToken,
    TidegateClient,
)

from ops.lab.sim.process import SimulatorProcess
from tests.producer.api.conftest import Api
from tests.producer.api.openai.conftest import Gateway
from tests.producer.api.peer import Answer, ScriptedPeer

MESSAGES = [{"role": "user", "content": "Is my loan application complete?"}]
LIVE_COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice.", "max_tokens": 12}
STREAM_TIMEOUT = 30.0


def _client(gateway: Gateway, key: str, **options: Any) -> TidegateClient:
    return TidegateClient(gateway.base_url, key, retry=RetryPolicy(deadline=20), **options)


def test_a_ticket_streams_its_tokens_then_its_end(gateway: Gateway, backend: SimulatorProcess) -> None:
    with _client(gateway, gateway.key()) as client:
        accepted = client.submit({**LIVE_COMPLAINT, "live": "tokens"})
        events = list(client.stream(accepted.id, timeout=STREAM_TIMEOUT))
        stored = client.get(accepted.id)
    tokens = [e.text for e in events if isinstance(e, TicketToken)]
    assert len(tokens) > 1, "the answer came in one piece, not streamed"
    assert isinstance(events[-1], TicketEnd) and events[-1].status is TicketStatus.DONE
    assert "".join(tokens) == stored.result
    assert events[-1].completion_tokens == (stored.usage or {})["completion_tokens"]
    with _client(gateway, gateway.key()) as client:  # an ended ticket answers its end at once
        again = list(client.stream(accepted.id, timeout=STREAM_TIMEOUT))
    assert again == [TicketEnd(TicketStatus.DONE, events[-1].finish_reason, *_counts(events[-1]))]


def _counts(end: TicketEvent) -> tuple[int | None, int | None]:
    assert isinstance(end, TicketEnd)
    return end.prompt_tokens, end.completion_tokens


def test_a_ticket_of_another_branch_does_not_stream(gateway: Gateway, backend: SimulatorProcess) -> None:
    with _client(gateway, gateway.key("0412")) as mine, _client(gateway, gateway.key("0413")) as theirs:
        accepted = mine.submit(LIVE_COMPLAINT)
        with pytest.raises(ApiResponseError) as raised:
            list(theirs.stream(accepted.id, timeout=STREAM_TIMEOUT))
    assert (raised.value.status, raised.value.code) == (404, "ticket_not_found")


def test_a_quiet_stream_ends_at_its_timeout(api: Api, branch_key: str) -> None:
    with TidegateClient(api.base_url, branch_key) as client:  # no worker: the ticket stays queued
        accepted = client.submit(LIVE_COMPLAINT)
        started = time.monotonic()
        with pytest.raises(StreamTimeout):
            list(client.stream(accepted.id, timeout=0.5))
        assert time.monotonic() - started < 5
        assert client.get(accepted.id).status is TicketStatus.QUEUED  # reading never cancels


def test_chat_stream_yields_typed_chunks_then_usage(gateway: Gateway, backend: SimulatorProcess) -> None:
    with _client(gateway, gateway.key()) as client:
        body = {"model": "tidegate", "messages": MESSAGES, "max_tokens": 12}
        chunks = list(client.chat_stream(body, include_usage=True, timeout=STREAM_TIMEOUT))
        ticket_id = chunks[0].ticket_id
        assert ticket_id is not None
        stored = client.get(ticket_id)
    assert all(isinstance(c, CompletionChunk) and c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].role == "assistant"
    assert len([c for c in chunks if c.text]) > 1
    assert "".join(c.text for c in chunks) == stored.result
    assert [c.finish_reason for c in chunks if c.finish_reason] == [(stored.usage or {})["finish_reason"]]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == (stored.usage or {})["completion_tokens"]
    assert {c.ticket_id for c in chunks} == {ticket_id}


def test_the_async_client_streams_completions_and_tickets(
    gateway: Gateway, backend: SimulatorProcess
) -> None:
    key = gateway.key()

    async def scenario() -> tuple[list[CompletionChunk], list[TicketEvent], str | None]:
        async with AsyncTidegateClient(gateway.base_url, key, retry=RetryPolicy(deadline=20)) as client:
            body = {"model": "tidegate", "prompt": "The branch opens at", "max_tokens": 8}
            chunks = [c async for c in client.completion_stream(body, timeout=STREAM_TIMEOUT)]
            accepted = await client.submit({**LIVE_COMPLAINT, "live": "tokens"})
            events = [e async for e in client.stream(accepted.id, timeout=STREAM_TIMEOUT)]
            return chunks, events, (await client.get(accepted.id)).result

    chunks, events, result = asyncio.run(scenario())
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.text for c in chunks) and chunks[-1].finish_reason is not None
    assert "".join(e.text for e in events if isinstance(e, TicketToken)) == result
    assert isinstance(events[-1], TicketEnd) and events[-1].status is TicketStatus.DONE


SSE_ANSWER = (
    b'data: {"id":"cmpl-01abc","object":"text_completion","created":1,"model":"tidegate",'
    b'"choices":[{"index":0,"text":"Open","finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("client_kind", ["sync", "async"])
def test_a_shed_stream_is_retried_after_exactly_its_retry_after(client_kind: str) -> None:
    shed: Answer = (429, {"Retry-After": "1"}, {"error": {"message": "shed", "code": "queue_red"}})
    answer: Answer = (200, {"Content-Type": "text/event-stream", "X-Tidegate-Ticket-Id": "01abc"}, SSE_ANSWER)
    events: list[RetryEvent] = []
    body = {"model": "tidegate", "prompt": "The branch opens at"}

    async def run_async(url: str) -> list[CompletionChunk]:
        async with AsyncTidegateClient(url, "k", on_retry=events.append) as client:
            return [c async for c in client.completion_stream(body, timeout=5)]

    with ScriptedPeer([shed, answer]) as peer:
        started = time.monotonic()
        if client_kind == "sync":
            with TidegateClient(peer.url, "k", on_retry=events.append) as client:
                chunks = list(client.completion_stream(body, timeout=5))
        else:
            chunks = asyncio.run(run_async(peer.url))
        waited = time.monotonic() - started
    assert [(e.status, e.sleep_seconds) for e in events] == [(429, 1.0)]
    assert waited >= 1.0
    assert [(c.text, c.finish_reason, c.ticket_id) for c in chunks] == [("Open", "stop", "01abc")]
    assert all(b["stream"] is True for b in peer.bodies)
