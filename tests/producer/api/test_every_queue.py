"""`GET /v1/queues` for an operator key lists every queue workers have served, each with the same
view as the API's own; a branch key sees only its own queue, as before."""

from __future__ import annotations

from redis import Redis

from shared.keys import QueueKeys
from shared.policy import load_policy
from shared.queue import TicketQueue
from tests.producer.api.conftest import Api
from tests.worker.support import producer_for, submit_many
from worker.registry import WorkerRegistry


def test_an_operator_sees_every_served_queue_and_a_branch_only_its_own(
    api: Api, redis_client: Redis, branch_key: str, operator_key: str, second_queue: str
) -> None:
    second = TicketQueue(redis_client, load_policy(api.settings.policy_file), second_queue)
    submit_many(producer_for(second), 3, max_tokens=8)
    WorkerRegistry(redis_client, QueueKeys(second_queue), "w-second", 5.0).heartbeat({"gpu": 0})

    mine = api.session(branch_key).get(api.url("/v1/queues")).json()
    every = api.session(operator_key).get(api.url("/v1/queues")).json()

    assert mine["queue"] == api.settings.queue_name and mine["queues"] is None
    by_name = {q["queue"]: q for q in every["queues"]}
    assert {api.settings.queue_name, second_queue} <= set(by_name)
    assert by_name[second_queue]["depth"] == 3
    assert by_name[second_queue]["workers"]["alive"] == 1
    assert by_name[second_queue]["workers"]["details"][0]["worker_id"] == "w-second"
    assert by_name[api.settings.queue_name]["queues"] is None
