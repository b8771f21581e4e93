"""The rollout candidate's own circuit breaker, as it steers canary routing and shadow traffic.

The candidate is counted on the shared breaker ladder like any endpoint (shared/breaker.py), and
the primary is its fallback: while its circuit is open, or its sustained rung holds, the tickets
the canary routes to it go to the primary instead and no shadow call is sent; half-open, one
canary ticket at a time (shared by all workers) probes it. This breaker is the candidate's one
health state: each canary ticket it keeps off the candidate is counted in the candidate's arm as a
failure (`breaker`, worker/rollout_routing.py), so the wave judge sees what tripped it and rolls
the candidate back instead of holding the wave for samples that never come.
Every transition of the candidate's breaker is recorded as a rollout event once, by the worker
that committed it, with where canary tickets go from then on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import StrEnum

import redis

from shared import clock
from shared.breaker import BreakerState, Phase, endpoint_id
from shared.control import append_event
from worker.breaker_gate import BreakerGate
from worker.vllm_client import VllmClient

log = logging.getLogger(__name__)

CANDIDATE_ROLE = "candidate"
"""The role status shows for the candidate's breaker; admission refuses only for open primaries."""


class CanaryRoute(StrEnum):
    CANDIDATE = "candidate"
    PROBE = "probe"
    """The candidate is half-open and this ticket is its one probe."""
    PRIMARY = "primary"
    """The candidate's breaker diverts canary tickets to the primary."""


def diverts(state: BreakerState, now: float) -> bool:
    """Whether the candidate's breaker keeps canary and shadow calls off it (probes aside)."""
    return state.phase(now) is not Phase.CLOSED or state.sustained


class CandidateBreaker:
    """One worker's side of the candidate's breaker; without a breaker gate everything goes through."""

    def __init__(self, gate: BreakerGate | None, rollout_id: Callable[[], str]) -> None:
        self.gate = gate
        self.rollout_id = rollout_id
        self._lock = threading.Lock()
        self._described: str | None = None
        self._watched: str | None = None
        if gate is not None:
            gate.listeners.append(self._on_transition)

    def _state(self, url: str) -> BreakerState | None:
        if self.gate is None:
            return None
        endpoint = endpoint_id(url)
        with self._lock:
            self._watched = endpoint
            fresh = self._described != endpoint
        try:
            if fresh:  # so status lists it as the candidate, and admission never counts it as a primary
                self.gate.store.describe(endpoint, role=CANDIDATE_ROLE)
                with self._lock:
                    self._described = endpoint
            return self.gate.state(endpoint)
        except redis.RedisError as exc:
            log.warning("could not read the candidate's breaker (%s); routing as if closed", exc)
            return None

    def route(self, url: str) -> CanaryRoute:
        """Where a canary ticket for the candidate at `url` goes now."""
        state = self._state(url)
        now = clock.now()
        if state is None or not diverts(state, now):
            return CanaryRoute.CANDIDATE
        if self.gate is not None and state.phase(now) is Phase.HALF_OPEN and state.probe_until <= now:
            try:
                if self.gate.take_probe(endpoint_id(url)):
                    return CanaryRoute.PROBE
            except redis.RedisError as exc:
                log.warning("could not take the candidate's probe (%s); the primary answers", exc)
        return CanaryRoute.PRIMARY

    def allows_shadow(self, url: str) -> bool:
        state = self._state(url)
        return state is None or not diverts(state, clock.now())

    def record(self, client: VllmClient, ok: bool, *, probe: bool = False) -> None:
        """Count a candidate call the executor does not count itself (shadow calls, rescued calls)."""
        if self.gate is None:
            return
        try:
            self.gate.record(client, ok, probe=probe)
        except redis.RedisError as exc:  # the call's answer matters more than its tally
            log.warning("breaker: could not count a call of the candidate %s (%s)", client.base_url, exc)

    def _on_transition(self, endpoint: str, state: BreakerState, transitions: list[str]) -> None:
        with self._lock:
            if endpoint != self._watched or self.gate is None:
                return
        routing = CanaryRoute.PRIMARY if diverts(state, clock.now()) else CanaryRoute.CANDIDATE
        log.warning("candidate %s breaker %s: canary tickets go to the %s", endpoint, transitions, routing)
        try:
            append_event(
                self.gate.store.redis,
                self.gate.store.keys,
                "rollout",
                step="candidate_breaker",
                rollout=self.rollout_id(),
                endpoint=endpoint,
                transition=",".join(transitions),
                routing=routing.value,
            )
        except redis.RedisError as exc:
            log.warning("could not record the candidate's breaker transition (%s)", exc)
