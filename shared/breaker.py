"""The circuit-breaker ladder of one inference endpoint, as pure functions over its state.

No library does windowed error-rate breakers with levels (the common ones count consecutive
failures), so this is ours. Redis holds the counters and the state (shared/breaker_store.py); this
module only decides. Three rungs, each over its own window, none tripping below `min_requests`:
- instant: error rate above its threshold opens the circuit for `open_seconds`: nothing is sent
  and new tickets are refused; then it is half-open: one probe at a time, a success closes it, a
  failure opens it again;
- sustained: tickets go to a version-matched fallback while it holds;
- deep: a human is paged, once per episode.
A rung clears when its window is back under its threshold, or holds too few requests to judge.
Beside the ladder, the endpoint's failure streak is its one health state for claiming: a failed
call (5xx, timeout, refused, OOM) pauses claims on the retry backoff curve, then one probe for all
workers at a time until a call succeeds. It never refuses admission nor changes a level or phase.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum

from shared import backoff
from shared.policy import BreakerLevelPolicy, BreakerPolicy, QueuePolicy

LADDER = ("instant", "sustained", "deep")
BUCKETS_PER_WINDOW = 10
"""Each window is counted in this many buckets, so it slides in tenths of itself."""
PROBE_SECONDS = 30.0
"""How long one half-open probe may be out before another worker may send the next."""


class BreakerLevel(IntEnum):
    CLOSED = 0
    INSTANT = 1
    SUSTAINED = 2
    DEEP = 3

    @property
    def label(self) -> str:
        return self.name.lower()


class Phase(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Window:
    ok: int = 0
    errors: int = 0

    @property
    def total(self) -> int:
        return self.ok + self.errors

    @property
    def error_rate(self) -> float:
        return self.errors / self.total if self.total else 0.0


@dataclass(frozen=True)
class BreakerState:
    open_until: float = 0.0
    """0 while closed; else when the open circuit turns half-open."""
    probe_until: float = 0.0
    """While half-open: a probe is out until then."""
    sustained: bool = False
    deep: bool = False
    deep_since: float = 0.0
    """When the deep rung last switched on: names the episode its one page belongs to."""
    failures: int = 0
    """Failed calls in a row since the last success; failures within a pause are one outage."""
    paused_until: float = 0.0
    """After a failure no claims until then; afterwards one probe at a time until a success."""
    version: int = 0

    def phase(self, now: float) -> Phase:
        if self.open_until <= 0:
            return Phase.CLOSED
        return Phase.OPEN if now < self.open_until else Phase.HALF_OPEN

    def level(self, now: float) -> BreakerLevel:
        if self.deep:
            return BreakerLevel.DEEP
        if self.sustained:
            return BreakerLevel.SUSTAINED
        return BreakerLevel.CLOSED if self.phase(now) is Phase.CLOSED else BreakerLevel.INSTANT

    def probing(self, now: float) -> bool:
        """Whether calls go one probe at a time: half-open, or failing once its pause ran out."""
        phase = self.phase(now)
        return phase is Phase.HALF_OPEN or (
            phase is Phase.CLOSED and self.failures > 0 and now >= self.paused_until
        )

    def retry_after(self, now: float) -> float:
        """Seconds until the circuit may take work again (at least 1 while not closed)."""
        return 0.0 if self.phase(now) is Phase.CLOSED else max(self.open_until - now, 1.0)

    def to_fields(self) -> dict[str, str]:
        return {
            "open_until": repr(self.open_until),
            "probe_until": repr(self.probe_until),
            "sustained": "1" if self.sustained else "0",
            "deep": "1" if self.deep else "0",
            "deep_since": repr(self.deep_since),
            "failures": str(self.failures),
            "paused_until": repr(self.paused_until),
        }

    @classmethod
    def from_fields(cls, raw: dict[str, str]) -> BreakerState:
        return cls(
            open_until=float(raw.get("open_until") or 0),
            probe_until=float(raw.get("probe_until") or 0),
            sustained=raw.get("sustained") == "1",
            deep=raw.get("deep") == "1",
            deep_since=float(raw.get("deep_since") or 0),
            failures=int(raw.get("failures") or 0),
            paused_until=float(raw.get("paused_until") or 0),
            version=int(raw.get("version") or 0),
        )


def pause_seconds(failures: int, retry: QueuePolicy, retry_after: float | None = None) -> float:
    """The claim pause after the n-th failure in a row: the ticket retry curve with full jitter (a
    zero base still pauses), at least vLLM's Retry-After, never past the cap."""
    base = max(retry.retry_backoff_seconds, 0.01)
    cap = max(retry.retry_backoff_max_seconds, base)
    return max(backoff.full_jitter(failures, base, cap), min(retry_after or 0.0, cap))


def rung(policy: BreakerPolicy, name: str) -> BreakerLevelPolicy:
    return {"instant": policy.instant, "sustained": policy.sustained, "deep": policy.deep}[name]


def bucket_seconds(policy: BreakerPolicy, name: str) -> float:
    return rung(policy, name).window_seconds / BUCKETS_PER_WINDOW


def _tripped(window: Window, level: BreakerLevelPolicy, min_requests: int) -> bool:
    """Above the threshold with enough requests to tell. A rung whose window has emptied (its
    traffic went to the fallback) clears, so the primary gets traffic again and is judged anew."""
    return window.total >= min_requests and window.error_rate > level.error_rate


def decide(
    state: BreakerState,
    windows: dict[str, Window],
    policy: BreakerPolicy,
    now: float,
    *,
    ok: bool | None = None,
    probe: bool = False,
    pause: Callable[[int], float] | None = None,
) -> tuple[BreakerState, list[str]]:
    """The next state and its transitions (`instant:opened`, `deep:on`, …) after new counts.

    `ok` is the outcome of the call just counted (None: nothing counted), `probe` whether it was
    the probe. A failure outside a running pause adds one to the streak and pauses for
    `pause(failures)` seconds (the caller draws the jitter, so this stays pure).
    """
    transitions: list[str] = []
    open_until = state.open_until
    returned = probe and ok is not None
    if returned and state.phase(now) is Phase.HALF_OPEN:
        if ok:
            open_until = 0.0
            transitions.append("instant:closed")
        else:
            open_until = now + policy.instant.open_seconds
            transitions.append("instant:reopened")
    elif state.phase(now) is Phase.CLOSED and _tripped(
        windows["instant"], policy.instant, policy.min_requests
    ):
        open_until = now + policy.instant.open_seconds
        transitions.append("instant:opened")
    failures, paused_until = state.failures, state.paused_until
    if ok:
        failures, paused_until = 0, 0.0
    elif ok is False and now >= paused_until:  # a crash fails every call in flight: one outage
        failures += 1
        paused_until = now + (pause(failures) if pause is not None else 0.0)
    flags = {"sustained": state.sustained, "deep": state.deep}
    for name in ("sustained", "deep"):
        verdict = _tripped(windows[name], rung(policy, name), policy.min_requests)
        if verdict != flags[name]:
            flags[name] = verdict
            transitions.append(f"{name}:{'on' if verdict else 'off'}")
    deep_since = now if flags["deep"] and not state.deep else state.deep_since
    new = replace(
        state,
        open_until=open_until,
        probe_until=0.0 if returned else state.probe_until,
        sustained=flags["sustained"],
        deep=flags["deep"],
        deep_since=deep_since,
        failures=failures,
        paused_until=paused_until,
    )
    return new, transitions


def take_probe(state: BreakerState, now: float) -> BreakerState | None:
    """The state with a probe out, when this caller may send one now; else None."""
    if not state.probing(now) or state.probe_until > now:
        return None
    return replace(state, probe_until=now + PROBE_SECONDS)


def model_version(served_name: str) -> str | None:
    """The version in a served model name: the part after the last `:` (`qwen-72b:2026.11`)."""
    _, colon, version = served_name.rpartition(":")
    return version if colon and version else None


def endpoint_id(url: str) -> str:
    """The name an endpoint's breaker goes by: its URL without scheme or trailing slash."""
    return url.split("://", 1)[-1].rstrip("/")
