"""A failure while answering (Redis lost mid-answer) still answers the caller in OpenAI's format."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis

from producer.api.openai.answers import guarded

Message = dict[str, Any]


def _run(answer: Any) -> tuple[list[Message], list[str]]:
    sent: list[Message] = []
    exits: list[str] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(guarded(answer, "t1", lambda: exits.append("closed"))(send))
    return sent, exits


def test_a_failure_before_the_answer_started_is_a_503_naming_the_ticket() -> None:
    async def answer(send: Any) -> None:
        raise redis.ConnectionError("Redis went away")

    sent, exits = _run(answer)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503
    assert (b"x-tidegate-ticket-id", b"t1") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "relay_failed" and "/v1/tickets/t1" in error["message"]
    assert exits == ["closed"]


def test_a_failure_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async def answer(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        raise redis.TimeoutError("Redis too slow")

    sent, exits = _run(answer)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    last = sent[-1]
    assert last["body"].startswith(b"data: ") and not last.get("more_body", False)
    assert json.loads(last["body"][6:])["error"]["code"] == "relay_failed"
    assert exits == ["closed"]
