"""The API's HTTP metrics: every answer counted once, in its status class (429 apart) and under its route."""

from __future__ import annotations

import pytest
import requests
from fastapi.routing import APIRoute
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from producer.api.http_metrics import ANSWER_SECONDS, handler_of, status_class
from tests.producer.api.conftest import Api, publish_alarm

COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice."}


@pytest.mark.parametrize(
    ("status", "name"), [(200, "2xx"), (202, "2xx"), (307, "3xx"), (404, "4xx"), (429, "429"), (503, "5xx")]
)
def test_status_classes_keep_429_apart(status: int, name: str) -> None:
    assert status_class(status) == name


def answer_counts(api: Api) -> dict[str, float]:
    body = requests.get(api.url("/metrics"), timeout=5).text
    return {
        sample.labels["status_class"]: sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == ANSWER_SECONDS + "_count"
    }


def test_each_answer_is_timed_in_its_class(api: Api, branch_key: str, redis_client: Redis) -> None:
    before = answer_counts(api)
    with api.session(branch_key) as branch:
        assert branch.post(api.url("/v1/tickets"), json=COMPLAINT, timeout=5).status_code == 202
        assert branch.get(api.url("/v1/tickets/nonexistent"), timeout=5).status_code == 404
        publish_alarm(redis_client, api.queue_keys, "red")
        assert branch.post(api.url("/v1/tickets"), json=COMPLAINT, timeout=5).status_code == 429
        assert branch.post(api.url("/v1/tickets"), json=COMPLAINT, timeout=5).status_code == 429
    after = answer_counts(api)
    grown = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    assert grown == {"2xx": 1, "3xx": 0, "4xx": 1, "429": 2, "5xx": 0}  # the scrapes are not timed


def test_the_handler_is_the_matched_routes_template_or_the_mount_or_none() -> None:
    route = APIRoute("/v1/tickets/{ticket_id}", lambda ticket_id: None)
    mounts = ("/ui/static",)
    assert handler_of({"route": route, "path": "/v1/tickets/t1"}, mounts) == "/v1/tickets/{ticket_id}"
    assert handler_of({"path": "/ui/static/ui.css"}, mounts) == "/ui/static"
    assert handler_of({"path": "/ui/staticky"}, mounts) == "none"
    assert handler_of({"path": "/wp-login.php"}, mounts) == "none"  # a scan shares one series
