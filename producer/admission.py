"""Admission control: one decision function for the Python producer, the CLI and the HTTP API.

A decision reads the shared control state (alarm level, operator mode, free KV cache reported by
workers, drain rate) in at most one Redis round trip, cached for a fraction of a second so the
shed path of a 429 storm costs Redis nothing but the rejected ticket's record.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from redis import Redis

from shared.control import ControlState, Mode, read_control_state
from shared.keys import QueueKeys
from shared.models import TicketRequest
from shared.policy import AlarmLevel, Policy, TypePolicy
from shared.queue import EnqueueOptions

RETRY_AFTER_MIN = 1.0
RETRY_AFTER_MAX = 60.0
RETRY_AFTER_JITTER = 0.2
FALLBACK_ROUTE = "fallback"


@dataclass(frozen=True)
class Decision:
    admitted: bool
    level: AlarmLevel
    mode: Mode
    reason: str = ""
    retry_after: float | None = None
    options: EnqueueOptions = field(default_factory=EnqueueOptions)


def retry_after_seconds(state: ControlState, rng: random.Random) -> float:
    """Depth ÷ recent drain rate, ±20% jitter so 200 branches don't retry in the same second."""
    drain = state.drain_rate or 0.0
    base = state.depth / drain if drain > 0 else RETRY_AFTER_MAX / 2
    jittered = base * rng.uniform(1 - RETRY_AFTER_JITTER, 1 + RETRY_AFTER_JITTER)
    return round(min(max(jittered, RETRY_AFTER_MIN), RETRY_AFTER_MAX), 1)


def decide(
    request_type: str,
    type_policy: TypePolicy,
    policy: Policy,
    state: ControlState,
    *,
    fallback_configured: bool,
    rng: random.Random,
) -> Decision:
    """The rule itself, pure: the same state and request always give the same verdict."""

    def reject(reason: str) -> Decision:
        return Decision(False, state.level, state.mode, reason, retry_after_seconds(state, rng))

    if state.mode is Mode.CRITICAL_ONLY and not type_policy.critical:
        return reject(f"operator mode critical-only admits only {', '.join(policy.critical_types)}")
    if state.level >= AlarmLevel.RED and not type_policy.critical:
        return reject(
            f"queue depth {state.depth} is above the red threshold {policy.alarms.red}; "
            f"only {', '.join(policy.critical_types)} is admitted"
        )
    kv_floor = type_policy.kv_shed_free_below
    if (
        kv_floor is not None
        and not type_policy.critical
        and state.kv_free_min is not None
        and state.kv_free_min < kv_floor
    ):
        return reject(
            f"GPU KV cache nearly full ({state.kv_free_min:.0%} free, below {kv_floor:.0%} for {request_type})"
        )
    degraded = state.level >= AlarmLevel.ORANGE
    if degraded and type_policy.orange_action == "shed":
        return reject(
            f"queue depth {state.depth} is above the orange threshold {policy.alarms.orange}; "
            f"{request_type} is shed until it drains"
        )
    options = EnqueueOptions()
    if degraded:
        options = EnqueueOptions(
            max_tokens_cap=type_policy.degraded_max_tokens,
            route=FALLBACK_ROUTE if fallback_configured and type_policy.route_to_fallback else None,
            defer_seconds=retry_after_seconds(state, rng) if type_policy.orange_action == "defer" else 0.0,
        )
    return Decision(True, state.level, state.mode, options=options)


class AdmissionController:
    """Reads the control state (cached `cache_seconds`) and applies `decide`."""

    def __init__(
        self,
        redis: Redis,
        policy: Policy,
        keys: QueueKeys,
        *,
        fallback_configured: bool = False,
        cache_seconds: float = 0.25,
        rng: random.Random | None = None,
    ) -> None:
        self.redis = redis
        self.policy = policy
        self.keys = keys
        self.fallback_configured = fallback_configured
        self.cache_seconds = cache_seconds
        self.rng = rng or random.Random()
        self._lock = threading.Lock()
        self._cached: tuple[float, ControlState] | None = None

    def state(self) -> ControlState:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.cache_seconds:
                return self._cached[1]
            state, _ = read_control_state(self.redis, self.keys, self.policy.alarms)
            self._cached = (now, state)
            return state

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None

    def decide(self, request: TicketRequest) -> Decision:
        type_policy = self.policy.type_policy(request.type)
        return decide(
            request.type,
            type_policy,
            self.policy,
            self.state(),
            fallback_configured=self.fallback_configured,
            rng=self.rng,
        )

    def retry_after(self) -> float:
        return retry_after_seconds(self.state(), self.rng)
