"""Shared fixtures: a real Redis (own database, unique queue per test), the default policy.

Tests never flush a database: each one works in a queue of its own (`{tidegate:test-…}`) and
deletes only the keys under that hash tag afterwards, so they can run beside anything else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from producer.producer import Producer
from shared.keys import QueueKeys
from shared.policy import Policy, default_policy_text, load_policy
from shared.queue import TicketQueue
from tests.private_redis import private_redis
from tests.redis_cluster import ON_CLUSTER, RedisClusterHarness, redis_cluster, suite_client, suite_env

TEST_REDIS_URL = os.environ.get("TIDEGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")


def delete_queue_keys(client: Redis, queue_name: str) -> None:
    pattern = QueueKeys(queue_name).prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    batch = list(client.scan_iter(match=pattern, count=1000))
    for start in range(0, len(batch), 500):
        client.delete(*batch[start : start + 500])


@pytest.fixture(scope="session")
def redis_cluster_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterHarness]:
    """A real 3-master, 3-replica cluster on loopback for the whole session."""
    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as harness:
        yield harness


@pytest.fixture(scope="session")
def cluster_environment(
    redis_cluster_harness: RedisClusterHarness, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """On the cluster, every process this session starts (and Settings() here, as rq's jobs read it)
    finds the cluster, and rq a single Redis of its own, as a deployment would configure them."""
    with private_redis(tmp_path_factory.mktemp("rq-redis")) as rq_url, pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIDEGATE_REDIS_URL", redis_cluster_harness.seed_url)
        patch.setenv("TIDEGATE_REDIS_CLUSTER", "true")
        patch.setenv("TIDEGATE_RQ_REDIS_URL", rq_url)
        yield


@pytest.fixture(scope="session")
def rq_url(redis_url: str) -> str:
    """rq's Redis: the suite's; on the cluster (where rq cannot run) a single Redis of its own."""
    return os.environ["TIDEGATE_RQ_REDIS_URL"] if ON_CLUSTER else redis_url


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """The suite's Redis: TIDEGATE_TEST_REDIS_URL, or with TIDEGATE_TEST_REDIS_CLUSTER=1 a cluster."""
    if ON_CLUSTER:
        harness: RedisClusterHarness = request.getfixturevalue("redis_cluster_harness")
        request.getfixturevalue("cluster_environment")
        return harness.seed_url
    client = Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except Exception as exc:  # the message names the URL: the fix is to start redis-server there
        pytest.exit(f"no Redis at {TEST_REDIS_URL} for the integration tests: {exc}", returncode=3)
    finally:
        client.close()
    return TEST_REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Redis]:
    client = suite_client(redis_url)
    yield client
    client.close()


@pytest.fixture
def queue_name(redis_client: Redis) -> Iterator[str]:
    """A queue no other test touches; its keys are removed afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    delete_queue_keys(redis_client, name)


@pytest.fixture
def second_queue(redis_client: Redis, queue_name: str) -> Iterator[str]:
    """A second queue beside the test's own (a worker's or monitor's `--queue a,b`); its keys are removed afterwards."""
    name = f"{queue_name}-{uuid.uuid4().hex[:4]}"
    yield name
    delete_queue_keys(redis_client, name)


@pytest.fixture
def loopback_callbacks_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A policy file allowing callbacks to 127.0.0.1 (the tests' receivers), also set as this
    process's TIDEGATE_POLICY_FILE so callback jobs run in the test process read it."""
    path = tmp_path / "policy-loopback-callbacks.toml"
    path.write_text(default_policy_text() + '\n[callbacks]\nallow_hosts = ["127.0.0.1"]\n')
    monkeypatch.setenv("TIDEGATE_POLICY_FILE", str(path))
    return str(path)


@pytest.fixture(scope="session")
def policy() -> Policy:
    return load_policy()


@pytest.fixture
def ticket_queue(redis_client: Redis, policy: Policy, queue_name: str) -> TicketQueue:
    return TicketQueue(redis_client, policy, queue_name)


@pytest.fixture
def producer(redis_client: Redis, policy: Policy, queue_name: str) -> Producer:
    return Producer(redis_client, policy, queue_name, admission_cache_seconds=0)


RunCli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_cli(redis_url: str, queue_name: str) -> RunCli:
    """Run `tidegate ARGS…` as a user would, in a subprocess bound to this test's Redis and queue."""
    env = {**os.environ, **suite_env(redis_url), "TIDEGATE_QUEUE_NAME": queue_name}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "from tidegate.cli import main; main()", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    return run
