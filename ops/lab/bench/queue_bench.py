"""`tidegate bench queue`: tidegate's Redis operations beside raw Redis and RQ, in the same run.

Every figure is a median over `repeat` runs, and each tidegate figure is reported as a ratio to the
baseline measured seconds before on the same machine and server, so a noisy machine moves both.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from shared.models import TicketRequest
from shared.policy import Policy, load_policy
from shared.queue import Outcome, TicketQueue


@dataclass(frozen=True)
class Sizes:
    enqueue_single: int = 2_000
    enqueue_pipelined: int = 20_000
    batch: int = 500
    pop_ack: int = 6_000
    raw: int = 20_000
    rq_enqueue: int = 2_000
    rq_jobs: int = 500
    latency_samples: int = 200

    @classmethod
    def quick(cls) -> Sizes:
        return cls(500, 4_000, 500, 1_500, 4_000, 500, 150, 60)


@dataclass
class QueueBenchResult:
    rates: dict[str, float] = field(default_factory=dict)  # operations per second, medians
    latency_ms: dict[str, float] = field(default_factory=dict)
    runs: dict[str, list[float]] = field(default_factory=dict)

    def ratio(self, ours: str, baseline: str) -> float:
        return self.rates[ours] / self.rates[baseline]


def _roomy(policy: Policy) -> Policy:
    """Caps and TTLs large enough that the benchmark measures speed, not admission."""
    types = {
        n: t.model_copy(update={"cap": 10_000_000, "ttl_seconds": 3600}) for n, t in policy.types.items()
    }
    return policy.model_copy(update={"types": types})


def _requests(n: int) -> list[TicketRequest]:
    kinds = ("loan_approval", "complaint", "archive_query")
    return [
        TicketRequest(
            type=kinds[i % 3], branch_id=f"b{i % 200:03d}", prompt="Summarise the case file.", max_tokens=64
        )
        for i in range(n)
    ]


class QueueBench:
    def __init__(self, redis_url: str, sizes: Sizes, repeat: int = 3) -> None:
        self.redis_url = redis_url
        self.redis = Redis.from_url(redis_url, decode_responses=True)
        self.sizes = sizes
        self.repeat = repeat
        self.policy = _roomy(load_policy())
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.result = QueueBenchResult()

    # -- harness ---------------------------------------------------------------------------------
    def _fresh_queue(self) -> TicketQueue:
        return TicketQueue(self.redis, self.policy, f"{self.prefix}-{uuid.uuid4().hex[:6]}")

    def _cleanup(self) -> None:
        for key in self.redis.scan_iter(match="*" + self.prefix + "*", count=1000):
            self.redis.delete(key)

    def _measure(self, name: str, operations: int, body: Callable[[], None]) -> None:
        samples = []
        for _ in range(self.repeat):
            started = time.perf_counter()
            body()
            samples.append(operations / (time.perf_counter() - started))
            self._cleanup()
        self.result.runs[name] = samples
        self.result.rates[name] = statistics.median(samples)

    # -- raw Redis baselines -------------------------------------------------------------------
    def raw_zadd_pipelined(self) -> None:
        key = f"{{{self.prefix}}}:raw-zset"
        n, batch = self.sizes.raw, self.sizes.batch

        def body() -> None:
            for start in range(0, n, batch):
                pipe = self.redis.pipeline(transaction=False)
                for i in range(start, start + batch):
                    pipe.zadd(key, {f"m{i}": i})
                pipe.execute()

        self._measure("raw_zadd_pipelined", n, body)

    def raw_zpopmin(self) -> None:
        """ZPOPMIN 16 at a time until empty: the raw floor under a claim of 16 (fill not timed)."""
        key = f"{{{self.prefix}}}:raw-pop"
        n = self.sizes.pop_ack
        samples = []
        for _ in range(self.repeat):
            self.redis.zadd(key, {f"m{i}": i for i in range(n)})
            started = time.perf_counter()
            while self.redis.zpopmin(key, 16):
                pass
            samples.append(n / (time.perf_counter() - started))
        self.result.runs["raw_zpopmin_16"] = samples
        self.result.rates["raw_zpopmin_16"] = statistics.median(samples)

    # -- tidegate --------------------------------------------------------------------------------
    def enqueue_single(self) -> None:
        requests = _requests(self.sizes.enqueue_single)

        def body() -> None:
            queue = self._fresh_queue()
            for r in requests:
                queue.enqueue(r)

        self._measure("tidegate_enqueue_single", len(requests), body)

    def enqueue_pipelined(self) -> None:
        requests = _requests(self.sizes.enqueue_pipelined)
        batch = self.sizes.batch

        def body() -> None:
            queue = self._fresh_queue()
            for start in range(0, len(requests), batch):
                queue.enqueue_many(requests[start : start + batch])

        self._measure("tidegate_enqueue_pipelined", len(requests), body)

    def pop_ack(self, consumers: int) -> None:
        n = self.sizes.pop_ack
        samples = []
        for _ in range(self.repeat):
            queue = self._fresh_queue()
            requests = _requests(n)
            for start in range(0, n, self.sizes.batch):
                queue.enqueue_many(requests[start : start + self.sizes.batch])
            ctx = mp.get_context("fork")
            start_event = ctx.Event()
            procs = [
                ctx.Process(target=_drain, args=(self.redis_url, queue.keys.queue, f"c{i}", start_event))
                for i in range(consumers)
            ]
            for p in procs:
                p.start()
            time.sleep(0.3)  # let every consumer connect before the clock starts
            started = time.perf_counter()
            start_event.set()
            for p in procs:
                p.join(timeout=300)
            samples.append(n / (time.perf_counter() - started))
            self._cleanup()
        name = f"tidegate_pop_ack_{consumers}"
        self.result.runs[name] = samples
        self.result.rates[name] = statistics.median(samples)

    def enqueue_to_pop_latency(self) -> None:
        queue = self._fresh_queue()
        requests = _requests(self.sizes.latency_samples)
        latencies: list[float] = []
        stop = threading.Event()

        def consume() -> None:
            consumer = TicketQueue(
                Redis.from_url(self.redis_url, decode_responses=True), self.policy, queue.keys.queue
            )
            while not stop.is_set():
                claimed = consumer.claim("lat", 1)
                if not claimed:
                    consumer.wait_for_work(0.5)
                    continue
                popped = time.time()  # the same clock as created_at, on the same machine
                for c in claimed:
                    latencies.append(popped - c.ticket.created_at)
                    consumer.finish(c.ticket.id, c.token, "done", result="")

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        for r in requests:
            queue.enqueue(r)
            time.sleep(0.005)
        deadline = time.monotonic() + 10
        while len(latencies) < len(requests) and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        thread.join(timeout=2)
        self._cleanup()
        ordered = sorted(latencies)
        self.result.latency_ms["enqueue_to_pop_p50"] = 1000 * ordered[len(ordered) // 2]
        self.result.latency_ms["enqueue_to_pop_p99"] = (
            1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        )

    # -- RQ --------------------------------------------------------------------------------------
    def rq_enqueue(self) -> None:
        from rq import Queue

        from ops.lab.bench.jobs import noop

        n = self.sizes.rq_enqueue

        def body() -> None:
            q = Queue(f"{self.prefix}-rq-{uuid.uuid4().hex[:6]}", connection=Redis.from_url(self.redis_url))
            for _ in range(n):
                q.enqueue(noop)
            q.delete(delete_jobs=True)

        self._measure("rq_enqueue", n, body)

    def rq_noop_end_to_end(self) -> None:
        from rq import Queue, SimpleWorker

        from ops.lab.bench.jobs import noop

        n = self.sizes.rq_jobs

        def body() -> None:
            conn = Redis.from_url(self.redis_url)
            q = Queue(f"{self.prefix}-rq-{uuid.uuid4().hex[:6]}", connection=conn)
            for _ in range(n):
                q.enqueue(noop)
            SimpleWorker([q], connection=conn).work(burst=True, logging_level="WARNING")
            q.delete(delete_jobs=True)

        self._measure("rq_noop_end_to_end", n, body)

    def run_all(self) -> QueueBenchResult:
        try:
            self.raw_zadd_pipelined()
            self.raw_zpopmin()
            self.enqueue_single()
            self.enqueue_pipelined()
            self.pop_ack(1)
            self.pop_ack(8)
            self.enqueue_to_pop_latency()
            self.rq_enqueue()
            self.rq_noop_end_to_end()
        finally:
            self._cleanup()
        return self.result


def _drain(redis_url: str, queue_name: str, worker: str, start: Any) -> None:
    queue = TicketQueue(Redis.from_url(redis_url, decode_responses=True), _roomy(load_policy()), queue_name)
    start.wait()
    while True:
        claimed = queue.claim(worker, 16)
        if not claimed:
            return
        queue.finish_many([Outcome(c.ticket.id, c.token, "done", result="") for c in claimed])


def ratios(result: QueueBenchResult) -> dict[str, float]:
    r = result.rates
    out = {
        "enqueue pipelined ÷ raw pipelined ZADD": r["tidegate_enqueue_pipelined"] / r["raw_zadd_pipelined"],
        "pop→ack (1 consumer) ÷ raw ZPOPMIN 16": r["tidegate_pop_ack_1"] / r["raw_zpopmin_16"],
        "enqueue single ÷ RQ enqueue": r["tidegate_enqueue_single"] / r["rq_enqueue"],
        "pop→ack (1 consumer) ÷ RQ no-op end to end": r["tidegate_pop_ack_1"] / r["rq_noop_end_to_end"],
        "pop→ack 8 consumers ÷ 1 consumer": r["tidegate_pop_ack_8"] / r["tidegate_pop_ack_1"],
    }
    return out
