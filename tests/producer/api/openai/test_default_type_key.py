"""`tidegate keys create --default-type`: the type of OpenAI-style calls that name none."""

from __future__ import annotations

import json

from redis import Redis
from typer.testing import CliRunner

from shared.keys import QueueKeys
from tests.producer.api.conftest import publish_alarm
from tests.producer.api.openai.conftest import Gateway
from tidegate.cli import app


def _keys(gateway: Gateway, *args: str) -> tuple[int, str, str]:
    env = {
        "TIDEGATE_REDIS_URL": gateway.settings.redis_url or "",
        "TIDEGATE_QUEUE_NAME": gateway.settings.queue_name,
    }
    result = CliRunner().invoke(app, ["keys", "create", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_a_key_created_with_a_default_type_submits_that_type(gateway: Gateway, redis_client: Redis) -> None:
    code, out, _ = _keys(gateway, "--branch", "0412", "--default-type", "complaint", "--json")
    assert code == 0
    created = json.loads(out)
    assert created["default_type"] == "complaint"
    publish_alarm(redis_client, QueueKeys(gateway.settings.queue_name), "red")  # answered at once, no worker
    raw = gateway.client(created["key"]).chat.completions.with_raw_response.create(
        model="tidegate", messages=[{"role": "user", "content": "Card declined."}]
    )
    ticket = gateway.queue.get(raw.headers["x-tidegate-ticket-id"])
    assert ticket is not None and (ticket.type, ticket.branch_id) == ("complaint", "0412")


def test_an_unknown_default_type_exits_2_listing_the_types(gateway: Gateway) -> None:
    code, _, err = _keys(gateway, "--branch", "0412", "--default-type", "mortgage")
    assert code == 2
    assert "'mortgage' is not a ticket type" in err and "loan_approval" in err
