"""The OpenAPI document a branch reads: readable operation ids, every status documented with the one
error body, examples that the API accepts, no internal notes, and docs pages with no CDN."""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests

from producer.api.schemas import BatchBody, ModeBody, TicketBody
from tests.producer.api.conftest import Api

INTERNAL_WORDS = re.compile(r"threadpool|MAX_BATCH|Internal:|hop\b|TODO|FIXME|Lua|hash tag", re.IGNORECASE)
BODY_MODELS = {"/v1/tickets": TicketBody, "/v1/tickets/batch": BatchBody, "/v1/mode": ModeBody}


@pytest.fixture
def document(api: Api) -> dict[str, Any]:
    return dict(requests.get(api.url("/openapi.json"), timeout=5).json())


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, ops in document["paths"].items() for method, op in ops.items()]


def test_operation_ids_are_names_a_client_can_use(document: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in _operations(document)]
    assert len(ids) == len(set(ids))
    for operation_id in ids:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", operation_id), operation_id
        assert "_v1_" not in operation_id and not operation_id.endswith(("_get", "_post", "_put", "_delete"))
    assert {"submit_ticket", "submit_batch", "read_ticket", "cancel_ticket"} <= set(ids)


READS_NOTHING = {"/livez"}
"""Liveness answers from the process alone, so a Redis outage restarts no pod."""


def test_every_error_status_uses_the_one_error_body(document: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, method, op in _operations(document):
        errors = {code: r for code, r in op["responses"].items() if code.startswith(("4", "5"))}
        if path in READS_NOTHING:
            assert errors == {}, f"{method} {path} reads nothing, so it answers no error"
            continue
        assert "503" in errors, f"{method} {path} does not document 503"
        if path.startswith("/v1/tickets"):
            assert "422" in errors and "401" in errors, f"{method} {path}"
            assert "Retry-After" in errors["503"]["headers"]
        for code, answer in errors.items():
            schema = answer["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, f"{method} {path} {code}"


def test_every_body_has_examples_the_api_accepts(
    document: dict[str, Any], api: Api, branch: requests.Session
) -> None:
    for path, method, op in _operations(document):
        if "requestBody" not in op:
            continue
        examples = op["requestBody"]["content"]["application/json"]["examples"]
        assert examples, f"{method} {path} has no examples"
        for name, example in examples.items():
            assert example["summary"], name
            if path in BODY_MODELS:  # the OpenAI routes' bodies are OpenAI's, parsed by hand
                BODY_MODELS[path].model_validate(example["value"])
            else:
                assert set(op["requestBody"]["content"]["application/json"]["schema"]["required"]) <= set(
                    example["value"]
                )
    for example in document["paths"]["/v1/tickets"]["post"]["requestBody"]["content"]["application/json"][
        "examples"
    ].values():
        if "callback_url" in example["value"]:
            continue  # its host is an example name: nothing to resolve here
        response = branch.post(api.url("/v1/tickets"), json=example["value"])
        assert response.status_code == 202, response.text


def test_public_text_has_no_internal_notes(document: dict[str, Any]) -> None:
    texts: list[str] = [document["info"]["description"]]
    for _, _, op in _operations(document):
        texts += [op.get("summary", ""), op.get("description", "")]
        texts += [r.get("description", "") for r in op["responses"].values()]
    for schema in document["components"]["schemas"].values():
        texts.append(schema.get("description", ""))
        texts += [p.get("description", "") for p in schema.get("properties", {}).values()]
    leaks = [t for t in texts if INTERNAL_WORDS.search(t)]
    assert leaks == []


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_nothing_from_elsewhere(api: Api, page: str) -> None:
    response = requests.get(api.url(page), timeout=5)
    assert response.status_code == 200
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    sources = re.findall(r'(?:src|href)="([^"]+)"', response.text)
    assert sources and all(s.startswith("/") for s in sources), sources
    for source in sources:
        asset = requests.get(api.url(source), timeout=5)
        assert asset.status_code == 200 and len(asset.content) > 0, source


def test_unknown_routes_and_methods_answer_the_error_envelope(api: Api, branch: requests.Session) -> None:
    for response in (branch.get(api.url("/v1/nothing-here")), branch.put(api.url("/v1/tickets"))):
        assert response.status_code in (404, 405)
        assert set(response.json()) == {"error"} and response.json()["error"]["message"]
