"""The OpenAI front door end to end: the real API (uvicorn), a real worker, the simulator, real Redis.

The API and the worker share the fast test policy, so leases and backoffs are short; every test
runs in its own queue. Clients are the real `openai` package pointed at the API's /v1.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from shared.config import Settings
from shared.keys import QueueKeys
from shared.queue import TicketQueue
from tests.producer.api.server import serve
from tests.worker import conftest as worker_fixtures
from tests.worker.conftest import RunningWorker

# The worker tests' fixtures, shared here: the fast policy, its queue, simulators and workers.
fast_policy_file = worker_fixtures.fast_policy_file
fast_policy = worker_fixtures.fast_policy
fast_queue = worker_fixtures.fast_queue
simulator = worker_fixtures.simulator
start_worker = worker_fixtures.start_worker

SDK_TIMEOUT = 30.0


@dataclass(frozen=True)
class Gateway:
    base_url: str
    settings: Settings
    keys: ApiKeyStore
    queue: TicketQueue

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def key(self, branch: str = "0412", default_type: str | None = "complaint") -> str:
        return self.keys.create(Role.BRANCH, branch, "openai test", default_type=default_type)[0]

    def client(self, key: str, **options: object) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        options.setdefault("timeout", SDK_TIMEOUT)
        return openai.OpenAI(base_url=self.v1, api_key=key, **options)  # type: ignore[arg-type]

    def async_client(self, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.v1, api_key=key, timeout=SDK_TIMEOUT, max_retries=0)


@pytest.fixture
def gateway(
    redis_url: str, redis_client: Redis, queue_name: str, fast_policy_file: Path, fast_queue: TicketQueue
) -> Iterator[Gateway]:
    settings = Settings(
        redis_url=redis_url,
        queue_name=queue_name,
        policy_file=str(fast_policy_file),
        operator_key="op_" + secrets.token_urlsafe(16),
    )
    app = create_app(settings, auth_cache_seconds=0.2, admission_cache_seconds=0)
    with serve(app) as base_url:
        yield Gateway(base_url, settings, ApiKeyStore(redis_client, QueueKeys(queue_name)), fast_queue)


@pytest.fixture
def backend(
    simulator: Callable[..., SimulatorProcess], start_worker: Callable[..., RunningWorker]
) -> SimulatorProcess:
    """A fast simulator with one worker in front of it."""
    sim = simulator()
    start_worker(sim.base_url, gpu_backend=None)
    return sim
