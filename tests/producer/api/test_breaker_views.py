"""An endpoint's breaker as operators see it: `/v1/queues`, `/metrics`, `tidegate status --json`,
and the `circuit_open` 429 a branch gets while every primary is open."""

from __future__ import annotations

import json

import requests
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from shared.breaker_store import BreakerStore
from shared.policy import load_policy
from tests.conftest import RunCli
from tests.producer.api.conftest import Api

ENDPOINT = "vllm-0:8000"


def _open_breaker(redis_client: Redis, api: Api) -> None:
    store = BreakerStore(redis_client, api.queue_keys, load_policy().breaker)
    store.describe(ENDPOINT, role="primary", model="qwen-7b:2026.11", model_version="2026.11")
    for _ in range(load_policy().breaker.min_requests):
        store.record(ENDPOINT, False)


def test_an_open_breaker_shows_everywhere_and_refuses_new_tickets(
    api: Api, redis_client: Redis, operator_key: str, branch: requests.Session, run_cli: RunCli
) -> None:
    _open_breaker(redis_client, api)
    queues = requests.get(
        api.url("/v1/queues"), headers={"Authorization": f"Bearer {operator_key}"}, timeout=5
    ).json()
    (breaker,) = queues["breakers"]
    assert (breaker["endpoint"], breaker["phase"], breaker["version"]) == (ENDPOINT, "open", "2026.11")
    assert breaker["level"] == "deep" and breaker["retry_after"] > 0
    # Every request counted was an error, and the moment it tripped stays put on later reads.
    assert breaker["error_rates"] == {"instant": 1.0, "sustained": 1.0, "deep": 1.0}
    assert breaker["requests"]["instant"] == load_policy().breaker.min_requests
    assert breaker["since"] is not None

    metrics = requests.get(api.url("/metrics"), timeout=5).text
    levels = {
        s.labels["endpoint"]: s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == "tidegate_breaker_level"
    }
    assert levels == {ENDPOINT: 3}

    status = run_cli("status", "--json")
    assert status.returncode == 0, status.stderr
    breakers = json.loads(status.stdout)["breakers"]
    assert list(breakers) == [ENDPOINT] and breakers[ENDPOINT]["phase"] == "open"
    assert breakers[ENDPOINT]["since"] == breaker["since"]

    reply = branch.post(
        api.url("/v1/tickets"),
        json={"type": "loan_approval", "prompt": "approve 25k", "max_tokens": 8},
        timeout=5,
    )
    assert reply.status_code == 429
    assert reply.json()["error"]["code"] == "circuit_open"
    assert int(reply.headers["Retry-After"]) >= 1

    # The command line refuses it the same way and says so with the same code.
    refused = run_cli("enqueue", "--type", "loan_approval", "--branch", "0412", "--prompt", "x", "--json")
    assert refused.returncode == 1
    doc = json.loads(refused.stdout)
    assert (doc["outcome"], doc["code"]) == ("rejected", "circuit_open") and doc["retry_after"] > 0
