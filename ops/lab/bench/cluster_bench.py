"""`tidegate bench queue --cluster`: one queue's drain rate beside queues spread over the masters.

The same tickets and the same number of consumer processes drain either one queue (one slot, one
master) or one queue per master; the ratio of the two, measured in the same run on the same
cluster, says how far spreading queues over the masters scales the queue on this machine.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ops.lab.bench.queue_bench import _requests, _roomy
from shared.keys import QueueKeys
from shared.policy import load_policy
from shared.queue import TicketQueue
from shared.redis_conn import make_cluster_client

FILL_BATCH = 500


@dataclass
class ClusterBenchResult:
    masters: int
    consumers: int
    tickets: int
    runs: dict[str, list[float]] = field(default_factory=dict)
    master_cpu: dict[str, list[float]] = field(default_factory=dict)
    """Per run, the share of one core the busiest master holding a drained queue used."""

    def rate(self, name: str) -> float:
        return statistics.median(self.runs[name])

    def to_dict(self) -> dict[str, Any]:
        one, spread = self.rate("one_queue"), self.rate("spread")
        return {
            "masters": self.masters,
            "consumers": self.consumers,
            "tickets": self.tickets,
            "cpu_count": os.cpu_count(),
            "runs_per_second": self.runs,
            "busiest_master_core_share": {k: statistics.median(v) for k, v in self.master_cpu.items()},
            "drain_per_second": {"one_queue": one, "spread": spread},
            "ratio_spread_to_one_queue": spread / one,
        }


def spread_names(url: str, prefix: str) -> list[str]:
    """One queue name per master: names tried in order until each master owns one."""
    client: Any = make_cluster_client(url)
    try:
        masters = {node.name for node in client.get_primaries()}
        names: dict[str, str] = {}
        for i in range(10_000):
            name = f"{prefix}-{i}"
            owner = client.get_node_from_key(QueueKeys(name).pending).name
            names.setdefault(owner, name)
            if len(names) == len(masters):
                break
        return list(names.values())
    finally:
        client.close()


def _fill(url: str, names: list[str], per_queue: int) -> None:
    client = make_cluster_client(url)
    policy = _roomy(load_policy())
    for name in names:
        queue = TicketQueue(client, policy, name)
        requests = _requests(per_queue)
        for start in range(0, per_queue, FILL_BATCH):
            queue.enqueue_many(requests[start : start + FILL_BATCH])
    client.close()


def _drain(url: str, queue_name: str, worker: str, start: Any) -> None:
    queue = TicketQueue(make_cluster_client(url), _roomy(load_policy()), queue_name)
    start.wait()
    while claimed := queue.claim(worker, 16):
        for c in claimed:
            queue.finish(c.ticket.id, c.token, "done", result="")


def _cleanup(url: str, names: list[str]) -> None:
    client = make_cluster_client(url)
    for name in names:
        pattern = QueueKeys(name).prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        keys = list(client.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    client.close()


def _master_cpu_seconds(url: str, names: list[str]) -> float:
    """CPU seconds used so far by the busiest master holding one of `names`."""
    client: Any = make_cluster_client(url)
    try:
        owners = {client.get_node_from_key(QueueKeys(n).pending).name for n in names}
        used = []
        for owner in owners:
            info = client.get_redis_connection(client.get_node(node_name=owner)).info("cpu")
            used.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
        return max(used)
    finally:
        client.close()


def _drain_rate(url: str, names: list[str], tickets: int, consumers: int) -> tuple[float, float]:
    """Tickets drained per second, and the share of one core the busiest master used meanwhile."""
    _fill(url, names, tickets // len(names))
    cpu_before = _master_cpu_seconds(url, names)
    ctx = mp.get_context("fork")
    start = ctx.Event()
    procs = [
        ctx.Process(target=_drain, args=(url, names[i % len(names)], f"c{i}", start))
        for i in range(consumers)
    ]
    for p in procs:
        p.start()
    time.sleep(0.3)  # every consumer connected before the clock starts
    began = time.perf_counter()
    start.set()
    for p in procs:
        p.join(timeout=300)
    elapsed = time.perf_counter() - began
    master_share = (_master_cpu_seconds(url, names) - cpu_before) / elapsed
    _cleanup(url, names)
    return (tickets // len(names)) * len(names) / elapsed, master_share


def run(url: str, tickets: int = 6_000, consumers: int = 6, repeat: int = 3) -> ClusterBenchResult:
    """Alternate the two layouts `repeat` times, so a noisy machine moves both."""
    prefix = f"bench-cluster-{uuid.uuid4().hex[:6]}"
    result = ClusterBenchResult(masters=len(spread_names(url, prefix)), consumers=consumers, tickets=tickets)
    for i in range(repeat):
        layouts = {"one_queue": [f"{prefix}-one-{i}"], "spread": spread_names(url, f"{prefix}-r{i}")}
        for layout, names in layouts.items():
            rate, share = _drain_rate(url, names, tickets, consumers)
            result.runs.setdefault(layout, []).append(rate)
            result.master_cpu.setdefault(layout, []).append(share)
    return result
