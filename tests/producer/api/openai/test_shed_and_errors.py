"""Shed answers and bad input through the real `openai` package: what a front end sees and parses.

No worker runs: a shed call never reaches one, and bad input is refused before a ticket exists.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
import requests
from redis import Redis

from shared.keys import QueueKeys
from shared.models import TicketRequest
from tests.producer.api.conftest import publish_alarm
from tests.producer.api.openai.conftest import Gateway

MESSAGES: list[Any] = [{"role": "user", "content": "My card was charged twice."}]


def _red(gateway: Gateway, redis_client: Redis) -> None:
    publish_alarm(redis_client, QueueKeys(gateway.settings.queue_name), "red")


def test_red_complaint_gets_the_policys_degraded_answer(gateway: Gateway, redis_client: Redis) -> None:
    _red(gateway, redis_client)
    client = gateway.client(gateway.key(default_type="complaint"))
    raw = client.chat.completions.with_raw_response.create(model="tidegate", messages=MESSAGES, max_tokens=8)
    answer = raw.parse()
    assert raw.status_code == 200
    assert answer.choices[0].finish_reason == "load_shedding_fallback"
    assert answer.choices[0].message.content == gateway.queue.policy.types["complaint"].shed_text
    assert raw.headers["x-tidegate-shed"] == "queue_red"
    assert int(raw.headers["retry-after"]) >= 1
    ticket = gateway.queue.get(raw.headers["x-tidegate-ticket-id"])
    assert ticket is not None and ticket.status.value == "rejected"
    counts = gateway.queue.stats().counts
    assert counts.get("complaint:rejected") == 1 and not counts.get("complaint:done")


def test_red_degraded_answer_streams_too(gateway: Gateway, redis_client: Redis) -> None:
    _red(gateway, redis_client)
    client = gateway.client(gateway.key(default_type="complaint"))
    chunks = list(
        client.chat.completions.create(
            model="tidegate",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == gateway.queue.policy.types["complaint"].shed_text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "load_shedding_fallback"
    assert chunks[-1].usage is not None


def test_red_archive_query_is_a_rate_limit_error(gateway: Gateway, redis_client: Redis) -> None:
    _red(gateway, redis_client)
    client = gateway.client(gateway.key(default_type="archive_query"))
    with pytest.raises(openai.RateLimitError) as shed:
        client.completions.create(model="tidegate", prompt="Statements of 2019", max_tokens=8)
    response = shed.value.response
    assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
    assert response.headers["x-tidegate-shed"] == "queue_red" == shed.value.code
    assert "archive query request was not queued" in shed.value.message
    assert gateway.queue.stats().counts.get("archive_query:rejected") == 1


def test_unknown_model_is_404_naming_the_field(gateway: Gateway) -> None:
    client = gateway.client(gateway.key())
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert refused.value.code == "model_not_found" and refused.value.param == "model"  # type: ignore[attr-defined]
    assert "tidegate" in refused.value.message


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        ("/chat/completions", {"model": "tidegate"}, "messages", "missing_required_parameter"),
        ("/chat/completions", {"model": "tidegate", "messages": []}, "messages", "invalid_value"),
        ("/completions", {"model": "tidegate"}, "prompt", "missing_required_parameter"),
        ("/chat/completions", {"messages": MESSAGES}, "model", "missing_required_parameter"),
        ("/chat/completions", {"model": "tidegate", "messages": MESSAGES, "n": 2}, "n", "invalid_value"),
        (
            "/chat/completions",
            {"model": "tidegate", "messages": MESSAGES, "logprobs": True},
            "logprobs",
            None,
        ),
        ("/chat/completions", {"model": "tidegate", "messages": MESSAGES, "tools": []}, "tools", None),
        (
            "/completions",
            {"model": "tidegate", "prompt": "hi", "stream_options": {"include_usage": True}},
            "stream_options",
            None,
        ),
        (
            "/chat/completions",
            {"model": "tidegate", "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role",
            None,
        ),
        (
            "/chat/completions",
            {"model": "tidegate", "messages": MESSAGES, "tidegate": {"tier": 1}},
            "tidegate.tier",
            None,
        ),
        (
            "/chat/completions",
            {"model": "tidegate", "messages": MESSAGES, "tidegate": {"type": "mortgage"}},
            "tidegate.type",
            None,
        ),
        (
            "/chat/completions",
            {"model": "tidegate", "messages": MESSAGES, "tidegate": {"urgent_level": 9}},
            "tidegate.urgent_level",
            None,
        ),
        (
            "/chat/completions",
            {"model": "tidegate", "messages": MESSAGES, "max_tokens": 0},
            "max_tokens",
            None,
        ),
        (
            "/chat/completions",
            {"model": "tidegate", "messages": MESSAGES, "tidegate": {"deadline_ms": 0}},
            "tidegate.deadline_ms",
            None,
        ),
    ],
)
def test_bad_input_is_400_in_openai_format_naming_the_field(
    gateway: Gateway, path: str, body: dict[str, Any], param: str, code: str | None
) -> None:
    response = requests.post(
        gateway.v1 + path, json=body, headers={"Authorization": f"Bearer {gateway.key()}"}, timeout=10
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert code is None or error["code"] == code
    assert gateway.queue.stats().counts == {}, "a refused call must not become a ticket"


def test_prompt_over_the_context_limit_names_the_prompt(gateway: Gateway) -> None:
    client = gateway.client(gateway.key())
    limit = gateway.queue.policy.queue.context_limit_tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="tidegate", messages=[{"role": "user", "content": "word " * limit}], max_tokens=64
        )
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"  # type: ignore[attr-defined]
    assert str(limit) in refused.value.message


def test_an_operator_key_cannot_call_without_a_branch(gateway: Gateway) -> None:
    assert gateway.settings.operator_key is not None
    client = gateway.client(gateway.settings.operator_key)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(
            model="tidegate", messages=MESSAGES, extra_body={"tidegate": {"type": "complaint"}}
        )


def test_a_bad_deadline_header_is_400_naming_it(gateway: Gateway) -> None:
    response = requests.post(
        gateway.v1 + "/chat/completions",
        json={"model": "tidegate", "messages": MESSAGES},
        headers={"Authorization": f"Bearer {gateway.key()}", "X-Tidegate-Deadline-Ms": "soon"},
        timeout=10,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-tidegate-deadline-ms"


def test_a_call_that_cannot_start_in_time_gets_the_degraded_answer(
    gateway: Gateway, redis_client: Redis
) -> None:
    keys = QueueKeys(gateway.settings.queue_name)
    gateway.queue.enqueue_many(
        [TicketRequest(type="complaint", branch_id="b9", prompt="x") for _ in range(30)]
    )
    publish_alarm(redis_client, keys, "green", drain_rate=1.0)  # 30 ahead at 1/s: past the 10 s SLO
    client = gateway.client(gateway.key(default_type="complaint"))
    raw = client.chat.completions.with_raw_response.create(
        model="tidegate", messages=MESSAGES, max_tokens=8, extra_body={"tidegate": {"deadline_ms": 5000}}
    )
    assert raw.status_code == 200 and raw.parse().choices[0].finish_reason == "load_shedding_fallback"
    assert raw.headers["x-tidegate-shed"] == "deadline_unreachable"
    assert int(raw.headers["retry-after"]) >= 20  # the 30 s wait past the 5 s the caller allowed
    ticket = gateway.queue.get(raw.headers["x-tidegate-ticket-id"])
    assert ticket is not None and ticket.status.value == "rejected"
