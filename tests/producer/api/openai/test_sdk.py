"""The real `openai` package through tidegate to the simulator: models, chat and text, sync and async,
with and without streaming; each answer is a ticket, and its shape is the one vLLM itself answers."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from ops.lab.sim.process import SimulatorProcess
from shared.models import Ticket, TicketStatus
from tests.producer.api.openai.conftest import Gateway
from tests.waiting import wait_until

MESSAGES: list[Any] = [{"role": "user", "content": "Is my loan application complete?"}]


def _ticket(gateway: Gateway, ticket_id: str | None) -> Ticket:
    assert ticket_id, "no X-Tidegate-Ticket-Id header"
    ticket = gateway.queue.get(ticket_id)
    assert ticket is not None
    return ticket


def _direct(sim: SimulatorProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    model = requests.get(sim.base_url + "/v1/models", timeout=5).json()["data"][0]["id"]
    response = requests.post(sim.base_url + path, json={"model": model, **body}, timeout=10)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def _shape(obj: Any) -> Any:
    """The keys of an answer, nested, without values: what a client's parser depends on."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items() if v is not None and k not in ("usage_details",)}
    if isinstance(obj, list):
        return [_shape(v) for v in obj[:1]]
    return type(obj).__name__


def test_models_lists_the_alias_and_the_served_model(gateway: Gateway, backend: SimulatorProcess) -> None:
    client = gateway.client(gateway.key())
    served = requests.get(backend.base_url + "/v1/models", timeout=5).json()["data"][0]["id"]
    ids = wait_until(
        lambda: (found := [m.id for m in client.models.list()]) and served in found and found,
        10,
        "the worker's model to be listed",
    )
    assert "tidegate" in ids


def test_chat_answer_is_a_ticket_shaped_like_a_direct_answer(
    gateway: Gateway, backend: SimulatorProcess
) -> None:
    client = gateway.client(gateway.key())
    raw = client.chat.completions.with_raw_response.create(model="tidegate", messages=MESSAGES, max_tokens=12)
    answer = raw.parse()
    ticket = _ticket(gateway, raw.headers.get("x-tidegate-ticket-id"))
    assert ticket.type == "complaint" and ticket.status is TicketStatus.DONE
    assert answer.choices[0].message.content == ticket.result and ticket.result
    assert ticket.queue_wait_seconds is not None
    assert int(raw.headers["x-tidegate-queue-ms"]) == max(round(ticket.queue_wait_seconds * 1000), 0)
    assert answer.usage is not None and answer.usage.completion_tokens == ticket.usage["completion_tokens"]  # type: ignore[index]
    direct = _direct(backend, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12})
    ours = raw.http_response.json()
    assert set(_shape(ours)) >= {"id", "object", "created", "model", "choices", "usage"}
    assert _shape(ours)["choices"][0]["message"].items() <= _shape(direct)["choices"][0]["message"].items()
    assert ours["object"] == direct["object"] == "chat.completion"


def _first_token_count(gateway: Gateway, ticket_type: str) -> float:
    """Streamed calls of `ticket_type` whose first token the API has observed (its /metrics)."""
    text = requests.get(gateway.base_url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "tidegate_e2e_time_to_first_token_seconds_count"
                and sample.labels["type"] == ticket_type
            ):
                return float(sample.value)
    return 0.0


def test_chat_stream_with_usage_relays_every_token_then_done(
    gateway: Gateway, backend: SimulatorProcess
) -> None:
    client = gateway.client(gateway.key())
    observed_before = _first_token_count(gateway, "complaint")
    with client.chat.completions.with_streaming_response.create(
        model="tidegate",
        messages=MESSAGES,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        ticket_id = raw.headers.get("x-tidegate-ticket-id")
        chunks = list(raw.parse())
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 1, "the answer came in one piece, not streamed"
    ticket = _ticket(gateway, ticket_id)
    assert "".join(texts) == ticket.result
    assert ticket.queue_wait_seconds is not None  # a stream's headers left before it started
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [ticket.usage["finish_reason"]]  # type: ignore[index]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == ticket.usage["completion_tokens"]  # type: ignore[index]
    assert all(c.usage is None for c in chunks[:-1])
    assert _first_token_count(gateway, "complaint") == observed_before + 1


def test_text_completion_streamed_and_not(gateway: Gateway, backend: SimulatorProcess) -> None:
    client = gateway.client(gateway.key())
    whole = client.completions.create(model="tidegate", prompt="The branch opens at", max_tokens=8)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    pieces = list(
        client.completions.create(model="tidegate", prompt="The branch opens at", max_tokens=8, stream=True)
    )
    assert all(p.object == "text_completion" for p in pieces)
    assert "".join(p.choices[0].text for p in pieces) and pieces[-1].choices[0].finish_reason is not None
    direct = _direct(backend, "/v1/completions", {"prompt": "The branch opens at", "max_tokens": 8})
    assert set(_shape(direct)["choices"][0]) >= set(_shape(whole.model_dump(exclude_none=True))["choices"][0])


def test_async_client_streams_and_answers(gateway: Gateway, backend: SimulatorProcess) -> None:
    key = gateway.key()

    async def scenario() -> tuple[str, str, int | None]:
        client = gateway.async_client(key)
        async with client:
            stream = await client.chat.completions.create(
                model="tidegate",
                messages=MESSAGES,
                max_tokens=10,
                stream=True,
                stream_options={"include_usage": True},
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            whole = await client.completions.create(model="tidegate", prompt="Hello", max_tokens=6)
            usage = whole.usage.completion_tokens if whole.usage else None
            return streamed, whole.choices[0].text, usage

    streamed, text, usage = asyncio.run(scenario())
    assert streamed and text and usage


def test_type_and_factors_from_body_headers_or_the_key(gateway: Gateway, backend: SimulatorProcess) -> None:
    client = gateway.client(gateway.key(default_type=None))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tidegate", messages=MESSAGES, max_tokens=4)
    assert refused.value.body["param"] == "tidegate.type"  # type: ignore[index]
    assert all(name in refused.value.message for name in ("loan_approval", "complaint", "archive_query"))

    raw = client.chat.completions.with_raw_response.create(
        model="tidegate",
        messages=MESSAGES,
        max_tokens=4,
        extra_body={"tidegate": {"type": "loan_approval", "urgent_level": 3}},
    )
    loan = _ticket(gateway, raw.headers.get("x-tidegate-ticket-id"))
    assert (loan.type, loan.urgent_level, loan.priority) == ("loan_approval", 3, pytest.approx(-0.3))

    raw = client.completions.with_raw_response.create(
        model="tidegate",
        prompt="old statements",
        max_tokens=4,
        temperature=0.2,
        extra_headers={"X-Tidegate-Type": "archive_query", "X-Tidegate-Bulk": "true"},
    )
    archive = _ticket(gateway, raw.headers.get("x-tidegate-ticket-id"))
    assert (archive.type, archive.is_bulk, archive.priority) == ("archive_query", True, pytest.approx(2.2))
    assert archive.sampling == {"temperature": 0.2}
    seen = requests.get(
        gateway.base_url + f"/v1/tickets/{archive.id}",
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=5,
    ).json()
    assert seen["status"] == "done" and seen["result"] == raw.parse().choices[0].text
