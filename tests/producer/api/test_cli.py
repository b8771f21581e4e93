"""`tidegate keys` and `tidegate api` (two uvicorn worker processes) from the command line."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests
from typer.testing import CliRunner

from ops.lab.bench.api_rate import api_process
from tidegate.cli import app


@pytest.fixture
def env(redis_url: str, queue_name: str) -> dict[str, str]:
    return {"TIDEGATE_REDIS_URL": redis_url, "TIDEGATE_QUEUE_NAME": queue_name}


def _keys(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["keys", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_keys_create_list_revoke(env: dict[str, str]) -> None:
    code, out, _ = _keys(env, "create", "--branch", "0412", "--label", "front desk", "--json")
    assert code == 0
    created = json.loads(out)
    assert created["key"].startswith("tg_")
    assert (created["branch_id"], created["role"], created["revoked"]) == ("0412", "branch", False)

    code, out, _ = _keys(env, "list", "--json")
    listed = json.loads(out)["keys"]
    assert [k["key_id"] for k in listed] == [created["key_id"]]
    assert (
        created["key"] not in out and created["callback_secret"] not in out
    )  # the secret is shown once, at creation

    # The branch's first key also made its callback signing secret; a second key does not show it.
    assert created["callback_secret"].startswith("whsec_")
    code, out, _ = _keys(env, "create", "--branch", "0412")
    assert code == 0 and "whsec_" not in out
    code, out, _ = _keys(env, "create", "--branch", "0413")
    assert code == 0 and "callback signing secret of branch 0413" in out
    code, out, _ = _keys(env, "rotate-secret", "--branch", "0412", "--json")
    rotated = json.loads(out)["callback_secret"]
    assert code == 0 and rotated.startswith("whsec_") and rotated != created["callback_secret"]
    assert _keys(env, "rotate-secret", "--branch", "04 12")[0] == 2

    code, out, _ = _keys(env, "create", "--branch", "0414", "--default-type", "archive_query", "--json")
    typed = json.loads(out)
    assert code == 0 and typed["default_type"] == "archive_query"
    code, out, _ = _keys({**env, "COLUMNS": "200"}, "list")  # wide enough for one line per key
    (row,) = [line for line in out.splitlines() if typed["key_id"] in line]
    assert code == 0 and "default type" in out and "archive_query" in row

    code, out, _ = _keys(env, "revoke", created["key_id"], "--json")
    assert code == 0
    assert json.loads(out)["revoked"] is True


def test_keys_bad_input_exits_2_with_the_reason(env: dict[str, str]) -> None:
    code, _, err = _keys(env, "create", "--branch", "04 12")
    assert code == 2
    assert "not a valid branch id" in err
    code, _, err = _keys(env, "create")
    assert code == 2
    assert "exactly one of --branch ID or --operator" in err
    code, _, err = _keys(env, "revoke", "nope")
    assert code == 2
    assert "no API key with id 'nope'" in err


@pytest.fixture
def served_api(env: dict[str, str]) -> Iterator[str]:
    with api_process(env, workers=2) as base_url:
        yield base_url


def test_api_command_serves_with_two_workers(served_api: str, env: dict[str, str]) -> None:
    key = json.loads(_keys(env, "create", "--branch", "0412", "--json")[1])["key"]
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {key}"
        ids = {
            session.post(served_api + "/v1/tickets", json={"type": "complaint", "prompt": f"n{i}"}).json()[
                "id"
            ]
            for i in range(20)
        }
        assert len(ids) == 20
        assert session.get(served_api + "/v1/queues").json()["types"]["complaint"]["depth"] == 20
    assert requests.get(served_api + "/openapi.json", timeout=5).json()["info"]["title"] == "tidegate"
    assert requests.get(served_api + "/docs", timeout=5).status_code == 200
