"""422 names every bad field; bad JSON, unknown fields and oversize bodies are refused cleanly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.producer.api.conftest import Api

GOOD: dict[str, Any] = {"type": "complaint", "prompt": "My card was charged twice."}

# (body changes, the field the 422 must name, a fragment of its message)
FIELD_ERRORS: list[tuple[dict[str, Any], list[str | int], str]] = [
    ({"type": "mortgage"}, ["body", "type"], "known types: loan_approval, complaint, archive_query"),
    ({"type": ""}, ["body", "type"], "at least 1 character"),
    ({"branch_id": "04 12"}, ["body", "branch_id"], "should match pattern"),
    ({"prompt": "   "}, ["body", "prompt"], "prompt must not be empty"),
    ({"prompt": 42}, ["body", "prompt"], "valid string"),
    ({"prompt": None, "messages": []}, ["body", "messages"], "at least 1 item"),
    (
        {"prompt": None, "messages": [{"role": "robot", "content": "hi"}]},
        ["body", "messages", 0, "role"],
        "'user'",
    ),
    (
        {"prompt": None, "messages": [{"role": "user", "content": ""}]},
        ["body", "messages", 0, "content"],
        "1 char",
    ),
    ({"messages": [{"role": "user", "content": "hi"}]}, ["body"], "exactly one of 'prompt'"),
    ({"max_tokens": 0}, ["body", "max_tokens"], "greater than or equal to 1"),
    ({"max_tokens": 32_768}, ["body"], "exceeds the context limit of 32768 tokens"),
    ({"urgent_level": 6}, ["body", "urgent_level"], "less than or equal to 5"),
    ({"vip_level": -1}, ["body", "vip_level"], "greater than or equal to 0"),
    ({"is_bulk": "perhaps"}, ["body", "is_bulk"], "valid boolean"),
    ({"ttl_seconds": 0}, ["body", "ttl_seconds"], "greater than 0"),
    ({"idempotency_key": ""}, ["body", "idempotency_key"], "at least 1 character"),
    (
        {"callback_url": "ftp://files.bank/x"},
        ["body", "callback_url"],
        "URL scheme should be 'http' or 'https'",
    ),
    ({"colour": "red"}, ["body", "colour"], "Extra inputs are not permitted"),
]


@pytest.fixture
def post(api: Api, branch: requests.Session) -> Iterator[Any]:
    def send(body: Any, **kwargs: Any) -> requests.Response:
        return branch.post(api.url("/v1/tickets"), json=body, **kwargs)

    yield send


@pytest.mark.parametrize(("change", "loc", "fragment"), FIELD_ERRORS)
def test_each_bad_field_is_named(
    post: Any, change: dict[str, Any], loc: list[str | int], fragment: str
) -> None:
    response = post({**GOOD, **change})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert set(response.json()) == {"error"}  # the one error envelope, as for every 4xx and 5xx
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_field")
    assert error["param"] == (".".join(str(p) for p in loc[1:]) or "body")
    detail = error["issues"]
    assert [item["loc"] for item in detail] == [loc]
    assert fragment in detail[0]["msg"] and fragment in error["message"]
    assert set(detail[0]) == {"loc", "msg", "type"}  # the input is never echoed back


def test_several_bad_fields_are_all_named(post: Any) -> None:
    response = post({**GOOD, "urgent_level": 9, "vip_level": 9, "extra": 1})
    assert sorted(str(item["loc"][-1]) for item in response.json()["error"]["issues"]) == [
        "extra",
        "urgent_level",
        "vip_level",
    ]


def test_missing_type_is_named(post: Any) -> None:
    response = post({"prompt": "hi"})
    assert response.status_code == 422
    assert ["body", "type"] in [item["loc"] for item in response.json()["error"]["issues"]]


def test_text_that_is_not_unicode_is_named(api: Api, branch: requests.Session) -> None:
    # A lone surrogate is legal JSON but cannot be stored as UTF-8: refused, never a 500.
    body = b'{"type": "complaint", "messages": [{"role": "user", "content": "a\\ud800"}]}'
    response = branch.post(api.url("/v1/tickets"), data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"]["issues"][0]["loc"] == ["body", "messages", 0, "content"]


def test_bad_json_is_422_naming_the_body(api: Api, branch: requests.Session) -> None:
    response = branch.post(
        api.url("/v1/tickets"),
        data=b'{"type": "complaint", "prompt": ',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["error"]["issues"][0]["type"] == "json_invalid"
    assert response.json()["error"]["issues"][0]["loc"][0] == "body"


@pytest.mark.parametrize("body", [[], "text", 3, None])
def test_non_object_bodies_are_refused(post: Any, body: Any) -> None:
    assert post(body).status_code == 422


def test_idempotency_header_limits_and_conflicts(post: Any) -> None:
    too_long = post(GOOD, headers={"Idempotency-Key": "k" * 129})
    assert too_long.status_code == 422
    assert too_long.json()["error"]["issues"][0]["loc"] == ["header", "Idempotency-Key"]
    assert too_long.json()["error"]["param"] == "Idempotency-Key"
    conflict = post({**GOOD, "idempotency_key": "a"}, headers={"Idempotency-Key": "b"})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "idempotency_key_conflict"
    agree = post({**GOOD, "idempotency_key": "a"}, headers={"Idempotency-Key": "a"})
    assert agree.status_code == 202


def test_bad_ticket_id_in_path(api: Api, branch: requests.Session) -> None:
    response = branch.get(api.url("/v1/tickets/not-an-id!"))
    assert response.status_code == 422
    assert response.json()["error"]["issues"][0]["loc"] == ["path", "ticket_id"]


def test_declared_oversize_body_is_413_before_reading(api: Api, branch_key: str) -> None:
    limit = api.settings.api_max_body_bytes
    body = json.dumps({**GOOD, "prompt": "x" * limit}).encode()
    response = requests.post(
        api.url("/v1/tickets"),
        data=body,
        headers={"Authorization": f"Bearer {branch_key}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "body_too_large"
    assert str(limit) in error["message"]


def test_streamed_oversize_body_is_413(api: Api, branch_key: str) -> None:
    limit = api.settings.api_max_body_bytes

    def chunks() -> Iterator[bytes]:  # chunked transfer: no Content-Length to trust
        yield b'{"type": "complaint", "prompt": "'
        for _ in range(limit // 4096 + 2):
            yield b"x" * 4096
        yield b'"}'

    response = requests.post(
        api.url("/v1/tickets"),
        data=chunks(),
        headers={"Authorization": f"Bearer {branch_key}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


def test_body_just_under_the_limit_is_read(api: Api, branch: requests.Session) -> None:
    # 4 characters per token: a prompt this long stays inside the context limit.
    response = branch.post(
        api.url("/v1/tickets"), json={**GOOD, "prompt": "y" * (api.settings.api_max_body_bytes // 2)}
    )
    assert response.status_code == 202


def test_unknown_route_and_method_answer_json(api: Api, branch: requests.Session) -> None:
    missing = branch.get(api.url("/v1/nothing"))
    wrong_method = branch.patch(api.url("/v1/tickets"), json=GOOD)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    assert wrong_method.status_code == 405
    assert "POST" in wrong_method.headers["Allow"]
