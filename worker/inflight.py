"""The tickets a worker is running right now, shared by its threads.

The claim loop adds, the runner threads remove, the lease keeper reads the leases and the
shutdown path reads who has not started yet. One lock and one condition keep it simple; closing
it at shutdown makes "check stopping, then add" a single step, so no ticket slips in afterwards.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum

from shared.models import Ticket
from worker.vllm_client import RequestHandle


class AbortReason(StrEnum):
    CANCELLED = "cancelled"
    """Its branch cancelled it: nothing to write, the ticket already says so."""
    LEASE_LOST = "lease lost"
    """Another worker holds it now (our lease expired): nothing may be written."""
    EXPIRED = "expired"
    """Its TTL passed while it ran: the answer would come too late."""
    SHUTDOWN = "shutdown"
    """This worker is stopping: the ticket goes back to the queue without using an attempt."""
    PREEMPTED = "preempted"
    """A critical ticket needs its slot: it goes back at its score without using an attempt."""


@dataclass
class RunningTicket:
    ticket: Ticket
    token: str
    gpu: int
    handle: RequestHandle = field(default_factory=RequestHandle)
    claimed_at: float = field(default_factory=time.monotonic)
    probe: bool = False
    """Sent as the probe of the primary's breaker (failing or half-open)."""

    @property
    def id(self) -> str:
        return self.ticket.id

    @property
    def healthy(self) -> bool:
        """Whether its endpoint was considered healthy when it was claimed (a probe's was not):
        only then does a failure spend one of its attempts (an outage is not the ticket's fault)."""
        return not self.probe

    @property
    def started(self) -> bool:
        """Whether vLLM has produced its first token (work that would be lost by giving it back)."""
        return self.handle.first_token_at is not None


class InFlight:
    def __init__(self) -> None:
        self._tickets: dict[str, RunningTicket] = {}
        self._changed = threading.Condition()
        self._closed = False

    def add(self, running: RunningTicket) -> bool:
        """Track a claimed ticket; False once closed (the caller must give the ticket back)."""
        with self._changed:
            if self._closed:
                return False
            self._tickets[running.id] = running
            return True

    def remove(self, ticket_id: str) -> None:
        with self._changed:
            self._tickets.pop(ticket_id, None)
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        with self._changed:
            return self._closed

    def count(self) -> int:
        with self._changed:
            return len(self._tickets)

    def reserved_tokens(self) -> int:
        """KV tokens the running tickets may grow to (prompt estimate plus max_tokens each)."""
        with self._changed:
            return sum(r.ticket.cost_tokens for r in self._tickets.values())

    def snapshot(self) -> list[RunningTicket]:
        with self._changed:
            return list(self._tickets.values())

    def wait_for_departure(self, timeout: float) -> None:
        """Block until a ticket leaves (a slot frees), the set closes, or `timeout` passes."""
        with self._changed:
            self._changed.wait(timeout)

    def wait_until_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._tickets:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True
