"""A ticket that ends without a word on its live stream (a worker that died before publishing, one of
an older version) still answers its caller: the waiting call reads the ticket when the stream is quiet."""

from __future__ import annotations

import threading
import time
from typing import Any

from producer.api.openai.waiting import CHECK_SECONDS
from tests.producer.api.openai.conftest import Gateway
from tests.waiting import wait_until


def test_a_ticket_finished_without_publishing_still_answers(gateway: Gateway) -> None:
    client = gateway.client(gateway.key(default_type="complaint"))
    answers: list[Any] = []
    caller = threading.Thread(
        target=lambda: answers.append(
            client.chat.completions.create(model="tidegate", messages=[{"role": "user", "content": "Hi"}])
        ),
        daemon=True,
    )
    caller.start()
    wait_until(lambda: gateway.queue.stats().depth == 1, 5, "the call's ticket to be queued")
    (claimed,) = gateway.queue.claim("silent-worker", 1)
    usage = {"prompt_tokens": 2, "completion_tokens": 3, "finish_reason": "stop"}
    finished_at = time.monotonic()
    assert gateway.queue.finish(claimed.ticket.id, claimed.token, "done", result="one two three", usage=usage)
    caller.join(CHECK_SECONDS + 5)
    assert answers, "the call did not return"
    assert time.monotonic() - finished_at <= CHECK_SECONDS + 2
    (answer,) = answers
    assert answer.choices[0].message.content == "one two three"
    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens == 3
