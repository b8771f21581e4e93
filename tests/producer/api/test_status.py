"""`GET /v1/status` (the status page's data) and `/ui` itself, without a browser."""

from __future__ import annotations

import re

import pytest
import requests
from redis import Redis

from producer.api.app import create_app
from producer.producer import Producer
from shared import clock
from shared.breaker_store import BreakerStore
from shared.config import Settings
from shared.control import Mode, set_mode
from shared.depth_history import append_depth, read_depth_history
from shared.policy import load_policy
from shared.shed import ShedCode
from shared.shed_log import recent_sheds
from tests.producer.api.conftest import Api
from tests.producer.api.server import serve


def test_status_needs_an_operator_key(api: Api, branch_key: str, operator_key: str) -> None:
    assert requests.get(api.url("/v1/status"), timeout=5).status_code == 401
    with api.session(branch_key) as branch:
        refused = branch.get(api.url("/v1/status"), timeout=5)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "operator_only"
    with api.session(operator_key) as operator:
        doc = operator.get(api.url("/v1/status"), timeout=5).json()
    assert doc["queue"] == api.settings.queue_name
    assert doc["level"] == "green"
    assert doc["breakers"] is None and doc["rollout"] is None
    assert set(doc["depth_by_type"]) == set(doc["caps"])


def test_breaker_state_in_redis_is_shown_by_endpoint(
    api: Api, operator_key: str, redis_client: Redis
) -> None:
    store = BreakerStore(redis_client, api.queue_keys, load_policy().breaker)
    for _ in range(load_policy().breaker.min_requests):
        store.record("vllm-a:8000", False)
    with api.session(operator_key) as operator:
        doc = operator.get(api.url("/v1/status"), timeout=5).json()
    assert list(doc["breakers"]) == ["vllm-a:8000"]
    assert (doc["breakers"]["vllm-a:8000"]["phase"], doc["breakers"]["vllm-a:8000"]["role"]) == (
        "open",
        "primary",
    )


def test_the_page_and_its_assets_come_from_the_package(api: Api) -> None:
    page = requests.get(api.url("/ui"), timeout=5)
    assert page.status_code == 200
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert api.settings.queue_name in page.text
    external = re.findall(r"""(?:src|href)=["'](https?:)?//""", page.text)
    assert external == [], "the page must load nothing from another host"
    for asset, kind in (("/ui/static/ui.js", "javascript"), ("/ui/static/ui.css", "text/css")):
        answer = requests.get(api.url(asset), timeout=5)
        assert answer.status_code == 200 and kind in answer.headers["content-type"], asset
    assert requests.get(api.url("/ui/static/../app.py"), timeout=5).status_code == 404


def test_recent_sheds_count_what_the_enqueue_script_refused(
    producer: Producer, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = producer.queue.keys
    set_mode(redis_client, keys, Mode.CRITICAL_ONLY)
    now = clock.now()
    for age, ticket_type in ((120, "complaint"), (0, "complaint"), (600, "archive_query")):
        monkeypatch.setattr(clock, "now", lambda age=age: now - age)
        result = producer.submit({"type": ticket_type, "branch_id": "0412", "prompt": "hi"})
        assert result.code is ShedCode.CRITICAL_ONLY
    monkeypatch.undo()
    assert recent_sheds(redis_client, keys, 300, now).by_code == {"critical_only": 2}
    wide = recent_sheds(redis_client, keys, 15 * 60, now)
    assert wide.by_type_and_code == {"complaint": {"critical_only": 2}, "archive_query": {"critical_only": 1}}


def test_liveness_does_not_need_redis_and_readiness_does(api_settings: Settings) -> None:
    dead = api_settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with serve(create_app(dead)) as base_url:
        assert requests.get(base_url + "/livez", timeout=5).json() == {"status": "ok"}
        for path in ("/readyz", "/healthz"):
            assert requests.get(base_url + path, timeout=10).status_code == 503, path


def test_depth_history_keeps_the_window_oldest_first(api: Api, redis_client: Redis) -> None:
    keys = api.queue_keys
    now = 1_800_000_000.0
    for age, depth in ((600, 1), (200, 5), (10, 9)):
        append_depth(redis_client, keys, now - age, {"complaint": depth, "loan_approval": 1})
    history = read_depth_history(redis_client, keys, 300, now)
    assert [h["at"] for h in history] == [now - 200, now - 10]
    assert history[-1]["depth_by_type"] == {"complaint": 9, "loan_approval": 1}
