"""API keys: missing, unknown and revoked keys get 401; operator-only routes give branches 403."""

from __future__ import annotations

import pytest
import requests
from redis import Redis

from producer.api.keys import ApiKeyError, Role
from tests.producer.api.conftest import AUTH_CACHE_SECONDS, Api
from tests.waiting import wait_until

LOAN = {"type": "loan_approval", "prompt": "Approve?"}
PROTECTED = [
    ("POST", "/v1/tickets"),
    ("POST", "/v1/tickets/batch"),
    ("GET", "/v1/tickets/0000000000000000000000000z"),
    ("DELETE", "/v1/tickets/0000000000000000000000000z"),
    ("GET", "/v1/queues"),
    ("PUT", "/v1/mode"),
]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_every_v1_route_needs_a_key(api: Api, method: str, path: str) -> None:
    response = requests.request(method, api.url(path), json={}, timeout=5)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "missing_api_key"
    assert "Authorization: Bearer" in response.json()["error"]["message"]


def test_wrong_scheme_and_unknown_key_get_401(api: Api) -> None:
    basic = requests.post(
        api.url("/v1/tickets"), json=LOAN, headers={"Authorization": "Basic dXNlcg=="}, timeout=5
    )
    unknown = requests.post(
        api.url("/v1/tickets"), json=LOAN, headers={"Authorization": "Bearer tg_nope"}, timeout=5
    )
    assert basic.status_code == unknown.status_code == 401
    assert unknown.json()["error"] == {
        "message": "unknown API key",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }


def test_revoked_key_gets_401(api: Api) -> None:
    token, record = api.keys.create(Role.BRANCH, "0412")
    api.keys.revoke(record.key_id)
    with api.session(token) as session:
        response = session.post(api.url("/v1/tickets"), json=LOAN)
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "revoked API key"


def test_key_revoked_while_in_use_stops_working_within_the_cache_window(api: Api) -> None:
    token, record = api.keys.create(Role.BRANCH, "0412")
    with api.session(token) as session:
        assert session.post(api.url("/v1/tickets"), json=LOAN).status_code == 202
        api.keys.revoke(record.key_id)
        wait_until(
            lambda: session.post(api.url("/v1/tickets"), json=LOAN).status_code == 401,
            AUTH_CACHE_SECONDS + 1,
            "the revoked key to be refused once its cache entry lapsed",
            interval=0.05,
        )


def test_keys_are_stored_only_as_hashes(api: Api, redis_client: Redis) -> None:
    token, record = api.keys.create(Role.BRANCH, "0412", "front desk")
    stored = redis_client.hgetall(api.queue_keys.api_keys)
    assert token not in str(stored)
    assert record.key_id in str(stored)
    assert [k.key_id for k in api.keys.list_keys("0412")] == [record.key_id]


def test_key_creation_refuses_bad_branch_ids(api: Api) -> None:
    with pytest.raises(ApiKeyError, match="not a valid branch id"):
        api.keys.create(Role.BRANCH, "04 12")
    with pytest.raises(ApiKeyError, match="no API key with id 'nope'"):
        api.keys.revoke("nope")


def test_mode_is_operator_only_and_critical_only_sheds_complaints(
    api: Api, branch: requests.Session, operator_key: str
) -> None:
    forbidden = branch.put(api.url("/v1/mode"), json={"mode": "critical-only"})
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["code"] == "operator_only"

    with api.session(operator_key) as operator:
        changed = operator.put(api.url("/v1/mode"), json={"mode": "critical-only"})
        assert changed.json() == {"mode": "critical-only", "previous": "normal"}
        complaint = branch.post(api.url("/v1/tickets"), json={"type": "complaint", "prompt": "hi"})
        loan = branch.post(api.url("/v1/tickets"), json=LOAN)
        assert (
            operator.put(api.url("/v1/mode"), json={"mode": "normal"}).json()["previous"] == "critical-only"
        )
        bad = operator.put(api.url("/v1/mode"), json={"mode": "panic"})
    assert complaint.status_code == 429
    assert complaint.json()["error"]["code"] == "critical_only"
    assert loan.status_code == 202
    assert bad.status_code == 422
    assert bad.json()["error"]["issues"][0]["loc"] == ["body", "mode"]
    assert branch.post(api.url("/v1/tickets"), json={"type": "complaint", "prompt": "hi"}).status_code == 202


def test_operator_sees_worker_details(api: Api, operator_key: str) -> None:
    with api.session(operator_key) as operator:
        assert operator.get(api.url("/v1/queues")).json()["workers"]["details"] == []
