"""Requests generated from /openapi.json by schemathesis: no 500, no answer outside the schema.

Positive cases (schema-valid requests) must be accepted, except for the one limit a JSON schema
cannot state: prompt tokens plus max_tokens against the context limit. Negative cases (requests that
break the schema) must never reach a 500 or break the response schema; they are not required to be
refused, because pydantic's lax mode accepts harmless variants such as "5" for 5.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, CheckFunction, GenerationMode
from schemathesis.core.transport import Response
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from producer.api.keys import Role
from producer.api.schemas import TicketBody
from shared import callback_targets
from tests.producer.api.conftest import Api, publish_alarm

OPERATIONS = [
    ("POST", "/v1/tickets"),
    ("POST", "/v1/tickets/batch"),
    ("GET", "/v1/tickets/{ticket_id}"),
    ("DELETE", "/v1/tickets/{ticket_id}"),
    ("GET", "/v1/queues"),
    ("PUT", "/v1/mode"),
    ("GET", "/v1/status"),
    ("GET", "/healthz"),
    ("GET", "/livez"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
]
WITHOUT_INPUT = {"/v1/status", "/healthz", "/livez", "/readyz", "/metrics"}
"""No parameters and no body: nothing can be generated that breaks their schema."""
HYPOTHESIS_MAX_LENGTH = 10_000
"""Hypothesis cannot draw a string longer than this, so a negative case for `maxLength: 400000` cannot
be built; negative generation runs on a copy of the schema whose longer limits are lowered to this."""
EXAMPLES = 60
SCHEMA_CANNOT_SAY = ("prompt of about", "callback_url host")
"""Refusals of schema-valid data: the context limit, and callback hosts such as `metadata`."""
LEFT_OUT: list[CheckFunction] = [positive_data_acceptance, negative_data_rejection]
"""Replaced by accepts_valid_data (positive) and by the no-500 assertions (negative); see above."""


@pytest.fixture(autouse=True)
def names_resolve_publicly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated callback hosts are random names: answer them without a DNS query, with a public
    address (nothing connects to it at submission)."""
    public = ipaddress.ip_address("93.184.216.34")
    monkeypatch.setattr(callback_targets, "resolve", lambda host, port: [public])


def accepts_valid_data(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """Like schemathesis' positive_data_acceptance, but the context limit may refuse valid data."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return None
    detail = json.loads(response.content)["error"]["issues"]
    refused = [item["msg"] for item in detail if not item["msg"].startswith(SCHEMA_CANNOT_SAY)]
    assert not refused, f"schema-valid request refused: {refused}"
    return None


def _lower_long_limits(node: Any) -> Any:
    if isinstance(node, dict):
        lowered = {k: _lower_long_limits(v) for k, v in node.items()}
        if isinstance(lowered.get("maxLength"), int):
            lowered["maxLength"] = min(lowered["maxLength"], HYPOTHESIS_MAX_LENGTH)
        return lowered
    if isinstance(node, list):
        return [_lower_long_limits(v) for v in node]
    return node


def _run(api: Api, method: str, path: str, mode: GenerationMode, key: str) -> dict[int, int]:
    document = requests.get(api.url("/openapi.json"), timeout=5).json()
    if mode is GenerationMode.NEGATIVE:
        document = _lower_long_limits(document)
    operation = schemathesis.openapi.from_dict(document)[path][method]
    statuses: dict[int, int] = {}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case: Case[Any]) -> None:
        response = case.call_and_validate(
            base_url=api.base_url,
            headers={"Authorization": f"Bearer {key}"},
            excluded_checks=LEFT_OUT,
            additional_checks=[accepts_valid_data],
        )
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    check()
    return statuses


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_generated_requests(
    api: Api, branch_key: str, operator_key: str, method: str, path: str, mode: GenerationMode
) -> None:
    if mode is GenerationMode.NEGATIVE and path in WITHOUT_INPUT:
        pytest.skip(f"{path} takes no input to break")
    key = operator_key if path == "/v1/mode" else branch_key
    statuses = _run(api, method, path, mode, key)
    assert 500 not in statuses
    if mode is GenerationMode.POSITIVE and path == "/v1/tickets" and method == "POST":
        assert statuses.get(202, 0) > EXAMPLES // 3, statuses  # the generator reaches the real work


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
GOOD_TICKET = {"type": "complaint", "prompt": "hello"}
FIELDS = [*TicketBody.model_fields, "colour"]
ticket_like = (
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)
    | st.builds(lambda k, v: {**GOOD_TICKET, k: v}, st.sampled_from(FIELDS), json_values)
    | json_values
)
BODIES = {
    "/v1/tickets": ticket_like,
    "/v1/tickets/batch": st.fixed_dictionaries({"tickets": st.lists(ticket_like, max_size=5)}) | json_values,
}


@pytest.mark.parametrize("path", list(BODIES))
def test_arbitrary_json_bodies(api: Api, branch_key: str, path: str) -> None:
    """Any JSON at all, and tickets with any field replaced by any JSON: a 4xx or 2xx, never a 500."""
    operation = schemathesis.openapi.from_url(api.url("/openapi.json"))[path]["POST"]
    statuses: dict[int, int] = {}

    @given(body=BODIES[path])
    @settings(max_examples=EXAMPLES * 2, deadline=None, database=None, derandomize=True)
    def check(body: Any) -> None:
        case = operation.Case(body=body, media_type="application/json")
        response = case.call_and_validate(
            headers={"Authorization": f"Bearer {branch_key}"},
            excluded_checks=LEFT_OUT,
        )
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    check()
    assert 500 not in statuses
    assert set(statuses) > {422}, statuses  # some bodies got through to admission


def _case(api: Api, method: str, path: str, **kwargs: Any) -> Case[Any]:
    schema = schemathesis.openapi.from_url(api.url("/openapi.json"))
    case: Case[Any] = schema[path][method].Case(**kwargs)
    return case


def test_real_answers_match_the_schema(api: Api, branch_key: str, redis_client: Any) -> None:
    """The answers generation rarely reaches (a real ticket read and cancelled, a 429) are checked too."""
    auth = {"Authorization": f"Bearer {branch_key}"}
    ticket = {"type": "complaint", "prompt": "hello", "callback_url": "http://hooks.bank.example/t"}
    created = _case(api, "POST", "/v1/tickets", body=ticket).call_and_validate(headers=auth)
    ticket_id = created.json()["id"]
    read = _case(api, "GET", "/v1/tickets/{ticket_id}", path_parameters={"ticket_id": ticket_id})
    assert read.call_and_validate(headers=auth).status_code == 200
    cancel = _case(api, "DELETE", "/v1/tickets/{ticket_id}", path_parameters={"ticket_id": ticket_id})
    assert cancel.call_and_validate(headers=auth).status_code == 200

    publish_alarm(redis_client, api.queue_keys, "red")
    shed = _case(api, "POST", "/v1/tickets", body={"type": "complaint", "prompt": "x"})
    assert shed.call_and_validate(headers=auth).status_code == 429
    batch = _case(api, "POST", "/v1/tickets/batch", body={"tickets": [{"type": "complaint", "prompt": "x"}]})
    assert batch.call_and_validate(headers=auth).json()["rejected"] == 1

    revoked_token, record = api.keys.create(Role.BRANCH, "0412")
    api.keys.revoke(record.key_id)
    queues = _case(api, "GET", "/v1/queues")
    response = queues.call_and_validate(headers={"Authorization": f"Bearer {revoked_token}"})
    assert response.status_code == 401
