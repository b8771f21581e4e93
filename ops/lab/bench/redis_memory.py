"""How much Redis memory a run used: start, peak and end, and bytes per accepted and rejected submission.

The peak is sampled while the run plays. Per-submission bytes come from `MEMORY USAGE` of a sample
of the run's own ticket records (and their idempotency keys), so other queues on a shared Redis do
not count, and from how many records the run's submissions left. A rejected record shares a bucket
hash with others (shared/rejected.py), and so does its idempotency key: each costs its bucket's
bytes divided by the bucket's records.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

from redis import Redis

from ops.lab.traffic.records import TicketRecord
from shared.keys import QueueKeys
from shared.rejected import slot

SAMPLE_INTERVAL_S = 0.5
RECORDS_SAMPLED = 200


def used_memory(client: Redis) -> int:
    return int(cast("dict[str, Any]", client.info("memory"))["used_memory"])


class MemoryWatch:
    """Samples `used_memory` on a thread from `start` to `stop`; keeps the first, peak and last."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self.start_bytes = self.peak_bytes = self.end_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-memory", daemon=True)

    def start(self) -> None:
        self.start_bytes = self.peak_bytes = used_memory(self.client)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.peak_bytes = max(self.peak_bytes, used_memory(self.client))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.end_bytes = used_memory(self.client)
        self.peak_bytes = max(self.peak_bytes, self.end_bytes)


def _mean_record_bytes(client: Redis, keys: QueueKeys, ticket_ids: Sequence[str], idem: bool) -> float:
    """Mean bytes of a ticket hash (plus its idempotency key) over a sample of `ticket_ids`."""
    sample = list(ticket_ids)[:RECORDS_SAMPLED]
    if not sample:
        return 0.0
    pipe = client.pipeline(transaction=False)
    for ticket_id in sample:
        pipe.memory_usage(keys.ticket(ticket_id), samples=0)
        pipe.hmget(keys.ticket(ticket_id), ["branch_id", "idempotency_key"])
    replies = pipe.execute()
    total = 0
    idem_pipe = client.pipeline(transaction=False)
    for size, (branch, key) in zip(replies[::2], replies[1::2], strict=True):
        total += int(size or 0)
        if idem and branch and key:
            idem_pipe.memory_usage(keys.idempotency(_text(branch), _text(key)), samples=0)
    total += sum(int(size or 0) for size in idem_pipe.execute())
    return total / len(sample)


def _mean_rejected_bytes(client: Redis, keys: QueueKeys, ticket_ids: Sequence[str]) -> float:
    """Mean bytes of a rejected record (its share of its bucket) plus, averaged over the records,
    the run's share of the buckets indexing rejected submissions' idempotency keys."""
    buckets = {slot(keys, ticket_id)[0] for ticket_id in list(ticket_ids)[:RECORDS_SAMPLED]}
    if not buckets:
        return 0.0
    per_record = [_bytes_per_field(client, bucket) for bucket in sorted(buckets)]
    pattern = keys.idempotency_prefix.replace("{", "\\{").replace("}", "\\}") + "~*"
    index_bytes = sum(_key_bytes(client, k) for k in client.scan_iter(match=pattern))
    return sum(per_record) / len(per_record) + index_bytes / max(len(ticket_ids), 1)


def _key_bytes(client: Redis, key: str) -> int:
    return int(cast("int | None", client.memory_usage(key, samples=0)) or 0)


def _bytes_per_field(client: Redis, key: str) -> float:
    fields = int(cast("int", client.hlen(key)))
    return _key_bytes(client, key) / fields if fields else 0.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def memory_figures(
    watch: MemoryWatch, client: Redis, keys: QueueKeys, records: Sequence[TicketRecord]
) -> dict[str, float]:
    """The run's memory figures, read while its records still live in Redis."""
    rejected_submissions = sum(r.rejections for r in records)
    rejected_records = {tid for r in records for tid in r.rejected_ids if tid != r.ticket_id}
    accepted = [r.ticket_id for r in records if r.ticket_id]
    per_rejected = _mean_rejected_bytes(client, keys, sorted(rejected_records))
    per_accepted = _mean_record_bytes(client, keys, accepted, idem=True)
    rejected_bytes = per_rejected * len(rejected_records)
    return {
        "start_bytes": watch.start_bytes,
        "peak_bytes": watch.peak_bytes,
        "end_bytes": watch.end_bytes,
        "rejected_submissions": rejected_submissions,
        "rejected_records": len(rejected_records),
        "bytes_per_rejected_record": round(per_rejected, 1),
        "bytes_per_1000_rejected_submissions": round(1000 * rejected_bytes / max(rejected_submissions, 1)),
        "accepted_submissions": len(accepted),
        "bytes_per_accepted_ticket": round(per_accepted, 1),
    }
