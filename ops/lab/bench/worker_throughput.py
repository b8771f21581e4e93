"""One worker's throughput against the simulator, beside the simulator's own ceiling, and its CPU cost.

Two phases on one fresh simulator, with the same seeded tickets:
1. ceiling: `--concurrency` client threads call the simulator directly, exactly as the worker does
   (streaming with usage), each starting the next ticket as soon as one finishes;
2. worker: the tickets are queued in Redis and one `tidegate worker --burst` process (max batch =
   the same concurrency) drains them.
The ratio worker/ceiling is what the queue, the leases and the result writes cost; the worker's CPU
seconds per ticket come from the kernel's accounting of the child process.

    python -m ops.lab.bench.worker_throughput --tickets 400 --time-scale 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from ops.lab.sim.process import SimulatorProcess
from shared.config import Settings
from shared.keys import QueueKeys
from shared.models import TicketRequest
from shared.queue import TicketQueue
from shared.redis_conn import connect_from

REPO = Path(__file__).resolve().parents[3]
# (share of tickets, prompt words, max_tokens): mostly short loan and complaint texts, some long files.
MIX = ((0.6, 100, 128), (0.3, 500, 256), (0.1, 2000, 256))


@dataclass(frozen=True)
class Phase:
    tickets: int
    seconds: float
    tickets_per_s: float
    completion_tokens: int
    errors: int


@dataclass(frozen=True)
class Result:
    tickets: int
    concurrency: int
    time_scale: float
    ceiling: Phase
    worker: Phase
    ratio: float
    worker_cpu_seconds: float
    worker_cpu_ms_per_ticket: float
    worker_cores_used: float
    worker_process_seconds: float
    """Wall time of the whole burst process, start-up included (CPU figures cover all of it)."""


def workload(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    shares = [share for share, _, _ in MIX]
    tickets = []
    for index in range(count):
        _, words, max_tokens = rng.choices(MIX, weights=shares)[0]
        kind = rng.choice(("loan_approval", "complaint", "archive_query"))
        prompt = f"{kind} {index}: " + " ".join(
            rng.choice(("loan", "rate", "term", "fee", "case")) for _ in range(words)
        )
        tickets.append(
            {
                "type": kind,
                "branch_id": "bench",
                "prompt": prompt,
                "max_tokens": max_tokens,
                "ttl_seconds": 3600,
            }
        )
    return tickets


def ceiling(base_url: str, model: str, tickets: list[dict[str, Any]], concurrency: int) -> Phase:
    """The simulator driven directly, `concurrency` requests always in flight."""
    pending = list(reversed(tickets))
    lock = threading.Lock()
    tokens: list[int] = []
    errors: list[str] = []

    def client() -> None:
        with requests.Session() as session:
            while True:
                with lock:
                    if not pending:
                        return
                    ticket = pending.pop()
                body = {
                    "model": model,
                    "prompt": ticket["prompt"],
                    "max_tokens": ticket["max_tokens"],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                try:
                    with session.post(
                        f"{base_url}/v1/completions", json=body, stream=True, timeout=300
                    ) as response:
                        usage = 0
                        for line in response.iter_lines(decode_unicode=True):
                            if line.startswith("data: {") and '"usage"' in line:
                                chunk = json.loads(line[6:])
                                usage = (chunk.get("usage") or {}).get("completion_tokens", usage)
                    with lock:
                        tokens.append(usage)
                except requests.RequestException as exc:
                    with lock:
                        errors.append(str(exc))

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    return Phase(len(tokens), seconds, len(tokens) / seconds, sum(tokens), len(errors))


def run_worker(
    settings: Settings, base_url: str, tickets: list[dict[str, Any]], concurrency: int
) -> tuple[Phase, float, float]:
    """Queue the tickets, drain them with one burst worker; (phase, its CPU seconds, process wall time)."""
    client = connect_from(settings)
    queue_name = f"bench-worker-{uuid.uuid4().hex[:8]}"
    queue = TicketQueue(client, settings.policy, queue_name)
    try:
        # Straight into the queue: admission control would (rightly) shed most of a 400-ticket burst.
        requests_ = [TicketRequest.model_validate(t, context={"policy": settings.policy}) for t in tickets]
        ids = [r.ticket_id for r in queue.enqueue_many(requests_)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        env = os.environ | {"TIDEGATE_REDIS_URL": settings.redis_url or ""}
        command = [sys.executable, "-m", "worker", "--burst", "--queue", queue_name, "--vllm-url", base_url]
        command += ["--max-batch", str(concurrency), "--gpu-backend", "sim", "--log-level", "warning"]
        subprocess.run(command, cwd=REPO, env=env, check=True)
        seconds = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        done = [t for t in queue.get_many(ids) if t is not None]
        finished = [t for t in done if t.status.value == "done"]
        tokens = sum(int((t.usage or {}).get("completion_tokens", 0)) for t in finished)
        # From the first claim to the last answer: the process's start-up (imports, connecting,
        # asking vLLM its model) is a fixed cost that a long-running worker pays once.
        window = max(t.finished_at or 0.0 for t in finished) - min(t.started_at or 0.0 for t in finished)
        phase = Phase(len(finished), window, len(finished) / window, tokens, len(done) - len(finished))
        return phase, cpu, seconds
    finally:
        prefix = QueueKeys(queue_name).prefix.replace("{", "\\{").replace("}", "\\}")
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)


def measure(tickets: int, concurrency: int, time_scale: float, seed: int) -> Result:
    settings = Settings()
    work = workload(tickets, seed)
    with SimulatorProcess(time_scale=time_scale, scheduling_policy="priority", seed=seed) as sim:
        model = requests.get(f"{sim.base_url}/v1/models", timeout=5).json()["data"][0]["id"]
        top = ceiling(sim.base_url, model, work, concurrency)
    with SimulatorProcess(time_scale=time_scale, scheduling_policy="priority", seed=seed) as sim:
        worker, cpu, wall = run_worker(settings, sim.base_url, work, concurrency)
    return Result(
        tickets=tickets,
        concurrency=concurrency,
        time_scale=time_scale,
        ceiling=top,
        worker=worker,
        ratio=worker.tickets_per_s / top.tickets_per_s,
        worker_cpu_seconds=round(cpu, 3),
        worker_cpu_ms_per_ticket=round(1000 * cpu / max(worker.tickets, 1), 3),
        worker_cores_used=round(cpu / wall, 3),
        worker_process_seconds=round(wall, 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tickets", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32, help="client threads = the worker's max batch")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="runs; the median ratio's run is reported")
    args = parser.parse_args()
    runs = [measure(args.tickets, args.concurrency, args.time_scale, args.seed) for _ in range(args.repeat)]
    median = statistics.median_low(r.ratio for r in runs)
    chosen = next(r for r in runs if r.ratio == median)
    print(json.dumps({**asdict(chosen), "ratios": [round(r.ratio, 3) for r in runs]}, indent=2))


if __name__ == "__main__":
    main()
