"""The audit trail of a session: an operator key made on the command line switches the mode over
HTTP, a branch key is created and revoked; `tidegate audit --json` and `GET /v1/audit` list each
action with who took it (the acting key's name over HTTP, `--actor` on the command line)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis import Redis

from shared.audit import read_audit
from shared.keys import QueueKeys
from shared.rollout_store import RolloutStore
from tests.conftest import RunCli
from tests.producer.api.conftest import Api


def _cli_json(run_cli: RunCli, *args: str) -> Any:
    result = run_cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_session_is_listed_with_the_acting_keys_name(api: Api, run_cli: RunCli) -> None:
    operator = _cli_json(run_cli, "keys", "create", "--operator", "--label", "ops desk", "--actor", "alice")
    with api.session(operator["key"]) as session:
        answer = session.put(api.url("/v1/mode"), json={"mode": "critical-only"}, timeout=10)
        assert answer.status_code == 200, answer.text
    branch = _cli_json(run_cli, "keys", "create", "--branch", "0412", "--actor", "bob")
    _cli_json(run_cli, "keys", "revoke", branch["key_id"], "--actor", "bob")

    doc = _cli_json(run_cli, "audit")
    seen = [(e["action"], e["actor"], e["target"]) for e in doc["entries"]]
    assert seen == [
        ("key.revoke", "bob", branch["key_id"]),
        ("key.create", "bob", branch["key_id"]),
        ("mode.set", f"key:{operator['key_id']} (ops desk)", api.settings.queue_name),
        ("key.create", "alice", operator["key_id"]),
    ]
    revoke, created, mode = doc["entries"][:3]
    assert (mode["before"], mode["after"]) == ("normal", "critical-only")
    assert created["before"] is None and created["after"]["branch_id"] == "0412"
    assert (revoke["before"]["revoked_at"], revoke["after"]["revoked_at"] is not None) == (None, True)
    assert doc["entries"][0]["time"] >= doc["entries"][-1]["time"]
    assert all(branch["key"] not in json.dumps(e) for e in doc["entries"])  # the token never

    table = run_cli("audit", "--limit", "2")
    assert table.returncode == 0 and "key.revoke" in table.stdout and "mode.set" not in table.stdout

    with api.session(operator["key"]) as session:
        over_http = session.get(api.url("/v1/audit"), params={"limit": 3}, timeout=10).json()
    assert over_http == {"entries": doc["entries"][:3]}


def test_only_operator_keys_read_the_trail(api: Api, branch_key: str, operator_key: str) -> None:
    with api.session(None) as anonymous:
        assert anonymous.get(api.url("/v1/audit"), timeout=10).status_code == 401
    with api.session(branch_key) as branch:
        assert branch.get(api.url("/v1/audit"), timeout=10).status_code == 403
    with api.session(operator_key) as operator:
        assert operator.get(api.url("/v1/audit"), params={"limit": 0}, timeout=10).status_code == 422
        entries = operator.get(api.url("/v1/audit"), timeout=10).json()["entries"]
    assert [e["action"] for e in entries] == ["key.create"]  # the branch key of the fixture


@pytest.mark.parametrize("step", ["pause", "rollback"])
def test_rollout_steps_are_audited(redis_client: Redis, queue_name: str, step: str) -> None:
    keys = QueueKeys(queue_name)
    store = RolloutStore(redis_client, keys)
    started = store.start(
        candidate_url="http://127.0.0.1:9",
        version="v2",
        interval_seconds=60,
        shadow_fraction=0,
        actor="carol",
    )
    if step == "pause":
        store.pause("dave")
    else:
        store.rollback("dave", "worse latency")
    last, first = read_audit(redis_client, keys, 2)
    assert (first.action, first.actor, first.target, first.before) == (
        "rollout.start",
        "carol",
        started.id,
        None,
    )
    assert (last.action, last.actor, last.before["status"]) == (f"rollout.{step}", "dave", "running")
    assert last.after["status"] == ("paused" if step == "pause" else "rolled_back")
