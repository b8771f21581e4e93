"""The rollout in `GET /v1/queues`: state for every key, the candidate and the arms for operators."""

from __future__ import annotations

import requests
from redis import Redis

from shared.rollout_stats import record_call
from shared.rollout_store import RolloutStore
from tests.producer.api.conftest import Api


def test_queues_show_the_rollout_and_only_operators_see_the_candidate(
    api: Api, branch: requests.Session, operator_key: str, redis_client: Redis
) -> None:
    assert branch.get(api.url("/v1/queues")).json()["rollout"] is None
    store = RolloutStore(redis_client, api.queue_keys)
    state = store.start(
        candidate_url="http://127.0.0.1:18000",
        version="2026.12",
        interval_seconds=7200,
        shadow_fraction=0.1,
        actor="t",
    )
    record_call(
        redis_client,
        api.queue_keys,
        api.settings.policy.rollout,
        rollout_id=state.id,
        wave=0,
        arm="candidate",
        outcome="error",
        ttft_seconds=None,
    )
    seen = branch.get(api.url("/v1/queues")).json()["rollout"]
    assert (seen["status"], seen["wave"], seen["version"]) == ("running", 0, "2026.12")
    assert seen["candidate"] is None and seen["arms"] is None
    with api.session(operator_key) as operator:
        full = operator.get(api.url("/v1/queues")).json()["rollout"]
    assert full["candidate"] == "http://127.0.0.1:18000"
    assert full["arms"]["candidate"]["error"] == 1 and full["arms"]["candidate"]["error_rate"] == 1.0
    assert full["next_wave_at"] == state.started_at + 7200
