"""Sentinel: the API follows a promoted primary by itself; with replica acks it refuses to
acknowledge a ticket that no replica holds."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from shared.config import Settings
from shared.keys import QueueKeys
from shared.redis_conn import connect_from
from tests.producer.api.server import serve
from tests.redis_cluster import SentinelHarness, sentinel_trio
from tests.waiting import wait_until

LOAN = {"type": "loan_approval", "prompt": "approve a loan of 5000?"}
PROMOTION_SECONDS = 30


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[SentinelHarness]:
    with sentinel_trio(tmp_path) as harness:
        yield harness


def _settings(trio: SentinelHarness, replica_acks: int) -> Settings:
    return Settings(
        redis_url=None,
        redis_cluster=False,
        redis_sentinels=trio.sentinel_spec,
        redis_sentinel_master=trio.master_name,
        replica_acks=replica_acks,
        queue_name="sentinel-test",
        operator_key="op_" + secrets.token_urlsafe(16),
    )


def test_the_api_follows_the_promoted_primary_and_acks_need_a_live_replica(trio: SentinelHarness) -> None:
    settings = _settings(trio, replica_acks=1)
    client = connect_from(settings)
    key = ApiKeyStore(client, QueueKeys(settings.queue_name)).create(Role.BRANCH, "0412", "branch")[0]
    with serve(create_app(settings, admission_cache_seconds=0)) as base, requests.Session() as branch:
        branch.headers["Authorization"] = f"Bearer {key}"
        first = branch.post(f"{base}/v1/tickets", json=LOAN, timeout=10)
        assert first.status_code == 202, first.text
        trio.primary.kill()
        wait_until(
            lambda: trio.current_primary_port() == trio.replica.port,
            PROMOTION_SECONDS,
            "the sentinels to promote the replica",
            interval=0.2,
        )
        # The ticket acknowledged before the kill is on the promoted replica, read through the API.
        read = branch.get(f"{base}/v1/tickets/{first.json()['id']}", timeout=20)
        assert read.status_code == 200 and read.json()["status"] == "queued", read.text
        # The new primary has no replica left: a ticket can be written but not acknowledged.
        refused = branch.post(f"{base}/v1/tickets", json=LOAN, timeout=20)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "replica_acks_missing"
    unacked = _settings(trio, replica_acks=0).model_copy(update={"queue_name": settings.queue_name})
    with serve(create_app(unacked, admission_cache_seconds=0)) as base, requests.Session() as branch:
        branch.headers["Authorization"] = f"Bearer {key}"
        assert branch.post(f"{base}/v1/tickets", json=LOAN, timeout=10).status_code == 202
    client.close()
