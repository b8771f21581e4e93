"""Each served queue's own view of endpoint health: its breakers and its rollout routing.

A worker serving `--queue a --queue b` keeps a breaker gate and a rollout router per queue, each
in that queue's keys, so an endpoint failing `b`'s tickets opens `b`'s breaker and not `a`'s, and
each queue runs its own rollout. A ticket is routed and counted by the queue it came from. The
claim loop asks `routes()`: claim from the queues whose endpoint is healthy, and (one step at a
time) take the one probe of a queue whose endpoint is failing or half-open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.queue import TicketQueue
from worker.breaker_gate import BreakerGate
from worker.claim_plan import Bound, Gate
from worker.queue_set import Queues, QueueSet
from worker.rollout_routing import RolloutRouter


@dataclass(frozen=True)
class Routes:
    """Where one claim step may take from: `among` (queue names), or one probe ticket of `probe`."""

    among: tuple[str, ...]
    probe: str | None = None
    wait_seconds: float = 0.0
    """With nothing to claim from: how long until a circuit may let claims through again."""
    why: Bound | None = None
    """Why nothing healthy is claimed from: the probe's reason, else the soonest wait's."""

    @property
    def gate(self) -> Gate:
        return Gate.GO if self.among else Gate.PROBE if self.probe is not None else Gate.WAIT


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
        """Healthy endpoints are claimed from; of the probing ones, the first whose probe is free
        is offered (the caller takes it with `take_probe`); the rest wait."""
        among: list[str] = []
        probe: str | None = None
        probing: Bound | None = None
        waits: list[tuple[float, Bound | None]] = []
        for endpoint in self.endpoints:
            gate, seconds, why = endpoint.breakers.claim_gate()
            if gate is Gate.GO:
                among.append(endpoint.name)
            elif gate is Gate.PROBE and probe is None:
                probe, probing = endpoint.name, why
            else:
                waits.append((seconds, why))
        wait, soonest = min(waits, key=lambda w: w[0], default=(0.0, None))
        return Routes(tuple(among), probe, wait, probing or soonest)

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
