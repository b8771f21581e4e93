"""Which endpoint serves a ticket while a rollout runs, and the per-arm record of every call.

The endpoint is chosen once, when the ticket's attempt starts, from the rollout state this worker
read at most `refresh_seconds` ago; the attempt then finishes on that endpoint whatever the
rollout does meanwhile. So a wave change or a rollback never moves a request that is running:
a rollback only changes where the next attempts go, and since the claim lease fences every ticket
to one attempt at a time, no ticket is lost or answered twice. The candidate's own breaker
(worker/candidate_breaker.py) may send a canary ticket to the primary instead; such a ticket
counts as a `breaker` outcome of the candidate's arm, a failure for the wave judge.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from shared.control import read_control_state
from shared.keys import QueueKeys
from shared.models import Ticket
from shared.policy import AlarmLevel, Policy
from shared.rollout import RolloutState, routes_to_candidate
from shared.rollout_stats import record_call
from shared.rollout_store import read_rollout
from worker.breaker_gate import BreakerGate
from worker.candidate_breaker import CanaryRoute, CandidateBreaker
from worker.shadow import ShadowRunner
from worker.vllm_client import Completion, RequestHandle, VllmClient, VllmError

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.5
"""How stale this worker's view of the rollout may be: the delay before a step reaches its routing."""
SHED_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RolloutView:
    rollout: RolloutState | None
    level: AlarmLevel


def call_outcome(error: VllmError | None) -> str:
    """The arm outcome a call's error counts as (shared/rollout_stats.py): a 429 or 503 is a shed
    only with a Retry-After (the endpoint turning work away under load); without one it is an
    error, as the breaker counts it."""
    if error is None:
        return "ok"
    if not error.transient:
        return "client"
    if error.status_code in SHED_STATUSES and error.retry_after is not None:
        return "shed"
    return "error"


class ArmClient:
    """An endpoint as one arm of the rollout: calls are counted per arm, and a candidate call that
    fails before sending any text is answered by the primary in the same attempt (`rescue`), so a
    canary branch does not wait out a retry backoff for the candidate's fault; the failure still
    counts against the candidate and so still rolls it back."""

    def __init__(
        self,
        router: RolloutRouter,
        client: VllmClient,
        arm: str,
        rollout: RolloutState,
        rescue: VllmClient | None = None,
        probe: bool = False,
        shadowed: bool = True,
    ) -> None:
        self.router = router
        self.client = client
        self.arm = arm
        self.rollout = rollout
        self.rescue = rescue
        self.answered_by = client
        """The endpoint whose outcome the breaker counts: the primary once it rescued the call."""
        self.probe = probe
        """This call is the candidate's half-open probe (until the primary rescues it)."""
        self.shadowed = shadowed
        """A primary answer may be shadowed; not a rescue, whose ticket the candidate already failed."""

    @property
    def base_url(self) -> str:
        return self.answered_by.base_url

    def run(
        self,
        ticket: Ticket,
        *,
        max_tokens: int,
        handle: RequestHandle,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        sent: list[bool] = []

        def relay(text: str) -> None:
            sent.append(True)
            if on_text is not None:
                on_text(text)

        try:
            completion = self.client.run(ticket, max_tokens=max_tokens, handle=handle, on_text=relay)
        except VllmError as error:
            self.router.record(self.rollout, self.arm, call_outcome(error), None)
            if self.rescue is None or not error.transient or sent:
                raise
            log.info(
                "ticket %s: the candidate failed (%s); the primary answers it", ticket.id, error.kind.value
            )
            # The executor counts only the rescuer's outcome, so the candidate's failure is counted here.
            self.router.candidate_breaker.record(self.client, False, probe=self.probe)
            self.answered_by, self.probe = self.rescue, False
            primary = ArmClient(self.router, self.rescue, "primary", self.rollout, shadowed=False)
            return primary.run(ticket, max_tokens=max_tokens, handle=handle, on_text=on_text)
        self.router.record(self.rollout, self.arm, "ok", completion.ttft_seconds)
        if self.arm == "primary" and self.shadowed:
            self.router.shadow.offer(self.rollout, ticket, completion, max_tokens)
        return completion


class RolloutRouter:
    """One worker's view of its queue's rollout and its client for the candidate."""

    def __init__(
        self,
        client: redis.Redis,
        keys: QueueKeys,
        policy: Policy,
        pool_size: int,
        refresh_seconds: float = REFRESH_SECONDS,
        breakers: BreakerGate | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.policy = policy
        self.pool_size = pool_size
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._view = RolloutView(None, AlarmLevel.GREEN)
        self._read_at = float("-inf")
        self._candidate: VllmClient | None = None
        self.candidate_breaker = CandidateBreaker(breakers, self._rollout_id)
        self.shadow = ShadowRunner(client, keys, policy.rollout, self)

    def _rollout_id(self) -> str:
        rollout = self._view.rollout
        return rollout.id if rollout is not None else ""

    def view(self) -> RolloutView:
        """The rollout and alarm level, re-read when older than `refresh_seconds`."""
        with self._lock:
            if time.monotonic() - self._read_at < self.refresh_seconds:
                return self._view
            self._read_at = time.monotonic()
        try:
            rollout = read_rollout(self.redis, self.keys)
            state, _ = read_control_state(self.redis, self.keys, self.policy.alarms)
            view = RolloutView(rollout, state.level)
        except redis.RedisError as exc:
            log.warning("could not read the rollout state (%s); keeping the last one", exc)
            return self._view
        with self._lock:
            self._view = view
        return view

    def candidate_client(self, url: str) -> VllmClient:
        """The client of the candidate at `url`, made once per candidate."""
        with self._lock:
            if self._candidate is None or self._candidate.base_url != url.rstrip("/"):
                old, self._candidate = self._candidate, VllmClient(url, pool_size=self.pool_size)
                if old is not None:
                    old.close()
            return self._candidate

    def client_for(self, ticket: Ticket, chosen: VllmClient, primary: VllmClient) -> VllmClient | ArmClient:
        """`chosen` (the endpoint picked without a rollout), or the arm the rollout routes `ticket` to.

        Tickets sent to the fallback stay there: the rollout compares candidate and primary only.
        """
        rollout = self.view().rollout
        if rollout is None or chosen is not primary:
            return chosen
        if routes_to_candidate(ticket.branch_id, rollout.status, rollout.wave):
            route = self.candidate_breaker.route(rollout.candidate_url)
            if route is CanaryRoute.PRIMARY:
                # The breaker is the one judge of the candidate's health: a ticket it keeps off
                # the candidate is the candidate's failure, so the wave judge sees what it saw.
                self.record(rollout, "candidate", "breaker", None)
                return ArmClient(self, primary, "primary", rollout)
            candidate = self.candidate_client(rollout.candidate_url)
            probe = route is CanaryRoute.PROBE
            return ArmClient(self, candidate, "candidate", rollout, rescue=primary, probe=probe)
        if rollout.active:
            return ArmClient(self, primary, "primary", rollout)
        return chosen

    def record(self, rollout: RolloutState, arm: str, outcome: str, ttft: float | None) -> None:
        try:
            record_call(
                self.redis,
                self.keys,
                self.policy.rollout,
                rollout_id=rollout.id,
                wave=rollout.wave,
                arm=arm,
                outcome=outcome,
                ttft_seconds=ttft,
            )
        except redis.RedisError as exc:  # the ticket's own result matters more than its tally
            log.warning("could not record a %s call of rollout %s: %s", arm, rollout.id, exc)

    def close(self) -> None:
        self.shadow.close()
        with self._lock:
            if self._candidate is not None:
                self._candidate.close()
