"""ensure_redis: the configured URL, the local Redis, or one it starts (redis-server, else fakeredis)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import cast

import pytest

from ops.lab.embedded_redis import FORCE_ENV, RedisStartError, ensure_redis
from ops.lab.procs.process_group import group_alive
from shared.models import TicketRequest
from shared.policy import Policy
from shared.queue import TicketQueue
from shared.redis_conn import make_client


def claim_round_trip(url: str, policy: Policy) -> None:
    """Enqueue, claim by priority and finish through the Lua scripts: what the queue needs of a Redis."""
    client = make_client(url)
    try:
        queue = TicketQueue(client, policy, "embedded-check")
        queue.enqueue(TicketRequest(type="complaint", branch_id="b1", prompt="late card", max_tokens=8))
        queue.enqueue(TicketRequest(type="loan_approval", branch_id="b1", prompt="loan file", max_tokens=8))
        claimed = queue.claim("w1", 5, lease_seconds=5)
        assert [c.ticket.type for c in claimed] == ["loan_approval", "complaint"]
        assert queue.finish(claimed[0].ticket.id, claimed[0].token, "done", result="approved")
        assert queue.stats().counts["loan_approval:done"] == 1
    finally:
        client.close()


def test_fakeredis_fallback_runs_the_queue_scripts(
    tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORCE_ENV, "fakeredis")
    handle = ensure_redis(None, run_dir=tmp_path)
    try:
        assert handle.kind == "embedded fakeredis"
        assert not handle.shared
        claim_round_trip(handle.url, policy)
    finally:
        handle.stop()
    assert handle.child is not None and handle.child.pid is not None
    assert not group_alive(handle.child.pid)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server binary on PATH")
def test_embedded_redis_server_without_persistence(tmp_path: Path, policy: Policy) -> None:
    handle = ensure_redis(None, embedded="redis-server", run_dir=tmp_path)
    try:
        assert handle.kind == "embedded redis-server"
        claim_round_trip(handle.url, policy)
        client = make_client(handle.url)
        config = cast("dict[str, str]", client.config_get("*"))
        client.close()
        assert (config["save"], config["appendonly"]) == ("", "no")
    finally:
        handle.stop()
    assert not list(tmp_path.glob("*.rdb"))


def test_a_given_url_is_used_as_is_and_never_stopped(redis_url: str) -> None:
    handle = ensure_redis(redis_url)
    assert (handle.kind, handle.url, handle.shared) == ("external", redis_url, True)
    handle.stop()  # nothing to stop: the Redis is someone else's
    assert make_client(redis_url).ping()


def test_a_given_url_that_does_not_answer_is_an_error() -> None:
    with pytest.raises(RedisStartError, match="does not answer"):
        ensure_redis("redis://127.0.0.1:1/0")


def test_bad_choices_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORCE_ENV, "keydb")
    with pytest.raises(RedisStartError, match="TIDEGATE_EMBEDDED_REDIS='keydb' is not accepted"):
        ensure_redis(None)


def test_nothing_configured_or_running_starts_one(tmp_path: Path, policy: Policy) -> None:
    """The fresh-machine path: no TIDEGATE_REDIS_URL and nothing on the local port."""
    handle = ensure_redis(None, run_dir=tmp_path, local_url="redis://127.0.0.1:1/0")
    try:
        expected = "embedded redis-server" if shutil.which("redis-server") else "embedded fakeredis"
        assert handle.kind == expected
        assert handle.describe() == f"{expected} at {handle.url}"
        claim_round_trip(handle.url, policy)
    finally:
        handle.stop()
