"""A stalled Redis (SIGSTOP, as a paused VM or a partition looks): every API route answers 503 with
Retry-After within the stated bound, workers stop claiming, and everything resumes by itself with
every ticket done exactly once."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from ops.lab.embedded_redis import RedisHandle, ensure_redis
from ops.lab.sim.process import SimulatorProcess
from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from shared.config import Settings
from shared.models import TicketStatus
from shared.policy import Policy
from shared.queue import TicketQueue
from shared.redis_conn import CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS, make_client
from tests.producer.api.server import serve
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker
from worker.config import WorkerConfig
from worker.deadlines import DEADLINE_PASSED
from worker.gpu_memory import make_provider
from worker.worker import Worker

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")

ANSWER_BOUND_SECONDS = READ_TIMEOUT_SECONDS + CONNECT_TIMEOUT_SECONDS + 1.0
"""What README states: a route answers within one read timeout (plus a fresh connection's
connect timeout, plus scheduling slack) while Redis is stalled."""
TICKETS = 12


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisHandle]:
    handle = ensure_redis(None, embedded="redis-server", run_dir=tmp_path)
    yield handle
    if handle.child is not None:
        handle.child.signal(signal.SIGCONT)
    handle.stop()


def _body(i: int) -> dict[str, Any]:
    return {"type": "complaint", "prompt": f"card {i} declined " * 8, "max_tokens": 16}


def _routes(ticket_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("GET", "/v1/status", None),
        ("GET", "/v1/queues", None),
        ("POST", "/v1/tickets", _body(99)),
        ("POST", "/v1/tickets/batch", {"tickets": [_body(98)]}),
        ("GET", f"/v1/tickets/{ticket_id}", None),
        ("DELETE", f"/v1/tickets/{ticket_id}", None),
        ("PUT", "/v1/mode", {"mode": "normal"}),
        ("GET", "/metrics", None),
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", _chat()),
        ("POST", "/v1/completions", {**_chat(), "messages": None, "prompt": "my card was declined"}),
    ]


def _submit_route() -> tuple[str, str, dict[str, Any] | None]:
    return ("POST", "/v1/tickets", _body(99))


def _chat() -> dict[str, Any]:
    return {
        "model": "tidegate",
        "messages": [{"role": "user", "content": "my card was declined"}],
        "max_tokens": 8,
        "tidegate": {"type": "complaint"},
    }


def _call(
    session: requests.Session, base: str, route: tuple[str, str, dict[str, Any] | None]
) -> tuple[int, str | None, float]:
    method, path, body = route
    started = time.monotonic()
    reply = session.request(method, base + path, json=body, timeout=30)
    return reply.status_code, reply.headers.get("Retry-After"), time.monotonic() - started


def _worker(redis_url: str, sim: SimulatorProcess, policy: Policy, queue_name: str) -> RunningWorker:
    config = WorkerConfig(
        gpu=0,
        vllm_url=sim.base_url,
        worker_id=f"stall-{queue_name}",
        queue_name=queue_name,
        lease_seconds=policy.queue.lease_seconds,
        grace_seconds=5.0,
        heartbeat_seconds=0.5,
        resize_seconds=0.5,
        block_seconds=1.0,
    )
    provider = make_provider("sim", sim.base_url)
    running = RunningWorker(Worker(config, make_client(redis_url), policy, gpu_provider=provider))
    running.thread.start()
    return running


def _stall_scenario(
    stall_seconds: float,
    private_redis: RedisHandle,
    simulator: Callable[..., SimulatorProcess],
    fast_policy: Policy,
    fast_policy_file: Path,
) -> None:
    assert private_redis.child is not None
    queue_name = "stall"
    settings = Settings(
        redis_url=private_redis.url,
        queue_name=queue_name,
        operator_key="op_stall_test_key",
        policy_file=str(fast_policy_file),
    )
    client = make_client(private_redis.url)
    branch_key = ApiKeyStore(client, TicketQueue(client, fast_policy, queue_name).keys).create(
        Role.BRANCH, "0412", "stall test"
    )[0]
    sim = simulator()
    worker = _worker(private_redis.url, sim, fast_policy, queue_name)
    app = create_app(settings, auth_cache_seconds=60)
    with serve(app) as base, requests.Session() as branch, requests.Session() as operator:
        branch.headers["Authorization"] = f"Bearer {branch_key}"
        operator.headers["Authorization"] = "Bearer op_stall_test_key"
        ids = [
            branch.post(base + "/v1/tickets", json=_body(i), timeout=10).json()["id"] for i in range(TICKETS)
        ]
        operator.get(base + "/v1/queues", timeout=10).raise_for_status()  # both keys now cached

        private_redis.child.signal(signal.SIGSTOP)
        stalled_at = time.monotonic()
        answers: list[tuple[str, int, str | None, float]] = []
        while time.monotonic() - stalled_at < stall_seconds - ANSWER_BOUND_SECONDS:
            for route in _routes(ids[0]):
                session = operator if route[1] in ("/v1/queues", "/v1/mode", "/v1/status") else branch
                status, retry_after, took = _call(session, base, route)
                answers.append((f"{route[0]} {route[1]}", status, retry_after, took))
        with ThreadPoolExecutor(8) as pool:  # concurrent callers are answered within the bound too
            burst = list(pool.map(lambda r: _call(branch, base, r), [_submit_route()] * 8))
        private_redis.child.signal(signal.SIGCONT)

        for name, status, retry_after, took in answers:
            if name in ("GET /metrics", "GET /v1/models"):  # may answer from what they last read
                assert status in (200, 503) and took <= ANSWER_BOUND_SECONDS, (name, status, took)
                continue
            assert status == 503, (name, status)
            assert retry_after is not None and int(retry_after) >= 1, name
            assert took <= ANSWER_BOUND_SECONDS, (name, took)
        assert all(s == 503 and t <= ANSWER_BOUND_SECONDS for s, _, t in burst), burst

        # After the stall: the API answers at once and the worker finishes every ticket, once each.
        wait_until(lambda: _call(branch, base, _routes(ids[0])[0])[0] == 200, 10, "healthz after the stall")
        ids.append(branch.post(base + "/v1/tickets", json=_body(200), timeout=10).json()["id"])
        queue = TicketQueue(client, fast_policy, queue_name)
        tickets = wait_until(
            lambda: (
                (ts := queue.get_many(ids)) and all(t is not None and t.status.terminal for t in ts) and ts
            ),
            60,
            "every ticket ended after the stall",
            interval=0.2,
        )
        # Done, or (queued through a stall longer than the type's SLO) ended unstarted, its deadline gone.
        done = [t for t in tickets if t and t.status is TicketStatus.DONE]
        late = [t for t in tickets if t and t.status is TicketStatus.EXPIRED]
        assert len(done) + len(late) == len(ids), [(t.status, t.error) for t in tickets if t]
        assert all((t.error or "").startswith(DEADLINE_PASSED) for t in late), [t.error for t in late]
        assert tickets[-1] and tickets[-1].status is TicketStatus.DONE, "the ticket sent after the stall"
        counts = queue.stats().counts
        assert counts["complaint:done"] == len(done)
        assert queue.stats().inflight == 0
    worker.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("ticket")], "a ticket thread is stuck"
    client.close()


@pytest.mark.timeout(200)
def test_a_stall_past_the_complaint_slo_answers_503_in_bound_and_resumes(
    private_redis: RedisHandle,
    simulator: Callable[..., SimulatorProcess],
    fast_policy: Policy,
    fast_policy_file: Path,
) -> None:
    """Longer than every lease and a complaint's SLO, so queued tickets may end past their deadline.
    Asking every route once takes most of that time already; a longer stall adds no state (TTLs
    outlast it), only CI time."""
    _stall_scenario(
        2 * fast_policy.types["complaint"].slo_seconds,
        private_redis,
        simulator,
        fast_policy,
        fast_policy_file,
    )
