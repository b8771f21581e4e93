"""Shedding under overload: 429 with Retry-After and a friendly body, answered from cached state."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from redis import Redis

from producer.api.app import create_app
from producer.api.context import ApiContext
from producer.api.keys import Role
from shared.config import Settings
from tests.producer.api.conftest import Api, publish_alarm
from tests.producer.api.server import serve

COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice."}
LOAN = {"type": "loan_approval", "prompt": "Approve?", "urgent_level": 5}
ARCHIVE = {"type": "archive_query", "prompt": "Statements of 2019", "is_bulk": True}


def test_red_sheds_complaints_with_retry_after_and_admits_loans(
    api: Api, branch: requests.Session, redis_client: Redis
) -> None:
    publish_alarm(redis_client, api.queue_keys, "red")
    shed = branch.post(api.url("/v1/tickets"), json=COMPLAINT)
    loan = branch.post(api.url("/v1/tickets"), json=LOAN)

    assert shed.status_code == 429
    assert shed.headers["Retry-After"].isdigit()
    assert int(shed.headers["Retry-After"]) >= 1
    error = shed.json()["error"]
    assert error["type"] == "overloaded"
    assert error["code"] == "queue_red"
    assert error["param"] is None
    assert error["message"].startswith("Your complaint request was not queued")
    assert "loan approval requests" in error["message"]
    assert f"retry in {shed.headers['Retry-After']} second" in error["message"]
    # Nothing vanishes: the shed ticket is readable as `rejected`.
    record = branch.get(api.url(f"/v1/tickets/{error['ticket_id']}")).json()
    assert record["status"] == "rejected"
    assert loan.status_code == 202


def test_orange_admits_archive_queries_while_their_deadline_can_be_met(
    api: Api, branch: requests.Session, redis_client: Redis
) -> None:
    publish_alarm(redis_client, api.queue_keys, "orange")
    archive = branch.post(api.url("/v1/tickets"), json=ARCHIVE)
    complaint = branch.post(api.url("/v1/tickets"), json=COMPLAINT)
    assert archive.status_code == 202
    assert complaint.status_code == 202


def test_retry_after_follows_depth_over_drain_rate(
    api: Api, branch: requests.Session, redis_client: Redis
) -> None:
    for _ in range(20):
        assert branch.post(api.url("/v1/tickets"), json=LOAN).status_code == 202
    publish_alarm(redis_client, api.queue_keys, "red", drain_rate=2.0)  # 20 queued ÷ 2/s ≈ 10 s ± 20%
    answers = [
        int(branch.post(api.url("/v1/tickets"), json=COMPLAINT).headers["Retry-After"]) for _ in range(10)
    ]
    assert all(8 <= a <= 12 for a in answers), answers


def test_batch_items_are_shed_one_by_one(api: Api, branch: requests.Session, redis_client: Redis) -> None:
    publish_alarm(redis_client, api.queue_keys, "red")
    body = branch.post(api.url("/v1/tickets/batch"), json={"tickets": [LOAN, COMPLAINT]}).json()
    first, second = body["results"]
    assert (first["status_code"], first["outcome"]) == (202, "queued")
    assert (second["status_code"], second["outcome"], second["status"]) == (429, "rejected", "rejected")
    assert second["retry_after"] >= 1
    assert second["error"]["code"] == "queue_red"


def test_type_cap_is_a_rate_limit(api: Api, operator_key: str, api_settings: Settings) -> None:
    cap = api_settings.policy.types["loan_approval"].cap
    with api.session(operator_key) as operator:
        for start in range(0, cap, 250):
            batch = [{**LOAN, "branch_id": "0001"}] * min(250, cap - start)
            assert operator.post(api.url("/v1/tickets/batch"), json={"tickets": batch}).json()[
                "queued"
            ] == len(batch)
        over = operator.post(api.url("/v1/tickets"), json={**LOAN, "branch_id": "0001"})
    assert over.status_code == 429
    assert over.json()["error"]["type"] == "rate_limit_exceeded"
    assert over.json()["error"]["code"] == "type_cap_reached"


class _RoundTrips:
    """Counts connections taken from the API's pools (its client and the accept path's asyncio
    client): one per command or pipeline, i.e. per round trip."""

    def __init__(self, context: ApiContext, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        pool = context.redis.connection_pool
        original = pool.get_connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(pool, "get_connection", counted)
        accept = context.producer.async_redis
        assert accept is not None, "the API submits on its asyncio client"
        async_pool = accept.connection_pool
        async_original = async_pool.get_connection

        async def counted_async(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await async_original(*args, **kwargs)

        monkeypatch.setattr(async_pool, "get_connection", counted_async)


@pytest.fixture
def cached_api(api_settings: Settings) -> Iterator[tuple[str, ApiContext]]:
    """The API with its production caches (auth 1 s, admission 0.25 s)."""
    app = create_app(api_settings)
    with serve(app) as base_url:
        yield base_url, app.state.context


def test_shed_path_touches_redis_once_and_answers_in_milliseconds(
    cached_api: tuple[str, ApiContext], redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, context = cached_api
    token, _ = context.key_store.create(Role.BRANCH, "0412")
    publish_alarm(redis_client, context.producer.queue.keys, "red")
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {token}"
        assert session.post(base_url + "/v1/tickets", json=COMPLAINT).status_code == 429  # warms the caches
        trips = _RoundTrips(context, monkeypatch)
        assert session.post(base_url + "/v1/tickets", json=COMPLAINT).status_code == 429
        assert trips.count == 1  # only the `rejected` record
        timings = []
        for _ in range(50):
            started = time.perf_counter()
            assert session.post(base_url + "/v1/tickets", json=COMPLAINT).status_code == 429
            timings.append(time.perf_counter() - started)
    assert statistics.median(timings) < 0.05, f"median 429 took {statistics.median(timings) * 1000:.1f} ms"
