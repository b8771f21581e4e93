"""The cost of one claim→finish per ticket, for comparing two versions of the claim script.

`python -m ops.lab.bench.claim_cost REDIS_URL TICKETS QUEUE` fills QUEUE with TICKETS tickets spread
over 200 branches and three types (as `tidegate bench queue` does), drains it with one consumer
(claim 16, finish the batch in one call) and prints one JSON line: the drain rate, the Redis
server's CPU per ticket (from /proc, so point it at a private redis-server on this machine, whose
pid file is given by TIDEGATE_BENCH_REDIS_PID) and the client's CPU per ticket. CPU times move less
than rates on a shared machine; run the two versions alternately and compare medians.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from redis import Redis

from ops.lab.bench.queue_bench import _requests, _roomy
from shared.policy import load_policy
from shared.queue import Outcome, TicketQueue

CLAIM = 16
BATCH = 500


def _server_cpu(pid: str) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(redis_url: str, tickets: int, queue_name: str, pid: str) -> dict[str, float]:
    client = Redis.from_url(redis_url, decode_responses=True)
    queue = TicketQueue(client, _roomy(load_policy()), queue_name)
    requests = _requests(tickets)
    for start in range(0, tickets, BATCH):
        queue.enqueue_many(requests[start : start + BATCH])
    server_before, started, cpu_before = _server_cpu(pid), time.perf_counter(), time.process_time()
    done = 0
    while claimed := queue.claim("cost", CLAIM):
        queue.finish_many([Outcome(c.ticket.id, c.token, "done", result="") for c in claimed])
        done += len(claimed)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    server = _server_cpu(pid) - server_before
    for key in client.scan_iter(match=queue.keys.prefix.replace("{", "\\{").replace("}", "\\}") + "*"):
        client.delete(key)
    return {
        "tickets": done,
        "rate": round(done / wall),
        "server_cpu_us": round(server * 1e6 / done, 2),
        "client_cpu_us": round(cpu * 1e6 / done, 2),
    }


if __name__ == "__main__":
    url, count, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    print(json.dumps(measure(url, count, name, os.environ["TIDEGATE_BENCH_REDIS_PID"])))
