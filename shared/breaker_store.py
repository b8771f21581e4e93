"""Breaker state in Redis, shared by every worker: count an outcome, decide, commit.

Counting and reading the windows is one script (`breaker_record.lua`); the decision is the pure
`shared.breaker.decide`; the new state is written by `breaker_commit.lua` only if no other worker
wrote in between (a version check), else this one reads again and decides again. So each
transition is written, and its event recorded, once, whichever worker saw it first. The failure
streak and its pause live in the same hash, so every worker claims by one pause and one probe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, cast

from redis import Redis

from shared import clock
from shared.breaker import (
    BUCKETS_PER_WINDOW,
    LADDER,
    BreakerState,
    Phase,
    Window,
    bucket_seconds,
    decide,
    pause_seconds,
    rung,
    take_probe,
)
from shared.control import EVENTS_MAXLEN
from shared.keys import QueueKeys
from shared.policy import BreakerPolicy, QueuePolicy
from shared.scripts import Scripts

COMMIT_ATTEMPTS = 5


@dataclass(frozen=True)
class BreakerView:
    """One endpoint's breaker as status, `/v1/queues` and metrics show it."""

    endpoint: str
    state: BreakerState
    info: dict[str, str]
    now: float
    windows: dict[str, Window] = field(default_factory=dict)
    """Each rung's counts now (instant, sustained, deep), read without counting anything."""

    def as_dict(self) -> dict[str, Any]:
        level = self.state.level(self.now)
        return {
            "endpoint": self.endpoint,
            "role": self.info.get("role", "primary"),
            "level": level.label,
            "level_value": int(level),
            "phase": self.state.phase(self.now).value,
            "retry_after": round(self.state.retry_after(self.now), 1),
            "sustained": self.state.sustained,
            "deep": self.state.deep,
            "model": self.info.get("model", ""),
            "version": self.info.get("model_version", ""),
            "fallback": self.info.get("fallback_status", ""),
            "since": float(self.info["changed_at"]) if self.info.get("changed_at") else None,
            "error_rates": {name: round(w.error_rate, 4) for name, w in self.windows.items()},
            "requests": {name: w.total for name, w in self.windows.items()},
            "failures": self.state.failures,
            "paused_for": round(max(self.state.paused_until - self.now, 0.0), 1),
        }


class BreakerStore:
    def __init__(
        self, redis: Redis, keys: QueueKeys, policy: BreakerPolicy, retry: QueuePolicy | None = None
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.policy = policy
        self.retry = retry or QueuePolicy()
        """Its retry curve paces a failing endpoint's claims (workers pass their policy's)."""
        self.scripts = Scripts.register(redis)

    def _bucket_keys(self, endpoint: str, now: float) -> list[str]:
        keys: list[str] = []
        for name in LADDER:
            current = math.floor(now / bucket_seconds(self.policy, name))
            start = current - BUCKETS_PER_WINDOW + 1
            keys += [self.keys.breaker_bucket(endpoint, name, i) for i in range(start, current + 1)]
        return keys

    def _count(self, endpoint: str, outcome: str, now: float) -> tuple[dict[str, Window], BreakerState]:
        ttls = [max(math.ceil(2 * rung(self.policy, name).window_seconds), 1) for name in LADDER]
        reply = self.scripts.breaker_record(
            keys=[self.keys.breaker(endpoint), *self._bucket_keys(endpoint, now)],
            args=[outcome, BUCKETS_PER_WINDOW, *ttls],
        )
        windows = {name: Window(int(reply[2 * i]), int(reply[2 * i + 1])) for i, name in enumerate(LADDER)}
        flat = reply[6]
        return windows, BreakerState.from_fields(dict(zip(flat[::2], flat[1::2], strict=True)))

    def _commit(self, endpoint: str, read: BreakerState, new: BreakerState, transitions: list[str]) -> bool:
        flat = [item for pair in new.to_fields().items() for item in pair]
        written = self.scripts.breaker_commit(
            keys=[self.keys.breaker(endpoint), self.keys.breakers, self.keys.events],
            args=[
                read.version,
                endpoint,
                repr(clock.now()),
                EVENTS_MAXLEN,
                len(transitions),
                *transitions,
                *flat,
            ],
        )
        return bool(written)

    def record(
        self, endpoint: str, ok: bool | None, *, probe: bool = False, retry_after: float | None = None
    ) -> tuple[BreakerState, list[str]]:
        """Count one outcome (None: count nothing, only re-evaluate); the state and what changed.

        A failure (only transient ones are counted as such) pauses claims for at least
        `retry_after`, vLLM's own ask."""
        outcome = "" if ok is None else ("ok" if ok else "err")
        pause = partial(pause_seconds, retry=self.retry, retry_after=retry_after)
        for _ in range(COMMIT_ATTEMPTS):
            now = clock.now()
            windows, state = self._count(endpoint, outcome, now)
            outcome = ""  # counted once; a lost race only re-reads
            new, transitions = decide(state, windows, self.policy, now, ok=ok, probe=probe, pause=pause)
            if not transitions and new == state:
                return state, []
            if self._commit(endpoint, state, new, transitions):
                return new, transitions
        return self.read(endpoint), []

    def take_probe(self, endpoint: str) -> bool:
        """Whether this caller may send the one probe now (half-open, or failing after its pause),
        and has claimed it."""
        for _ in range(COMMIT_ATTEMPTS):
            state = self.read(endpoint)
            probing = take_probe(state, clock.now())
            if probing is None:
                return False
            if self._commit(endpoint, state, probing, []):
                return True
        return False

    def release_probe(self, endpoint: str) -> None:
        """Give the probe back unsent (nothing was queued to probe with)."""
        for _ in range(COMMIT_ATTEMPTS):
            state = self.read(endpoint)
            if state.probe_until <= 0 or self._commit(endpoint, state, replace(state, probe_until=0.0), []):
                return

    def read(self, endpoint: str) -> BreakerState:
        raw = cast("dict[str, str]", self.redis.hgetall(self.keys.breaker(endpoint)))
        return BreakerState.from_fields(raw)

    def describe(self, endpoint: str, **info: str) -> None:
        """Record what status shows beside the state: role, model, version, fallback pairing."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.breaker(endpoint), mapping=info)
        pipe.sadd(self.keys.breakers, endpoint)
        pipe.execute()

    def views(self) -> list[BreakerView]:
        """Every endpoint's breaker with its windows' counts, in one round trip after the set's."""
        endpoints = sorted(cast("set[str]", self.redis.smembers(self.keys.breakers)))
        now = clock.now()
        pipe = self.redis.pipeline(transaction=False)
        for endpoint in endpoints:
            pipe.hgetall(self.keys.breaker(endpoint))
            for key in self._bucket_keys(endpoint, now):
                pipe.hmget(key, ["ok", "err"])
        replies = pipe.execute()
        step = 1 + len(LADDER) * BUCKETS_PER_WINDOW
        views = []
        for i, endpoint in enumerate(endpoints):
            raw = replies[i * step]
            buckets = replies[i * step + 1 : (i + 1) * step]
            windows = {
                name: _window(buckets[r * BUCKETS_PER_WINDOW : (r + 1) * BUCKETS_PER_WINDOW])
                for r, name in enumerate(LADDER)
            }
            views.append(BreakerView(endpoint, BreakerState.from_fields(raw), raw, now, windows))
        return views


def _window(buckets: list[list[str | None]]) -> Window:
    """One rung's buckets summed, as `breaker_record.lua` sums them."""
    return Window(ok=sum(int(ok or 0) for ok, _ in buckets), errors=sum(int(err or 0) for _, err in buckets))


def refusing(views: list[BreakerView]) -> BreakerView | None:
    """The breaker that makes admission refuse: every primary endpoint open (the soonest to reopen).

    Half-open does not refuse: new tickets queue while the probe decides, and an endpoint no
    worker probes any more cannot keep the door shut.
    """
    primaries = [v for v in views if v.info.get("role", "primary") == "primary"]
    if not primaries or any(v.state.phase(v.now) is not Phase.OPEN for v in primaries):
        return None
    return min(primaries, key=lambda v: v.state.retry_after(v.now))  # the first to take work again
