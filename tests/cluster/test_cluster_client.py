"""tidegate on a real Redis Cluster: one slot per queue, scripts per node, blocking pops, WAIT."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import cast

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from shared.config import Settings
from shared.keys import QueueKeys
from shared.models import TicketRequest, TicketStatus
from shared.policy import Policy
from shared.queue import TicketQueue
from shared.redis_conn import connect_from
from shared.replica_acks import ReplicaAcksMissing
from tests.conftest import delete_queue_keys
from tests.redis_cluster import RedisClusterHarness
from tests.waiting import wait_until


@pytest.fixture
def cluster(redis_cluster_harness: RedisClusterHarness) -> Iterator[Redis]:
    client = connect_from(Settings(redis_url=redis_cluster_harness.seed_url, redis_cluster=True))
    yield client
    client.close()


@pytest.fixture
def names(cluster: Redis) -> Iterator[list[str]]:
    """Fresh queue names; their keys are deleted afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        delete_queue_keys(cluster, name)


def _name(names: list[str]) -> str:
    names.append(f"cl-{uuid.uuid4().hex[:10]}")
    return names[-1]


def _loan() -> TicketRequest:
    return TicketRequest(type="loan_approval", branch_id="b0412", prompt="approve?")


def test_settings_give_a_cluster_client_and_every_key_of_a_queue_one_slot(cluster: Redis) -> None:
    assert isinstance(cluster, RedisCluster)
    keys = QueueKeys("pool-a")
    spelled = [
        getattr(keys, name) for name in dir(QueueKeys) if isinstance(getattr(QueueKeys, name), property)
    ]
    spelled += [
        keys.ticket("x"),
        keys.waiting("loan_approval"),
        keys.idempotency("b1", "k"),
        keys.worker("w"),
    ]
    slots = {cluster.keyslot(key) for key in spelled}
    assert len(spelled) > 20 and len(slots) == 1


def test_queues_spread_over_the_masters(redis_cluster_harness: RedisClusterHarness) -> None:
    owners = {redis_cluster_harness.master_of(QueueKeys(f"region-{i}").pending).port for i in range(12)}
    assert len(owners) == 3


def test_a_ticket_round_trip_on_the_cluster_survives_a_flushed_script_cache(
    cluster: Redis, redis_cluster_harness: RedisClusterHarness, policy: Policy, names: list[str]
) -> None:
    queue = TicketQueue(cluster, policy, _name(names))
    first = queue.enqueue(_loan())
    owner = redis_cluster_harness.master_of(queue.keys.pending).client()
    owner.script_flush()  # as a promoted replica or a restarted node starts: no scripts loaded
    second = queue.enqueue_many([_loan(), _loan()])  # the pipeline path reloads them on that node
    claimed = queue.claim("w1", 5)
    owner.script_flush()
    assert queue.extend_many([(c.ticket.id, c.token) for c in claimed]) == {
        c.ticket.id: "ok" for c in claimed
    }
    for c in claimed:
        assert queue.finish(c.ticket.id, c.token, "done", result="yes")
    assert {c.ticket.id for c in claimed} == {first.ticket_id, *(r.ticket_id for r in second)}
    got = queue.get_many([c.ticket.id for c in claimed])
    assert all(t is not None and t.status == TicketStatus.DONE for t in got)
    owner.close()


def test_an_idle_worker_blocks_on_the_wake_list_until_a_ticket_arrives(
    cluster: Redis, policy: Policy, names: list[str]
) -> None:
    queue = TicketQueue(cluster, policy, _name(names))
    woke: list[float] = []
    waiter = threading.Thread(
        target=lambda: woke.append(time.monotonic()) if queue.wait_for_work(8) else None
    )
    waiter.start()
    nodes = cast(RedisCluster, cluster)
    wake_node = nodes.get_node_from_key(queue.keys.wake)

    def blocked_on_the_wake_list() -> bool:
        listed = nodes.client_list(target_nodes=wake_node)
        return any(c.get("cmd") == "blpop" and "b" in c.get("flags", "") for c in listed)

    # The enqueue must find the worker already blocked, or the pop returns at once and proves nothing.
    wait_until(blocked_on_the_wake_list, 10, "the waiter blocked in BLPOP on the wake list's master")
    sent = time.monotonic()
    queue.enqueue(_loan())
    waiter.join(10)
    assert woke and woke[0] - sent < 2.0


def test_replica_acks_wait_on_the_master_of_the_queues_slot(
    cluster: Redis, policy: Policy, names: list[str]
) -> None:
    acked = TicketQueue(cluster, policy, _name(names), replica_acks=1)
    result = acked.enqueue(_loan())
    assert result.outcome == "queued"
    [claimed] = acked.claim("w1", 1)
    assert acked.finish(claimed.ticket.id, claimed.token, "done", result="yes")
    # Each master has one replica: asking for two cannot be met, and says so instead of answering.
    greedy = TicketQueue(cluster, policy, _name(names), replica_acks=2)
    started = time.monotonic()
    with pytest.raises(ReplicaAcksMissing, match="1 of 2 replicas"):
        greedy.enqueue(_loan())
    assert time.monotonic() - started >= 0.9
