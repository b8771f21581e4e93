"""In-flight preemption: a worker at its limit makes room for a critical ticket waiting in the queue.

The reserved share lets a critical ticket start while the others fill only their part of the batch;
but when the limit itself is full (it shrank under load, or critical tickets hold the share) a loan
would wait for a departure, seconds behind a long archive answer. Then the most recently claimed
non-critical ticket is aborted — it has done the least work — and put back at its original score
without using an attempt (`shared/lua/preempt.lua`), so the loan takes its slot at once. A ticket is
preempted at most `max_preemptions` times, so a busy stream of loans cannot starve it, and one
preemption at a time is in progress, so one waiting loan never costs two answers. It happens at
once: waiting for a slot to free kept more of the GPU's work but lengthened the loans' tail
(RESULTS.md, "Holding the loan SLO").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from shared.control import append_event
from shared.logs import ticket_fields
from shared.metrics import PREEMPTIONS
from shared.queue import TicketQueue
from worker.inflight import AbortReason, InFlight, RunningTicket
from worker.queue_set import Queues, QueueSet

log = logging.getLogger(__name__)


def choose_victim(
    running: Iterable[RunningTicket], critical: frozenset[str], max_preemptions: int
) -> RunningTicket | None:
    """The most recently claimed non-critical ticket that may still be preempted, if any.

    A ticket whose tokens a client is already reading live is taken only when no other will do: its
    stream cannot be taken back, so the API ends it `answer_interrupted` rather than `done`.
    """
    candidates = [
        r
        for r in running
        if r.ticket.type not in critical
        and r.ticket.preemptions < max_preemptions
        and r.handle.reason is None
    ]
    return max(candidates, key=lambda r: (not _streamed_live(r), r.claimed_at), default=None)


def _streamed_live(running: RunningTicket) -> bool:
    return running.ticket.live == "tokens" and running.started


class Preemptor:
    """Decides and starts preemptions; the runner of the aborted ticket does the requeue (`requeue`)."""

    def __init__(
        self,
        *,
        queue: Queues,
        inflight: InFlight,
        worker_id: str,
        max_preemptions: int,
    ) -> None:
        self.queue = queue
        self.inflight = inflight
        self.worker_id = worker_id
        self.max_preemptions = max_preemptions
        self.critical = frozenset(queue.policy.critical_types)

    def make_room(self) -> bool:
        """Abort one ticket when a critical one heads the queue; True while a preemption is under way."""
        tickets = self.inflight.snapshot()
        if any(r.handle.reason == AbortReason.PREEMPTED for r in tickets):
            return True  # its slot frees when its runner has put it back
        head = self.queue.head()
        if head is None or head.type not in self.critical:
            return False
        victim = choose_victim(tickets, self.critical, self.max_preemptions)
        if victim is None or not victim.handle.abort(AbortReason.PREEMPTED):
            return False
        log.info(
            "ticket %s: preempted for a waiting %s ticket",
            victim.id,
            head.type,
            extra=ticket_fields(victim.ticket, self.worker_id)
            | {"event": "preemption", "for_type": head.type},
        )
        return True

    def requeue(self, running: RunningTicket) -> str:
        """Put a preempted ticket back (its runner calls this once vLLM's request is cut off)."""
        reason = "preempted to start a critical ticket; not counted as an attempt"
        owner: TicketQueue = self.queue.owner(running.id) if isinstance(self.queue, QueueSet) else self.queue
        outcome = self.queue.preempt(
            running.id, running.token, running.ticket.type, reason, max_preemptions=self.max_preemptions
        )
        if outcome == "requeued":
            PREEMPTIONS.labels(worker=self.worker_id, type=running.ticket.type).inc()
            append_event(
                owner.redis,
                owner.keys,
                "preemption",
                ticket=running.id,
                type=running.ticket.type,
                worker=self.worker_id,
                preemptions=running.ticket.preemptions + 1,
            )
        log.info(
            "ticket %s: preemption %s",
            running.id,
            outcome,
            extra=ticket_fields(running.ticket, self.worker_id),
        )
        return outcome
