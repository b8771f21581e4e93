"""The queues one worker serves, in priority order, seen by the claim loop as one queue.

`--queue a --queue b` (or `--queue a,b`): a claim takes from `a` first and moves on to `b` only
with slots left over and nothing claimable left in `a`, so whenever both have a ticket ready
`a`'s is claimed first. That is strict priority between queues: `b` is served whenever `a` has
nothing ready (empty, or its tickets waiting out a retry backoff), and waits while `a` keeps this
worker busy; within each queue its own priority, aging and fair share apply as usual. Nothing
ages across queues, so a queue that must never wait behind another needs workers of its own.

A claimed ticket remembers its queue until its outcome is written, so results, retries, lease
renewals and live streams go to the queue it came from. Each queue's slot may be on another
Cluster node: nothing here spans two queues in one command, and on a Cluster idle waiting blocks
on the first queue's wake list in short slices, looking at the others' in between.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from redis import Redis

from shared.queue import MAX_BLOCK_SECONDS, ClaimedTicket, QueueHead, ReapResult, TicketQueue
from shared.redis_conn import blocking_client, is_cluster
from worker.registry import WorkerRegistry

CLUSTER_SLICE_SECONDS = 0.25
"""On a Cluster: how long an idle multi-queue worker blocks on one wake list before looking at the rest."""
OWNER_GRACE_SECONDS = 60.0
"""A remembered ticket older than this and no longer in flight ended without a write of ours
(cancelled, lease lost): its entry is dropped. Younger ones may be claimed but not yet in flight."""


class QueueSet:
    """Several `TicketQueue`s behind the surface the claim loop, writer and lease keeper use."""

    def __init__(self, queues: Sequence[TicketQueue]) -> None:
        if not queues:
            raise ValueError("queues: at least one queue is needed")
        self.queues = list(queues)
        self.first = self.queues[0]
        self.redis = self.first.redis
        self.policy = self.first.policy
        self.keys = self.first.keys
        self._owners: dict[str, tuple[TicketQueue, float]] = {}
        self._lock = threading.Lock()
        self._blocking: Redis | None = None

    @property
    def names(self) -> list[str]:
        return [q.keys.queue for q in self.queues]

    def owner(self, ticket_id: str) -> TicketQueue:
        """The queue a ticket this worker claimed came from (the first queue for one it did not)."""
        with self._lock:
            return self._owners.get(ticket_id, (self.first, 0.0))[0]

    def _forget(self, ticket_id: str) -> TicketQueue:
        with self._lock:
            return self._owners.pop(ticket_id, (self.first, 0.0))[0]

    def _prune(self, in_flight: set[str]) -> None:
        cutoff = time.monotonic() - OWNER_GRACE_SECONDS
        with self._lock:
            for ticket_id in [t for t, (_, at) in self._owners.items() if at < cutoff and t not in in_flight]:
                del self._owners[ticket_id]

    # ---- claiming ---------------------------------------------------------------------------
    def claim(
        self,
        worker_id: str,
        max_count: int,
        *,
        lease_seconds: float | None = None,
        token_budget: int = 0,
        take_first_over_budget: bool = True,
        normal_count: int | None = None,
        normal_budget: int | None = None,
        among: Collection[str] | None = None,
    ) -> list[ClaimedTicket]:
        """Claim in queue order within one count and budget; a later queue only once the earlier
        ones have nothing ready, so a ticket of an earlier queue is never passed over. `among` names the queues to claim from (those whose
        circuit lets claims through); the others are passed over as if empty."""
        out: list[ClaimedTicket] = []
        count, budget = max_count, token_budget
        normal_left = max_count if normal_count is None else normal_count
        normal_tokens = token_budget if normal_budget is None else normal_budget
        serving = [q for q in self.queues if among is None or q.keys.queue in among]
        for index, queue in enumerate(serving):
            if index > 0 and (count < 1 or queue_has_ready(serving[index - 1])):
                break
            got = queue.claim(
                worker_id,
                count,
                lease_seconds=lease_seconds,
                token_budget=budget,
                take_first_over_budget=take_first_over_budget and not out,
                normal_count=max(normal_left, 0),
                normal_budget=max(normal_tokens, 0),
            )
            with self._lock:
                for item in got:
                    self._owners[item.ticket.id] = (queue, time.monotonic())
            for item in got:
                cost = item.ticket.cost_tokens
                count -= 1
                budget = max(budget - cost, 1) if token_budget else 0
                if not self.policy.is_critical(item.ticket.type):
                    normal_left -= 1
                    normal_tokens -= cost
            out += got
        return out

    def head(self) -> QueueHead | None:
        """The head of the first queue with a ticket ready: the next one claimed."""
        for queue in self.queues:
            head = queue.head()
            if head is not None:
                return head
        return None

    def preempt(
        self, ticket_id: str, token: str, ticket_type: str, reason: str, *, max_preemptions: int
    ) -> str:
        outcome = self.owner(ticket_id).preempt(
            ticket_id, token, ticket_type, reason, max_preemptions=max_preemptions
        )
        if outcome != "exhausted":  # no longer ours; an exhausted one still runs here
            self._forget(ticket_id)
        return outcome

    def sizes(self) -> tuple[int, int, int]:
        """(pending, delayed, in flight) summed over the queues."""
        totals = [q.sizes() for q in self.queues]
        return (sum(t[0] for t in totals), sum(t[1] for t in totals), sum(t[2] for t in totals))

    def seconds_until_next_retry(self) -> float | None:
        waits = [w for w in (q.seconds_until_next_retry() for q in self.queues) if w is not None]
        return min(waits) if waits else None

    def wait_for_work(self, timeout: float) -> bool:
        """Block until any queue signals work or `timeout` passes (capped like one queue's wait)."""
        if len(self.queues) == 1:
            return self.first.wait_for_work(timeout)
        wait = min(max(timeout, 0.01), MAX_BLOCK_SECONDS)
        if not is_cluster(self.redis):  # one server: one pop over every wake list
            if self._blocking is None:
                self._blocking = blocking_client(self.redis, MAX_BLOCK_SECONDS)
            return self._blocking.blpop([q.keys.wake for q in self.queues], timeout=wait) is not None
        return self._wait_in_slices(wait)

    def _wait_in_slices(self, wait: float) -> bool:
        """A pop may name keys of one slot only: block on the first queue, peek at the others."""
        left = wait
        while left > 0:
            piece = min(left, CLUSTER_SLICE_SECONDS)
            if self.first.wait_for_work(piece):
                return True
            if any(q.redis.lpop(q.keys.wake) is not None for q in self.queues[1:]):
                return True
            left -= piece
        return False

    def wake_workers(self) -> None:
        for queue in self.queues:
            queue.wake_workers()

    # ---- one ticket's writes go to its own queue ----------------------------------------------
    def finish(self, ticket_id: str, token: str, status: Any, **fields: Any) -> bool:
        return self._forget(ticket_id).finish(ticket_id, token, status, **fields)

    def retry(self, ticket_id: str, token: str, ticket_type: str, error: str, **options: Any) -> str:
        return self._forget(ticket_id).retry(ticket_id, token, ticket_type, error, **options)

    def backoff_seconds(self, attempts: int) -> float:
        return self.first.backoff_seconds(attempts)

    def extend_many(
        self, leases: Sequence[tuple[str, str]], lease_seconds: float | None = None
    ) -> dict[str, str]:
        """Renew leases queue by queue (each queue's in one round trip); `leases` is everything in
        flight, so remembered tickets missing from it long enough are forgotten here."""
        self._prune({ticket_id for ticket_id, _ in leases})
        by_queue: dict[int, list[tuple[str, str]]] = {}
        for lease in leases:
            by_queue.setdefault(id(self.owner(lease[0])), []).append(lease)
        replies: dict[str, str] = {}
        for queue in self.queues:
            if id(queue) in by_queue:
                replies.update(queue.extend_many(by_queue[id(queue)], lease_seconds))
        return replies

    def reap(self, owner: str, interval_seconds: float = 1.0, limit: int = 1000) -> ReapResult:
        """Sweep every queue (each under its own reaper lock); the first queue's result."""
        results = [q.reap(owner, interval_seconds, limit) for q in self.queues]
        return results[0]

    def close(self) -> None:
        for queue in self.queues:
            queue.close()
        if self._blocking is not None and self._blocking is not self.redis:
            self._blocking.close()
        self._blocking = None


def queue_has_ready(queue: TicketQueue) -> bool:
    """Whether `queue` still holds a ticket ready to claim (one that a claim left behind)."""
    return queue.sizes()[0] > 0


class RegistrySet:
    """The worker's heartbeat in every queue it serves, so each queue's monitor counts it."""

    def __init__(self, redis: Redis, queues: QueueSet, worker_id: str, heartbeat_seconds: float) -> None:
        self.registries = [WorkerRegistry(redis, q.keys, worker_id, heartbeat_seconds) for q in queues.queues]

    def heartbeat(self, info: Mapping[str, str | int | float | None]) -> None:
        for registry in self.registries:
            registry.heartbeat(info)

    def deregister(self) -> None:
        for registry in self.registries:
            registry.deregister()


Queues = TicketQueue | QueueSet
"""What the claim loop, writer, lease keeper and housekeeping work on: one queue, or several."""
