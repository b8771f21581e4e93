"""/metrics guarded: behind the operator key (`TIDEGATE_METRICS_AUTH=operator`) an unauthenticated
scrape of the API port is refused; on a port of its own (`TIDEGATE_METRICS_PORT`) the API port
answers 404 and the other port serves the figures. Open by default (the deploy files scrape so)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests
from redis import Redis

from ops.lab.procs.ports import free_port
from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from shared.config import Settings
from shared.keys import QueueKeys
from tests.producer.api.conftest import Api
from tests.producer.api.server import serve

METRIC = "tidegate_queue_depth_all_types"


@pytest.fixture
def guarded(api_settings: Settings, redis_client: Redis, request: pytest.FixtureRequest) -> Iterator[Api]:
    settings = api_settings.model_copy(update=request.param)
    with serve(create_app(settings, auth_cache_seconds=0)) as base_url:
        yield Api(base_url, settings, ApiKeyStore(redis_client, QueueKeys(settings.queue_name)))


@pytest.mark.parametrize("guarded", [{"metrics_auth": "operator"}], indirect=True)
def test_behind_the_operator_key_an_unauthenticated_scrape_is_refused(guarded: Api) -> None:
    url = guarded.url("/metrics")
    refused = requests.get(url, timeout=10)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "missing_api_key"
    branch_key = guarded.keys.create(Role.BRANCH, "0412")[0]
    assert requests.get(url, headers={"Authorization": f"Bearer {branch_key}"}, timeout=10).status_code == 403
    operator_key = guarded.keys.create(Role.OPERATOR, label="prometheus")[0]
    for key in (operator_key, guarded.settings.operator_key):
        scrape = requests.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert scrape.status_code == 200 and METRIC in scrape.text


def test_open_by_default(api: Api) -> None:
    scrape = requests.get(api.url("/metrics"), timeout=10)
    assert scrape.status_code == 200 and METRIC in scrape.text


def test_on_a_port_of_its_own(api_settings: Settings) -> None:
    port = free_port()
    settings = api_settings.model_copy(update={"metrics_port": port, "metrics_host": "127.0.0.1"})
    with serve(create_app(settings)) as base_url:
        key = settings.operator_key
        moved = requests.get(base_url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert moved.status_code == 404 and f"port {port}" in moved.json()["error"]["message"]
        scrape = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert scrape.status_code == 200 and METRIC in scrape.text
    with pytest.raises(requests.ConnectionError):  # closed with the app
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_metrics_port_with_several_api_workers_exits_2() -> None:
    command = [sys.executable, "-c", "from tidegate.cli import main; main()", "api"]
    command += [
        "--workers",
        "2",
        "--metrics-port",
        str(free_port()),
        "--redis-url",
        "redis://127.0.0.1:6379/9",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--metrics-port" in result.stderr
    command = [*command[:4], "--metrics-auth", "everyone", "--redis-url", "redis://127.0.0.1:6379/9"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "metrics_auth" in result.stderr, result.stderr
