"""The simulator's capacity for a workload, measured: a short closed-loop saturation phase.

Busy fraction is goodput divided by capacity, so capacity has to be what this simulator can really do
with this workload's mix, not a formula. Each point keeps `concurrency` requests always in flight
(a finished one is replaced at once) for a warm-up and then a measuring window; the best point is the
capacity. Several concurrencies are tried because throughput rises with the batch until the KV cache
fills and preemption (recompute) starts to waste work, then falls. The simulator should run in
preempt mode here: a crash would measure the restart, not the GPU.

Work is counted in tokens as well as in requests, because tidegate's degraded mode shortens answers:
requests per second would then exceed a capacity measured at full length, while tokens per second
measure the GPU's work either way. Tokens come from the simulator's own counters (prompt and
generation tokens) read at both ends of the window, which count work as it happens; requests
finishing inside a window of a few seconds would swing with whether a 16k-token prompt lands in it.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import requests

from ops.lab.bench.sim_probe import read_counters
from ops.lab.traffic.prompts import prompt_text
from ops.lab.traffic.workload import PlannedArrival

REQUEST_TIMEOUT_S = 120.0
JOIN_TIMEOUT_S = 5.0
"""After a point, clients still waiting are not waited for longer: their requests end with the simulator."""
LADDER = (0.25, 0.7)
"""The concurrencies tried span this range of the number of average tickets the KV cache holds: the
throughput plateau of a prefill-bound GPU, below the point where preemption starts to thrash."""


@dataclass(frozen=True)
class SaturationPoint:
    concurrency: int
    window_s: float
    completed: int
    errors: int
    tickets_per_s: float
    tokens_per_s: float
    p50_latency_s: float | None
    preemptions: int


@dataclass(frozen=True)
class Capacity:
    """The best saturation point: what "100%" of the simulator means for this workload."""

    tickets_per_s: float
    tokens_per_s: float
    concurrency: int
    points: tuple[SaturationPoint, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "tickets_per_s": round(self.tickets_per_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "concurrency": self.concurrency,
            "method": "closed-loop saturation of a preempt-mode simulator with the same flags, best point",
            "points": [vars(point) for point in self.points],
        }


def concurrency_ladder(kv_tokens: int, mean_ticket_tokens: float, max_num_seqs: int, steps: int) -> list[int]:
    """Concurrencies around the number of average tickets the KV cache holds, lowest first."""
    if mean_ticket_tokens <= 0:
        raise ValueError(f"mean_ticket_tokens={mean_ticket_tokens} is not accepted; it must be above 0")
    fit = max(1.0, kv_tokens / mean_ticket_tokens)
    low, high = LADDER
    if steps > 1:
        factors = [low + (high - low) * i / (steps - 1) for i in range(steps)]
    else:
        factors = [(low + high) / 2]
    return sorted({max(1, min(max_num_seqs, round(fit * factor))) for factor in factors})


class _ClosedLoop:
    """`concurrency` threads, each sending the next ticket as soon as its previous one returns."""

    def __init__(self, model_url: str, tickets: Sequence[PlannedArrival], concurrency: int) -> None:
        self.model_url = model_url.rstrip("/")
        self._tickets = itertools.cycle(tickets)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.concurrency = concurrency
        self.finished: list[tuple[float, float, int]] = []  # (finished at, latency, tokens)
        self.errors = 0

    def _next(self) -> PlannedArrival:
        with self.lock:
            return next(self._tickets)

    def _client(self) -> None:
        session = requests.Session()
        try:
            while not self._stop.is_set():
                ticket = self._next()
                body = {
                    "prompt": prompt_text(ticket.type, ticket.branch_id, ticket.index, ticket.prompt_tokens),
                    "max_tokens": ticket.max_tokens,
                }
                started = time.monotonic()
                try:
                    response = session.post(
                        f"{self.model_url}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S
                    )
                    usage = response.json().get("usage") if response.status_code == 200 else None
                except (requests.RequestException, ValueError):
                    usage = None
                now = time.monotonic()
                with self.lock:
                    if usage is None:
                        self.errors += 1
                    else:
                        tokens = int(usage["prompt_tokens"]) + int(usage["completion_tokens"])
                        self.finished.append((now, now - started, tokens))
        finally:
            session.close()

    def run(self, warmup_s: float, window_s: float) -> tuple[float, int, list[tuple[float, float, int]]]:
        """(window length, tokens the simulator processed in it, requests that finished in it)."""
        threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.concurrency)]
        for thread in threads:
            thread.start()
        time.sleep(warmup_s)
        before = read_counters(self.model_url)
        window_start = time.monotonic()
        time.sleep(window_s)
        after = read_counters(self.model_url)
        window_end = time.monotonic()
        self._stop.set()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            inside = [item for item in self.finished if window_start <= item[0] < window_end]
        processed = after.since(before)
        return window_end - window_start, processed.prompt_tokens + processed.generation_tokens, inside


def measure_point(
    model_url: str,
    tickets: Sequence[PlannedArrival],
    concurrency: int,
    *,
    warmup_s: float,
    window_s: float,
) -> SaturationPoint:
    """One closed-loop run; preemptions are those the simulator counted while it ran."""
    before = read_counters(model_url).preemptions
    loop = _ClosedLoop(model_url, tickets, concurrency)
    span, tokens, inside = loop.run(warmup_s, window_s)
    preemptions = read_counters(model_url).preemptions - before
    latencies = [latency for _, latency, _ in inside]
    # Requests per second from the token rate and the mean request of the whole point (warm-up
    # included): steadier than counting the few requests that happen to end inside the window.
    with loop.lock:
        answered = [size for _, _, size in loop.finished]
    mean_request_tokens = sum(answered) / len(answered) if answered else 0.0
    tickets_per_s = tokens / span / mean_request_tokens if mean_request_tokens else 0.0
    return SaturationPoint(
        concurrency=concurrency,
        window_s=round(span, 3),
        completed=len(inside),
        errors=loop.errors,
        tickets_per_s=round(tickets_per_s, 3),
        tokens_per_s=round(tokens / span, 1),
        p50_latency_s=round(statistics.median(latencies), 3) if latencies else None,
        preemptions=preemptions,
    )


def measure_capacity(
    model_url: str,
    tickets: Sequence[PlannedArrival],
    concurrencies: Iterable[int],
    *,
    warmup_s: float,
    window_s: float,
) -> Capacity:
    """Run one saturation point per concurrency; the one with the most tokens per second wins."""
    points = [
        measure_point(model_url, tickets, concurrency, warmup_s=warmup_s, window_s=window_s)
        for concurrency in concurrencies
    ]
    if not points:
        raise ValueError("concurrencies is empty; give at least one to measure")
    best = max(points, key=lambda point: point.tokens_per_s)
    return Capacity(best.tickets_per_s, best.tokens_per_s, best.concurrency, tuple(points))
