"""Shadow traffic: a sampled share of the primary's answered tickets is sent to the candidate too.

The shadow call runs after the primary answered, on a small pool of its own, so it never takes a
claim slot or delays a ticket; its answer is only compared and recorded, never written to the
ticket, so no branch sees it. It asks vLLM for a priority below every real ticket's, and it is
skipped (not queued) at orange or red, while the candidate's breaker diverts its traffic (the one
health state of the candidate, shared by every worker: worker/candidate_breaker.py), and when the
pool is busy. Shadow calls count on the candidate's breaker like its canary calls.
Sampling hashes the ticket id, so a ticket retried elsewhere is sampled alike by every worker.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import redis

from shared import clock
from shared.keys import QueueKeys
from shared.metrics import ROLLOUT_SHADOW
from shared.models import Ticket
from shared.policy import AlarmLevel, RolloutPolicy
from shared.rollout import RolloutState
from shared.rollout_stats import record_shadow
from worker.vllm_client import Completion, RequestHandle, VllmError

if TYPE_CHECKING:
    from worker.rollout_routing import RolloutRouter

log = logging.getLogger(__name__)

SHADOW_PRIORITY = 10_000.0
"""Sent as the shadow call's priority: far past any type's base, so vLLM runs it after real tickets."""


def sampled(ticket_id: str, fraction: float) -> bool:
    """Whether `ticket_id` falls in the shadowed `fraction`, the same answer in every worker."""
    point = int.from_bytes(hashlib.sha256(ticket_id.encode()).digest()[:8], "big") / 2**64
    return point < fraction


def shadow_copy(ticket: Ticket, timeout_seconds: float) -> Ticket:
    """The request sent to the candidate: its own id in vLLM's log, the lowest priority, its own deadline."""
    return ticket.model_copy(
        update={
            "id": f"{ticket.id}-shadow",
            "priority": SHADOW_PRIORITY,
            "expires_at": clock.now() + timeout_seconds,
        }
    )


def answer_figures(completion: Completion) -> dict[str, Any]:
    """Latency and size of one answer: TTFT, time per output token after the first, total."""
    tpot = None
    if completion.ttft_seconds is not None and completion.completion_tokens > 1:
        tpot = (completion.total_seconds - completion.ttft_seconds) / (completion.completion_tokens - 1)
    return {
        "ttft_seconds": completion.ttft_seconds,
        "tpot_seconds": tpot,
        "total_seconds": completion.total_seconds,
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "model": completion.model,
        "error": None,
    }


class ShadowRunner:
    """The shadow calls of one worker."""

    def __init__(
        self, client: redis.Redis, keys: QueueKeys, policy: RolloutPolicy, router: RolloutRouter
    ) -> None:
        self.redis = client
        self.keys = keys
        self.policy = policy
        self.router = router
        self.pool = ThreadPoolExecutor(max_workers=policy.shadow_concurrency, thread_name_prefix="shadow")
        self._lock = threading.Lock()
        self._busy = 0
        self.skipped: dict[str, int] = {"level": 0, "breaker": 0, "busy": 0}

    def offer(self, rollout: RolloutState, ticket: Ticket, primary: Completion, max_tokens: int) -> bool:
        """Shadow `ticket` when it is sampled and nothing forbids it; True when a call was started."""
        if (
            not rollout.active
            or rollout.shadow_fraction <= 0
            or not sampled(ticket.id, rollout.shadow_fraction)
        ):
            return False
        reason = self._refusal(rollout)
        with self._lock:
            if reason is None and self._busy >= self.policy.shadow_concurrency:
                reason = "busy"
            if reason is not None:
                self.skipped[reason] += 1
                ROLLOUT_SHADOW.labels(outcome=f"skipped_{reason}").inc()
                return False
            self._busy += 1
        self.pool.submit(self._run, rollout, ticket, primary, max_tokens)
        return True

    def _refusal(self, rollout: RolloutState) -> str | None:
        if self.router.view().level >= AlarmLevel.ORANGE:
            return "level"
        if not self.router.candidate_breaker.allows_shadow(rollout.candidate_url):
            return "breaker"
        return None

    def _run(self, rollout: RolloutState, ticket: Ticket, primary: Completion, max_tokens: int) -> None:
        try:
            if self.router.view().level >= AlarmLevel.ORANGE:  # raised while this call waited
                with self._lock:
                    self.skipped["level"] += 1
                ROLLOUT_SHADOW.labels(outcome="skipped_level").inc()
                return
            record = self._call(rollout, ticket, primary, max_tokens)
            record_shadow(self.redis, self.keys, self.policy, rollout.id, record)
            ROLLOUT_SHADOW.labels(outcome="failed" if record["similarity"] is None else "recorded").inc()
        except (redis.RedisError, OSError) as exc:
            log.warning("shadow of ticket %s not recorded: %s", ticket.id, exc)
        except Exception:
            log.exception("shadow of ticket %s failed", ticket.id)
        finally:
            with self._lock:
                self._busy -= 1

    def _call(
        self, rollout: RolloutState, ticket: Ticket, primary: Completion, max_tokens: int
    ) -> dict[str, Any]:
        shadow_ticket = shadow_copy(ticket, self.policy.shadow_timeout_seconds)
        client = self.router.candidate_client(rollout.candidate_url)
        record: dict[str, Any] = {
            "ticket": ticket.id,
            "type": ticket.type,
            "branch": ticket.branch_id,
            "at": clock.now(),
            "primary": answer_figures(primary),
        }
        try:
            answer = client.run(shadow_ticket, max_tokens=max_tokens, handle=RequestHandle())
        except VllmError as error:
            self.router.candidate_breaker.record(client, not error.transient)
            record.update(candidate={"error": f"{error.kind.value}: {error.message}"}, similarity=None)
            return record
        self.router.candidate_breaker.record(client, True)
        similarity = difflib.SequenceMatcher(None, primary.text, answer.text).ratio()
        record.update(candidate=answer_figures(answer), similarity=round(similarity, 4))
        return record

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
