"""Keeping the leases of running tickets alive, and stopping the ones that must stop.

A thread of its own, so a slow `/metrics` scrape or a long claim never delays a renewal. Every
third of the lease, and at least every `MAX_RENEW_INTERVAL_SECONDS`, it renews all leases in one
round trip; a renewal that comes back stale (cancelled by the branch, or taken over after our
lease lapsed) aborts that ticket's vLLM request at once, and so does a ticket whose TTL has passed
while it ran. The renewal doubles as the cancel check, hence the cap: with the default 30 s lease
a third would leave a cancelled ticket burning GPU for up to 10 s.
"""

from __future__ import annotations

import logging
import threading

import redis

from shared import clock
from shared.logs import ticket_fields
from worker.inflight import AbortReason, InFlight
from worker.queue_set import Queues

log = logging.getLogger(__name__)

MAX_RENEW_INTERVAL_SECONDS = 1.0
"""One round trip a second per worker, whatever its batch: the most a cancel waits to take effect."""


class LeaseKeeper:
    def __init__(self, queue: Queues, inflight: InFlight, lease_seconds: float) -> None:
        self.queue = queue
        self.inflight = inflight
        self.lease_seconds = lease_seconds
        self.interval = min(lease_seconds / 3, MAX_RENEW_INTERVAL_SECONDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except redis.RedisError as exc:
                log.warning("renewing leases failed (%s); retrying in %.1f s", exc, self.interval)

    def tick(self) -> None:
        """Renew every lease; abort tickets that are stale or past their TTL."""
        running = self.inflight.snapshot()
        if not running:
            return
        replies = self.queue.extend_many([(r.id, r.token) for r in running], self.lease_seconds)
        now = clock.now()
        for ticket in running:
            reply = replies.get(ticket.id, "ok")
            if reply.startswith("stale:"):
                reason = AbortReason.CANCELLED if reply == "stale:cancelled" else AbortReason.LEASE_LOST
                if ticket.handle.abort(reason):
                    log.info(
                        "ticket %s: %s (%s); aborting its vLLM request",
                        ticket.id,
                        reason,
                        reply,
                        extra=ticket_fields(ticket.ticket),
                    )
            elif now >= ticket.ticket.expires_at and ticket.handle.abort(AbortReason.EXPIRED):
                log.info(
                    "ticket %s: TTL passed while running; aborting its vLLM request",
                    ticket.id,
                    extra=ticket_fields(ticket.ticket),
                )
