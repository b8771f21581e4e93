"""A Redis that is out of memory answers 503 with Retry-After, never 500, and nothing is half-written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from redis import Redis

from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from shared.config import Settings
from shared.keys import QueueKeys
from tests.private_redis import private_redis
from tests.producer.api.server import serve


@pytest.fixture
def full_redis(tmp_path: Path) -> Iterator[str]:
    with private_redis(tmp_path, ["--maxmemory-policy", "noeviction"]) as url:
        yield url


def test_an_out_of_memory_redis_answers_503_naming_it(full_redis: str) -> None:
    client = Redis.from_url(full_redis, decode_responses=True)
    keys = QueueKeys("full")
    branch_key = ApiKeyStore(client, keys).create(Role.BRANCH, "0412", "branch")[0]
    settings = Settings(redis_url=full_redis, queue_name="full")
    with serve(create_app(settings, auth_cache_seconds=60, admission_cache_seconds=60)) as base_url:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {branch_key}"
        body = {"type": "loan_approval", "prompt": "approve 25k?"}
        assert session.post(base_url + "/v1/tickets", json=body, timeout=10).status_code == 202
        counts_before = client.hgetall(keys.counts)
        client.config_set("maxmemory", max(int(client.info("memory")["used_memory"]) // 2, 1))
        try:
            answer = session.post(base_url + "/v1/tickets", json=body, timeout=10)
            batch = session.post(base_url + "/v1/tickets/batch", json={"tickets": [body] * 3}, timeout=10)
        finally:
            client.config_set("maxmemory", 0)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "redis_memory_full" and int(answer.headers["Retry-After"]) >= 1
    assert batch.status_code == 503 and batch.json()["error"]["code"] == "redis_memory_full"
    assert client.hgetall(keys.counts) == counts_before, "a refused write left a trace"
    client.close()
