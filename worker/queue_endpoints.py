"""Each served queue's own view of endpoint health: its breakers and its rollout routing.

A worker serving `--queue a --queue b` keeps a breaker gate and a rollout router per queue, each
in that queue's keys, so an endpoint failing `b`'s tickets opens `b`'s breaker and not `a`'s, and
each queue runs its own rollout. A ticket is routed and counted by the queue it came from. The
claim loop asks `routes()`: claim from the queues whose circuit is closed, and (one step at a
time) take the one half-open probe of a queue whose circuit is probing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.queue import TicketQueue
from worker.breaker_gate import BreakerGate, Gate
from worker.queue_set import Queues, QueueSet
from worker.rollout_routing import RolloutRouter


@dataclass(frozen=True)
class Routes:
    """Where one claim step may take from: `among` (queue names), or one probe ticket of `probe`."""

    among: tuple[str, ...]
    probe: str | None = None
    wait_seconds: float = 0.0
    """With nothing to claim from: how long until a circuit may let claims through again."""

    @property
    def waits(self) -> bool:
        return not self.among and self.probe is None


@dataclass(frozen=True)
class QueueEndpoint:
    """One queue's breakers and rollout routing."""

    queue: TicketQueue
    breakers: BreakerGate
    rollout: RolloutRouter

    @property
    def name(self) -> str:
        return self.queue.keys.queue


class QueueEndpoints:
    def __init__(self, queues: Queues, endpoints: Sequence[QueueEndpoint]) -> None:
        if not endpoints:
            raise ValueError("endpoints: at least one queue is needed")
        self.queues = queues
        self.endpoints = list(endpoints)
        self._by_name = {e.name: e for e in self.endpoints}

    @property
    def first(self) -> QueueEndpoint:
        return self.endpoints[0]

    def of_ticket(self, ticket_id: str) -> QueueEndpoint:
        """The endpoint view of the queue `ticket_id` was claimed from."""
        if isinstance(self.queues, QueueSet):
            return self._by_name.get(self.queues.owner(ticket_id).keys.queue, self.first)
        return self.first

    def named(self, queue: str) -> QueueEndpoint:
        return self._by_name[queue]

    def routes(self) -> Routes:
        """Closed circuits are claimed from; of the half-open ones, the first whose probe is free
        is offered (the caller takes it with `take_probe`); open ones wait."""
        among: list[str] = []
        probe: str | None = None
        waits: list[float] = []
        for endpoint in self.endpoints:
            gate, seconds = endpoint.breakers.claim_gate()
            if gate is Gate.GO:
                among.append(endpoint.name)
            elif gate is Gate.PROBE and probe is None:
                probe = endpoint.name
            else:
                waits.append(seconds)
        return Routes(tuple(among), probe, min(waits, default=0.0))

    def take_probe(self, queue: str) -> bool:
        return self.named(queue).breakers.take_probe()

    def release_probe(self, queue: str) -> None:
        self.named(queue).breakers.release_probe()

    def pair(self) -> None:
        for endpoint in self.endpoints:
            endpoint.breakers.pair()

    def close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.rollout.close()
