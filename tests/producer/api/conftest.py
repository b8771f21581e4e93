"""Fixtures: the real API under uvicorn against real Redis, in the test's own queue, with keys."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
from redis import Redis

from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from shared.config import Settings
from shared.keys import QueueKeys
from tests.producer.api.server import serve

AUTH_CACHE_SECONDS = 0.2


def publish_alarm(redis_client: Redis, keys: QueueKeys, level: str, drain_rate: float = 50.0) -> None:
    """What the acting monitor writes every sample: the level, fresh, and its drain rate."""
    now = time.time()
    redis_client.hset(keys.alarm, mapping={"level": level, "since": now, "depth": 0, "updated_at": now})
    redis_client.hset(
        keys.monitor_state, mapping={"drain_rate": drain_rate, "service_rate": drain_rate, "updated_at": now}
    )


@dataclass(frozen=True)
class Api:
    base_url: str
    settings: Settings
    keys: ApiKeyStore

    @property
    def queue_keys(self) -> QueueKeys:
        return QueueKeys(self.settings.queue_name)

    def session(self, key: str | None) -> requests.Session:
        session = requests.Session()
        if key is not None:
            session.headers["Authorization"] = f"Bearer {key}"
        return session

    def url(self, path: str) -> str:
        return self.base_url + path


@pytest.fixture
def api_settings(redis_url: str, queue_name: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        queue_name=queue_name,
        operator_key="op_" + secrets.token_urlsafe(16),
        api_max_body_bytes=64 * 1024,
    )


@pytest.fixture
def api(api_settings: Settings, redis_client: Redis) -> Iterator[Api]:
    app = create_app(api_settings, auth_cache_seconds=AUTH_CACHE_SECONDS, admission_cache_seconds=0)
    with serve(app) as base_url:
        yield Api(base_url, api_settings, ApiKeyStore(redis_client, QueueKeys(api_settings.queue_name)))


@pytest.fixture
def branch_key(api: Api) -> str:
    return api.keys.create(Role.BRANCH, "0412", "test branch")[0]


@pytest.fixture
def other_branch_key(api: Api) -> str:
    return api.keys.create(Role.BRANCH, "0999", "another branch")[0]


@pytest.fixture
def operator_key(api_settings: Settings) -> str:
    assert api_settings.operator_key is not None
    return api_settings.operator_key


@pytest.fixture
def branch(api: Api, branch_key: str) -> Iterator[requests.Session]:
    with api.session(branch_key) as session:
        yield session
