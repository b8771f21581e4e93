"""Writing a ticket's outcome, fenced by its claim token.

Every write goes through the queue's scripts with the token of the claim that started the run,
so a worker whose lease was taken over (it stalled, the reaper gave the ticket to another) cannot
write a second answer: the script refuses and the answer is dropped here, with a warning. A ticket
its branch cancelled is refused the same way, but that is expected and logged as information.
"""

from __future__ import annotations

import logging

from shared import clock
from shared.logs import ticket_fields
from shared.models import TicketStatus
from shared.queue import ClaimedTicket, TicketQueue
from worker import telemetry
from worker.inflight import AbortReason, RunningTicket
from worker.queue_set import Queues, QueueSet
from worker.vllm_client import Completion

log = logging.getLogger(__name__)


def _cancelled(queue: TicketQueue, running: RunningTicket) -> bool:
    """The branch cancelled the ticket (an expected end), rather than another worker taking it over.

    The abort says so when the cancel reached the request; a cancel that came as the answer was
    finishing shows only in the ticket's status, read here, on this rare path alone."""
    if running.handle.reason == AbortReason.CANCELLED:
        return True
    found = queue.get(running.id)
    return found is not None and found.status is TicketStatus.CANCELLED


class ResultWriter:
    def __init__(self, queue: Queues, worker_id: str) -> None:
        self.queue = queue
        self.worker_id = worker_id

    def done(self, running: RunningTicket, completion: Completion) -> bool:
        """Store the answer and its usage; False when the lease was lost (nothing is written)."""
        usage = completion.usage()
        usage["worker"] = self.worker_id
        usage["gpu"] = running.gpu
        extra = {"first_token_at": repr(completion.first_token_at)} if completion.first_token_at else {}
        owner = self.queue.owner(running.id) if isinstance(self.queue, QueueSet) else self.queue
        written = self.queue.finish(
            running.id, running.token, "done", result=completion.text, usage=usage, extra=extra
        )
        fields = ticket_fields(running.ticket, self.worker_id)
        if written:
            telemetry.observe_answer(running.ticket, completion.first_token_at, clock.now())
            log.info("ticket %s: done", running.id, extra=fields)
        elif _cancelled(owner, running):
            log.info(
                "ticket %s: cancelled by its branch while running; its answer is not stored",
                running.id,
                extra=fields,
            )
        else:
            log.warning(
                "ticket %s: lease lost before its answer was written; answer dropped",
                running.id,
                extra=fields,
            )
        return written

    def failed(self, running: RunningTicket, error: str) -> bool:
        """End the ticket `failed` for good (vLLM refused it: retrying cannot help)."""
        written = self.queue.finish(running.id, running.token, "failed", error=error)
        if not written:
            log.warning(
                "ticket %s: lease lost before its failure was written",
                running.id,
                extra=ticket_fields(running.ticket, self.worker_id),
            )
        return written

    def deadline_passed(self, claimed: ClaimedTicket, reason: str) -> bool:
        """End a claimed, unstarted ticket `expired`: its deadline can no longer be met."""
        ticket = claimed.ticket
        written = self.queue.finish(ticket.id, claimed.token, "expired", error=reason)
        log.info(
            "ticket %s: expired unstarted: %s", ticket.id, reason, extra=ticket_fields(ticket, self.worker_id)
        )
        return written

    def retry(
        self,
        running: RunningTicket,
        error: str,
        *,
        retry_after: float | None = None,
        count_attempt: bool = True,
    ) -> str:
        """Back to the queue after a transient failure, with backoff; the attempt counts unless the
        endpoint was already considered unhealthy when the ticket was sent."""
        backoff = self.queue.backoff_seconds(running.ticket.attempts)
        if retry_after is not None:
            backoff = max(backoff, retry_after)
        outcome = self.queue.retry(
            running.id,
            running.token,
            running.ticket.type,
            error,
            backoff=backoff,
            count_attempt=count_attempt,
            attempts=running.ticket.attempts,
        )
        log.info(
            "ticket %s: %s (attempt %d): %s",
            running.id,
            outcome,
            running.ticket.attempts,
            error,
            extra=ticket_fields(running.ticket, self.worker_id),
        )
        return outcome

    def give_back(self, running: RunningTicket, reason: str) -> str:
        """Return the ticket at once without using an attempt (this worker stops, vLLM is fine)."""
        outcome = self.queue.retry(
            running.id, running.token, running.ticket.type, reason, backoff=0, count_attempt=False
        )
        if (
            outcome == "retry"
        ):  # back in the pending set: wake an idle worker rather than wait for its timeout
            self.queue.wake_workers()
        log.info(
            "ticket %s: given back (%s): %s",
            running.id,
            reason,
            outcome,
            extra=ticket_fields(running.ticket, self.worker_id),
        )
        return outcome

    def expire(self, running: RunningTicket) -> str:
        """TTL passed while running: the retry script ends it `expired` (no attempt is used)."""
        return self.queue.retry(
            running.id,
            running.token,
            running.ticket.type,
            "TTL passed while running; the vLLM request was aborted",
            backoff=0,
            count_attempt=False,
        )
