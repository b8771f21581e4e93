"""Overload must not fill Redis: lean rejected records, and the memory guard that sheds before the limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from redis import Redis

from ops.monitor.loop import Monitor, MonitorConfig
from ops.monitor.memory_guard import MemoryGuard, MemoryReading
from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from producer.cli import status_documents
from producer.producer import Producer
from shared.config import Settings
from shared.control import Mode, read_events, set_mode
from shared.keys import QueueKeys
from shared.policy import AlarmPolicy, MemoryPolicy, Policy
from shared.queue import Outcome, TicketQueue
from shared.shed import ShedCode
from tests.private_redis import private_redis
from tests.producer.api.server import serve
from tests.redis_cluster import ON_CLUSTER
from tests.waiting import wait_until

MAXMEMORY = 64 * 1024 * 1024

# Each test runs a small single Redis of its own, while a cluster run's environment names the cluster.
pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="runs on a private single Redis, not the suite's")


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[str]:
    with private_redis(tmp_path, ["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"]) as url:
        yield url


def test_the_guard_turns_on_at_high_water_and_off_below_the_clear_line() -> None:
    guard = MemoryGuard(MemoryPolicy(high_water=0.8, clear_below=0.7))
    readings = [0.5, 0.79, 0.8, 0.75, 0.71, 0.69, 0.85]
    seen = [guard.observe(MemoryReading(int(r * 1000), 1000)) for r in readings]
    assert seen == [False, False, True, True, True, False, True]
    assert guard.observe(MemoryReading(900, None)) is False  # no budget: the guard is off


class _LoanWorker:
    """Finishes whatever is queued, as a worker would, so accepted loans end `done`."""

    def __init__(self, queue: TicketQueue) -> None:
        self.queue = queue
        self.stop = threading.Event()
        self.done = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # Claims and finishes in one round trip each, so it keeps up with the batch route while it
        # shares the process (and the interpreter) with the API.
        while not self.stop.is_set():
            leases = self.queue.claim("storm-worker", 500)
            outcomes = [Outcome(lease.ticket.id, lease.token, "done", result="approved") for lease in leases]
            self.done += sum(reply == "ok" for reply in self.queue.finish_many(outcomes))
            if not leases:
                self.queue.wait_for_work(0.05)

    def __enter__(self) -> _LoanWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def _monitor_ticking(monitor: Monitor, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.wait(0.2):
            monitor.tick()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_retry_storm_on_a_64mb_redis_keeps_loans_flowing_and_the_books_balanced(
    small_redis: str, policy: Policy
) -> None:
    """About 100,000 submissions, nineteen in twenty shed, with no idempotency keys (the worst case:
    every retry is a new record), through the HTTP batch route of the real API."""
    client = Redis.from_url(small_redis, decode_responses=True)
    settings = Settings(redis_url=small_redis, queue_name="storm", operator_key="op-storm-key")
    keys = QueueKeys("storm")
    set_mode(client, keys, Mode.CRITICAL_ONLY, actor="test")  # shed every non-critical ticket
    branch_key = ApiKeyStore(client, keys).create(Role.BRANCH, "0412", "storm branch")[0]
    complaint = {"type": "complaint", "vip_level": 1, "prompt": "my card was blocked twice today " * 60}
    loan = {"type": "loan_approval", "urgent_level": 2, "prompt": "approve 25k for client 7781?"}
    batch = [loan if i % 20 == 0 else complaint for i in range(500)]
    statuses: dict[int, int] = {}
    before = int(client.info("memory")["used_memory"])
    peak = 0
    monitor = Monitor(client, client, settings.policy, "storm", MonitorConfig(interval_seconds=0.2))
    stop = threading.Event()
    ticking = _monitor_ticking(monitor, stop)
    app = create_app(settings, auth_cache_seconds=5, admission_cache_seconds=0.25)
    try:
        with serve(app) as base_url, _LoanWorker(TicketQueue(client, policy, "storm")) as worker:
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {branch_key}"
            for _ in range(200):
                answer = session.post(base_url + "/v1/tickets/batch", json={"tickets": batch}, timeout=60)
                assert answer.status_code == 200, answer.text
                for item in answer.json()["results"]:
                    statuses[item["status_code"]] = statuses.get(item["status_code"], 0) + 1
                peak = max(peak, int(client.info("memory")["used_memory"]))
            wait_until(lambda: worker.done >= statuses.get(202, 0), 30, "the worker to end every ticket")
    finally:
        stop.set()
        ticking.join(timeout=10)
    assert set(statuses) == {202, 429}, statuses  # no 500, no 503
    assert statuses[202] == 200 * 25 and statuses[429] == 200 * 475
    assert worker.done == statuses[202], "every admitted loan approval finished"
    assert peak < MAXMEMORY * 0.8, f"peak {peak} bytes reached the guard's high-water mark"
    # Everything the storm left in Redis (the admitted loans' records too), charged to the sheds.
    grown = int(client.info("memory")["used_memory"]) - before
    assert grown / (statuses[429] / 1000) <= 300 * 1024, f"{grown} bytes for {statuses[429]} sheds"
    counts = TicketQueue(client, policy, "storm").stats().counts
    assert counts["complaint:submitted"] == counts["complaint:rejected"] == statuses[429]
    assert counts["loan_approval:submitted"] == counts["loan_approval:done"] == statuses[202]
    client.close()


def test_above_high_water_non_critical_intake_is_shed_and_loans_still_admitted(
    small_redis: str, policy: Policy
) -> None:
    client = Redis.from_url(small_redis, decode_responses=True)
    baseline = int(client.info("memory")["used_memory"])
    budget = baseline + 4 * 1024 * 1024
    queue_policy = policy.queue.model_copy(update={"retention_by_outcome": {"cancelled": 1}})
    types = {name: tp.model_copy(update={"cap": 100_000}) for name, tp in policy.types.items()}
    alarms = AlarmPolicy(yellow=10_000, orange=20_000, red=30_000)  # only memory sheds here
    guarded = policy.model_copy(
        update={
            "memory": MemoryPolicy(budget_bytes=budget),
            "queue": queue_policy,
            "types": types,
            "alarms": alarms,
        }
    )
    keys = QueueKeys("guarded")
    monitor = Monitor(client, client, guarded, "guarded", MonitorConfig())
    producer = Producer(client, guarded, "guarded", admission_cache_seconds=0)
    complaint = {"type": "complaint", "branch_id": "0412", "prompt": "x" * 20_000}
    accepted: list[str] = []
    for _ in range(400):
        result = producer.submit(complaint)
        assert result.accepted, result.reason
        accepted.append(result.ticket_id)
        if len(accepted) % 20 == 0 and monitor.tick().memory_guard:
            break
    assert monitor.tick().memory_guard, "the guard never turned on"
    shed = producer.submit(complaint)
    assert shed.outcome == "rejected" and shed.code is ShedCode.REDIS_MEMORY
    assert "memory is nearly full" in shed.reason
    assert producer.submit({**complaint, "type": "loan_approval", "prompt": "approve?"}).outcome == "queued"
    assert [e["state"] for e in read_events(client, keys, 10) if e["kind"] == "memory_guard"] == ["on"]
    (shown,) = status_documents(Settings(redis_url=small_redis, queue_name="guarded"), ("guarded",))
    assert shown["memory_guard"] is True and shown["redis_memory_budget"] == budget
    assert 0.8 * budget <= shown["redis_used_memory"]

    for ticket_id in accepted:
        producer.cancel(ticket_id)  # cancelled tickets live one second under this policy
    # Cancelled tickets expire in real Redis time: the guard clears once their memory is freed.
    wait_until(lambda: not monitor.tick().memory_guard, 20, "the guard to clear", interval=0.2)
    assert producer.submit(complaint).outcome == "queued"
    assert [e["state"] for e in read_events(client, keys, 10) if e["kind"] == "memory_guard"] == ["off", "on"]
    client.close()
