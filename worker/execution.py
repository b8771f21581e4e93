"""Running one claimed ticket: call vLLM, then record what happened.

Runs on a thread of the worker's pool. Whatever happens, the ticket leaves this function in a
known state (done, failed, back in the queue, or already ended by someone else) and leaves the
in-flight set, so none is ever stuck `running` on a live worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis

from shared import tracing
from shared.logs import ticket_fields
from shared.policy import Policy
from worker import telemetry
from worker.inflight import AbortReason, InFlight, RunningTicket
from worker.live_publisher import LivePublisher
from worker.preemption import Preemptor
from worker.queue_endpoints import QueueEndpoints
from worker.queue_set import QueueSet
from worker.result_writer import ResultWriter
from worker.rollout_routing import ArmClient
from worker.throttle import Throttle
from worker.vllm_client import RequestAborted, VllmClient, VllmError

log = logging.getLogger(__name__)

PREEMPTED_WORDS = "preempted to make room for a critical ticket; the answer starts over"
"""What a streaming reader is told when its partial answer is discarded."""


def capped_max_tokens(running: RunningTicket, policy: Policy, degraded: bool) -> int:
    """The ticket's max_tokens, within the context left after its prompt and, while the monitor
    has degraded service, within its type's degraded cap."""
    ticket = running.ticket
    room = max(policy.queue.context_limit_tokens - ticket.prompt_tokens_estimate, 1)
    cap = min(ticket.max_tokens, room)
    degraded_cap = (
        policy.type_policy(ticket.type).degraded_max_tokens if ticket.type in policy.types else None
    )
    if degraded and degraded_cap is not None:
        cap = min(cap, degraded_cap)
    return max(cap, 1)


@dataclass
class Executor:
    worker_id: str
    policy: Policy
    primary: VllmClient
    fallback: VllmClient | None
    writer: ResultWriter
    inflight: InFlight
    degraded: bool = False
    """Set by the housekeeping thread from the monitor's published state."""
    endpoints: QueueEndpoints | None = None
    """Each served queue's breakers and rollout routing: a ticket uses its own queue's."""
    throttle: Throttle | None = None
    """Fed each critical answer's run time on the primary (the adaptive throttle)."""
    preemptor: Preemptor | None = None

    def client_for(self, running: RunningTicket) -> VllmClient | ArmClient:
        """The endpoint of this attempt, chosen once: it finishes there whatever changes meanwhile.
        A breaker probe always goes to the primary; otherwise a rollout may route to its candidate."""
        routed = running.ticket.route == "fallback"
        if self.endpoints is None:
            return self.fallback if routed and self.fallback is not None else self.primary
        endpoint = self.endpoints.of_ticket(running.id)
        chosen = endpoint.breakers.client_for(routed, running.probe)
        if not running.probe:
            return endpoint.rollout.client_for(running.ticket, chosen, self.primary)
        return chosen

    def _record(
        self, client: VllmClient | ArmClient, running: RunningTicket, error: VllmError | None = None
    ) -> None:
        """Count the call on its endpoint's breaker, the one health state: only a transient error
        is a failure (it pauses claims, at least as long as vLLM's Retry-After asks)."""
        if self.endpoints is None:
            return
        endpoint = client.answered_by if isinstance(client, ArmClient) else client
        probe = running.probe or (isinstance(client, ArmClient) and client.probe)
        ok, retry_after = (True, None) if error is None else (not error.transient, error.retry_after)
        try:
            breakers = self.endpoints.of_ticket(running.id).breakers
            breakers.record(endpoint, ok, probe=probe, retry_after=retry_after)
        except redis.RedisError as exc:  # the answer still counts; only the breaker misses one sample
            log.warning("breaker: could not count an outcome of %s (%s)", client.base_url, exc)

    def __call__(self, running: RunningTicket) -> None:
        ticket = running.ticket
        attributes = {**tracing.ticket_attributes(ticket), "tidegate.worker": self.worker_id}
        try:
            # A child of the submitting span (its context is stored on the ticket), whatever waited.
            with tracing.span(
                "tidegate.ticket", kind="consumer", parent=ticket.traceparent, attributes=attributes
            ):
                self._run(running)
        except Exception:
            # A bug or a Redis outage while recording: the lease is left to expire, so the reaper
            # returns the ticket (counting the attempt) rather than anything being lost.
            log.exception(
                "ticket %s: unexpected error; its lease will expire and return it",
                running.id,
                extra=ticket_fields(running.ticket, self.worker_id),
            )
        finally:
            self.inflight.remove(running.id)

    def _publisher(self, running: RunningTicket) -> LivePublisher | None:
        if running.ticket.live is None:
            return None
        queue = self.writer.queue
        if isinstance(queue, QueueSet):  # the live stream is read on the ticket's own queue
            queue = queue.owner(running.id)
        return LivePublisher(
            queue.redis,
            queue.keys,
            running.ticket,
            on_cancel=lambda: running.handle.abort(AbortReason.CANCELLED),
        )

    def _run(self, running: RunningTicket) -> None:
        client = self.client_for(running)
        max_tokens = capped_max_tokens(running, self.policy, self.degraded)
        live = self._publisher(running)
        on_text = self._on_text(running, live)
        try:
            with tracing.span("vllm.completion", kind="client", attributes={"server.url": client.base_url}):
                completion = client.run(
                    running.ticket, max_tokens=max_tokens, handle=running.handle, on_text=on_text
                )
        except RequestAborted as aborted:
            outcome = self._after_abort(running, aborted.reason)
            if live is not None and outcome is not None:
                words = (
                    PREEMPTED_WORDS
                    if aborted.reason == AbortReason.PREEMPTED
                    else f"request aborted ({aborted.reason})"
                )
                self._publish_outcome(live, outcome, words)
            return
        except VllmError as error:
            telemetry.count_vllm_error(self.worker_id, error.kind.value)
            self._record(client, running, error)
            if error.transient:
                log.warning(
                    "vLLM %s failed ticket %s (%s): %s",
                    client.base_url,
                    running.id,
                    error.kind.value,
                    error.message,
                    extra=ticket_fields(running.ticket, self.worker_id),
                )
                message = f"{error.kind.value}: {error.message}"
                outcome = self.writer.retry(
                    running, message, retry_after=error.retry_after, count_attempt=running.healthy
                )
                if live is not None:
                    self._publish_outcome(live, outcome, message)
            else:
                message = f"vLLM rejected the request ({error.status_code}): {error.message}"
                if self.writer.failed(running, message) and live is not None:
                    live.end("failed", error=message)
            return
        self._record(client, running)
        ticket_type = running.ticket.type
        if self.throttle is not None and client is self.primary and self.policy.is_critical(ticket_type):
            slo = self.policy.type_policy(ticket_type).slo_seconds
            if slo is not None:
                self.throttle.observe(run_seconds=completion.total_seconds, slo_seconds=slo)
        if not self.writer.done(running, completion):
            return
        if live is not None:
            live.end(
                "done",
                finish_reason=completion.finish_reason,
                prompt_tokens=completion.prompt_tokens,
                completion_tokens=completion.completion_tokens,
            )

    def _on_text(self, running: RunningTicket, live: LivePublisher | None) -> Callable[[str], None] | None:
        """Each piece of the answer, to the live stream when it relays tokens; None otherwise."""
        return live.token if live is not None and running.ticket.live == "tokens" else None

    @staticmethod
    def _publish_outcome(live: LivePublisher, outcome: str, error: str) -> None:
        """A retry outcome as the live stream's reader needs it: start over, or the ticket ended."""
        if outcome in ("retry", "requeued"):
            live.retry(error)
        elif not outcome.startswith("stale"):
            live.end(outcome, error=error)

    def _after_abort(self, running: RunningTicket, reason: str) -> str | None:
        """Record an aborted run; the retry script's outcome, or None when nothing was written."""
        if reason == AbortReason.SHUTDOWN:
            return self.writer.give_back(running, "worker shutting down before the answer was complete")
        if reason == AbortReason.EXPIRED:
            return self.writer.expire(running)
        if reason == AbortReason.PREEMPTED:
            outcome = self.preemptor.requeue(running) if self.preemptor is not None else "exhausted"
            if outcome == "exhausted":  # preempted too often meanwhile: back without its turn lost
                return self.writer.give_back(running, "preempted to start a critical ticket")
            return outcome
        # Cancelled or taken over: the ticket's state is someone else's to write.
        log.info(
            "ticket %s: request aborted (%s)",
            running.id,
            reason,
            extra=ticket_fields(running.ticket, self.worker_id),
        )
        return None
