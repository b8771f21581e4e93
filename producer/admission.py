"""Admission control: one decision function for the Python producer, the CLI and the HTTP API.

A decision reads the shared control state (alarm level, operator mode, free KV cache reported by
workers, drain rate) in at most one Redis round trip, cached for a fraction of a second so the
shed path of a 429 storm costs Redis nothing but the rejected ticket's record.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field, replace

from redis import Redis

from shared import clock
from shared.breaker_store import BreakerStore, BreakerView, refusing
from shared.control import ControlState, Mode, read_control_state
from shared.keys import QueueKeys
from shared.models import TicketRequest
from shared.policy import AlarmLevel, Policy, TypePolicy
from shared.queue import EnqueueOptions
from shared.shed import ShedCode

RETRY_AFTER_MIN = 1.0
RETRY_AFTER_MAX = 60.0
RETRY_AFTER_JITTER = 0.2
FALLBACK_ROUTE = "fallback"


@dataclass(frozen=True)
class Decision:
    """The verdict for one request: admitted with its degrade options, or shed with a code.

    `retry_after` is filled in either way: the enqueue script may still refuse an admitted ticket at
    its type's cap, and that answer needs the same estimate.
    """

    level: AlarmLevel
    mode: Mode
    retry_after: float
    code: ShedCode | None = None
    options: EnqueueOptions = field(default_factory=EnqueueOptions)

    @property
    def admitted(self) -> bool:
        return self.code is None

    @property
    def enqueue_options(self) -> EnqueueOptions:
        """What the enqueue script needs of this verdict: the shed code and Retry-After, or the
        degrade options."""
        return replace(self.options, shed=self.code, retry_after=self.retry_after)


def retry_after_seconds(state: ControlState, rng: random.Random) -> float:
    """Depth ÷ recent drain rate, ±20% jitter so 200 branches don't retry in the same second."""
    drain = state.drain_rate or 0.0
    base = state.depth / drain if drain > 0 else RETRY_AFTER_MAX / 2
    jittered = base * rng.uniform(1 - RETRY_AFTER_JITTER, 1 + RETRY_AFTER_JITTER)
    return round(min(max(jittered, RETRY_AFTER_MIN), RETRY_AFTER_MAX), 1)


def shed_rule(type_policy: TypePolicy, state: ControlState) -> ShedCode | None:
    """The first admission rule that refuses a ticket of this type now, or None. Critical types
    pass every rule here; only their own cap (in the enqueue script) can refuse them."""
    if type_policy.critical:
        return None
    if state.memory_guard:
        return ShedCode.REDIS_MEMORY
    if state.mode is Mode.CRITICAL_ONLY:
        return ShedCode.CRITICAL_ONLY
    if state.level >= AlarmLevel.RED:
        return ShedCode.QUEUE_RED
    floor = type_policy.kv_shed_free_below
    if floor is not None and state.kv_free_min is not None and state.kv_free_min < floor:
        return ShedCode.KV_CACHE_FULL
    if state.degraded and type_policy.orange_action == "shed":
        return ShedCode.QUEUE_ORANGE
    return None


def decide(
    type_policy: TypePolicy,
    state: ControlState,
    *,
    fallback_configured: bool,
    rng: random.Random,
) -> Decision:
    """The rule itself, pure: the same state and request always give the same verdict."""
    retry_after = retry_after_seconds(state, rng)
    code = shed_rule(type_policy, state)
    if code is not None:
        return Decision(state.level, state.mode, retry_after, code)
    options = EnqueueOptions()
    if state.degraded:
        options = EnqueueOptions(
            route=FALLBACK_ROUTE if fallback_configured and type_policy.route_to_fallback else None,
            defer_seconds=retry_after if type_policy.orange_action == "defer" else 0.0,
        )
    return Decision(state.level, state.mode, retry_after, options=options)


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
        self.breakers = BreakerStore(redis, keys, policy.breaker)
        self._circuit: tuple[float, BreakerView | None] | None = None
        self._capped: dict[tuple[str, str], float] = {}
        """(type, branch) → when the enqueue script last refused that branch at the type's cap."""

    def state(self) -> ControlState:
        # The read happens outside the lock: on a stalled Redis a lock held across it would queue
        # every concurrent submit behind one read timeout after another.
        with self._lock:
            cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < self.cache_seconds:
            return cached[1]
        read_at = time.monotonic()
        state, _ = read_control_state(self.redis, self.keys, self.policy.alarms)
        with self._lock:
            self._cached = (read_at, state)
        return state

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None
            self._circuit = None
            self._capped.clear()

    def saw_cap(self, ticket_type: str, branch_id: str) -> None:
        """The enqueue script refused a ticket this controller had admitted, at its type's cap: for
        `cache_seconds` the branch's tickets of that type are refused here the same way (the cap as
        last seen), as the alarm level is refused from its cached reading."""
        with self._lock:
            self._capped[(ticket_type, branch_id)] = clock.monotonic()

    def _cap_seen(self, request: TicketRequest) -> bool:
        with self._lock:
            seen = self._capped.get((request.type, request.branch_id))
        return seen is not None and clock.monotonic() - seen < self.cache_seconds

    def open_circuit(self) -> BreakerView | None:
        """The open breaker that refuses new tickets (every primary endpoint open), cached."""
        with self._lock:
            cached = self._circuit
        if cached is not None and time.monotonic() - cached[0] < self.cache_seconds:
            return cached[1]
        read_at = time.monotonic()
        view = refusing(self.breakers.views())
        with self._lock:
            self._circuit = (read_at, view)
        return view

    @property
    def red_line(self) -> int:
        """Tickets queued beside which other work is refused while the queue is busy: halfway from
        orange to red, so the loans that pass it keep the smoothed depth under red too (a line a clear
        margin under red held the depth at the threshold, and loans on top tipped it over and back)."""
        alarms = self.policy.alarms
        return max((alarms.orange + alarms.red) // 2, alarms.orange + 1)

    def decide(self, request: TicketRequest) -> Decision:
        return self._verdict(request, self.open_circuit(), self.state())

    def decide_cached(self, request: TicketRequest) -> Decision | None:
        """The verdict from the cached state alone, or None when a cache is stale: an event loop
        answers from this without touching Redis, and calls `decide` off the loop otherwise."""
        now = time.monotonic()
        with self._lock:
            state, circuit = self._cached, self._circuit
        if state is None or circuit is None:
            return None
        if now - state[0] >= self.cache_seconds or now - circuit[0] >= self.cache_seconds:
            return None
        return self._verdict(request, circuit[1], state[1])

    def _verdict(self, request: TicketRequest, circuit: BreakerView | None, state: ControlState) -> Decision:
        if circuit is not None:  # the endpoint is down for every type: critical ones too
            return Decision(
                state.level, state.mode, circuit.state.retry_after(circuit.now), ShedCode.CIRCUIT_OPEN
            )
        decision = decide(
            self.policy.type_policy(request.type),
            state,
            fallback_configured=self.fallback_configured,
            rng=self.rng,
        )
        if decision.admitted and self._cap_seen(request):
            return replace(decision, code=ShedCode.TYPE_CAP, options=EnqueueOptions())
        if decision.admitted and state.level >= AlarmLevel.YELLOW:
            # A busy queue is held below red ticket by ticket (the enqueue script's red line), so
            # the level, smoothed from its depth, holds instead of cycling red and orange.
            return replace(decision, options=replace(decision.options, red_line=self.red_line))
        return decision
