"""Redis bytes per shed submission, with and without an Idempotency-Key.

    python -m ops.lab.bench.rejected_bytes --count 1000

Sheds `count` complaints (admission's code `queue_red`) in one batch on a private queue, then sums
`MEMORY USAGE` (exact: samples 0) of every ticket and idempotency key the queue holds and divides by
`count`; once with no key and once with a fresh UUID key per submission (a client that never
reuses its key: the worst case). Imports only `shared`, so an older checkout can be measured the
same way (`PYTHONPATH=<checkout> python path/to/rejected_bytes.py`).
"""

from __future__ import annotations

import argparse
import os
import uuid
from typing import cast

from shared.models import TicketRequest
from shared.policy import default_policy_text, parse_policy
from shared.queue import EnqueueOptions, TicketQueue
from shared.redis_conn import make_client, resolve_redis_url
from shared.shed import ShedCode


def bytes_per_shed(redis_url: str, count: int, with_key: bool) -> tuple[float, int]:
    """(bytes per shed submission, keys the queue holds) for one fresh queue."""
    client = make_client(redis_url)
    queue = TicketQueue(
        client, parse_policy(default_policy_text()), f"bench-rejected-{uuid.uuid4().hex[:10]}"
    )
    requests = [
        TicketRequest(
            type="complaint",
            branch_id="0412",
            prompt=f"My card was charged twice, case {i}.",
            idempotency_key=str(uuid.uuid4()) if with_key else None,
        )
        for i in range(count)
    ]
    shed = EnqueueOptions(shed=ShedCode.QUEUE_RED, retry_after=1.0)
    results = queue.enqueue_many(requests, [shed] * count)
    assert {r.outcome for r in results} == {"rejected"}
    pattern = queue.keys.prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    every = list(client.scan_iter(match=pattern, count=1000))
    held = [k for k in every if ":t:" in str(k) or ":idem:" in str(k)]
    total = sum(int(cast("int | None", client.memory_usage(k, samples=0)) or 0) for k in held)
    if every:
        client.delete(*every)
    client.close()
    return total / count, len(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="shed submissions per measurement")
    parser.add_argument("--redis-url", default=None, help="default: TIDEGATE_REDIS_URL or local")
    args = parser.parse_args()
    url = resolve_redis_url(args.redis_url or os.environ.get("TIDEGATE_REDIS_URL"))
    for with_key in (False, True):
        per, keys = bytes_per_shed(url, args.count, with_key)
        label = "with a fresh Idempotency-Key" if with_key else "without an Idempotency-Key"
        print(f"{per:6.0f} B per shed submission {label} ({args.count} sheds, {keys} keys)")


if __name__ == "__main__":
    main()
