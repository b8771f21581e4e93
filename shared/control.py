"""The control state every process shares: the alarm level, the operator mode, the monitor's
figures (drain rate, free KV cache) and the event stream of transitions.

The monitor writes it; admission, workers, the API and `tidegate status` read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from redis import Redis

from shared import clock
from shared.audit import record_action
from shared.keys import QueueKeys
from shared.policy import AlarmLevel, AlarmPolicy

EVENTS_MAXLEN = 10_000
STALE_AFTER_SECONDS = 5.0
"""A published alarm older than this is not trusted: readers derive the level from depth instead."""


class Mode(StrEnum):
    NORMAL = "normal"
    CRITICAL_ONLY = "critical-only"


@dataclass(frozen=True)
class ControlState:
    level: AlarmLevel
    level_since: float | None
    published_at: float | None
    mode: Mode
    depth: int
    drain_rate: float | None
    kv_free_min: float | None
    desired_workers: int | None
    memory_guard: bool = False
    """The monitor's Redis memory guard is on: non-critical intake is shed."""
    redis_used_memory: int | None = None
    redis_memory_budget: int | None = None

    @property
    def degraded(self) -> bool:
        """Service is degraded from orange up: the one test intake and workers both apply."""
        return self.level >= AlarmLevel.ORANGE

    @property
    def level_is_published(self) -> bool:
        return self.published_at is not None and clock.now() - self.published_at <= STALE_AFTER_SECONDS


def level_for_depth(depth: int, alarms: AlarmPolicy) -> AlarmLevel:
    """The level a depth calls for, without hysteresis (the monitor adds that)."""
    for level in (AlarmLevel.RED, AlarmLevel.ORANGE, AlarmLevel.YELLOW):
        if depth > alarms.threshold(level):
            return level
    return AlarmLevel.GREEN


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    number = _float(value)
    return int(number) if number is not None else None


def read_control_state(
    redis: Redis, keys: QueueKeys, alarms: AlarmPolicy, extra_zcard: str | None = None
) -> tuple[ControlState, int | None]:
    """Everything admission needs in one round trip; also ZCARD of `extra_zcard` when given.

    A level the monitor has not refreshed for STALE_AFTER_SECONDS (it died, or none runs) is replaced
    by the level the current depth calls for, so admission control never depends on a live monitor.
    """
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(keys.alarm)
    pipe.get(keys.mode)
    pipe.hgetall(keys.monitor_state)
    pipe.zcard(keys.pending)
    pipe.zcard(keys.delayed)
    if extra_zcard:
        pipe.zcard(extra_zcard)
    replies = pipe.execute()
    alarm = cast("dict[str, str]", replies[0])
    mode_raw = cast("str | None", replies[1])
    monitor = cast("dict[str, str]", replies[2])
    depth = int(replies[3]) + int(replies[4])
    published_at = _float(alarm.get("updated_at"))
    fresh = published_at is not None and clock.now() - published_at <= STALE_AFTER_SECONDS
    level = (
        AlarmLevel.parse(alarm["level"]) if fresh and alarm.get("level") else level_for_depth(depth, alarms)
    )
    try:
        mode = Mode(mode_raw) if mode_raw else Mode.NORMAL
    except ValueError:
        mode = Mode.NORMAL
    desired = _float(monitor.get("desired_workers"))
    # A dead monitor's last KV figure could shed tickets forever; trust it only while it is fresh.
    monitor_at = _float(monitor.get("updated_at"))
    monitor_fresh = monitor_at is not None and clock.now() - monitor_at <= STALE_AFTER_SECONDS
    state = ControlState(
        level=level,
        # A level derived from depth has no known start; a dead monitor's "since" is not its.
        level_since=_float(alarm.get("since")) if fresh else None,
        published_at=published_at,
        mode=mode,
        depth=depth,
        drain_rate=_float(monitor.get("drain_rate")),
        kv_free_min=_float(monitor.get("kv_free_min")) if monitor_fresh else None,
        desired_workers=int(desired) if desired is not None else None,
        memory_guard=monitor_fresh and monitor.get("memory_guard") == "1",
        redis_used_memory=_int(monitor.get("redis_used_memory")),
        redis_memory_budget=_int(monitor.get("redis_memory_budget")),
    )
    return state, (int(replies[5]) if extra_zcard else None)


def append_event(redis: Any, keys: QueueKeys, kind: str, **fields: str | int | float) -> None:
    """Record an event (alarm transition, mode change, action) in the capped stream.

    `redis` may be a client or a pipeline, so an event can join the state change it records.
    """
    entry: dict[str, str] = {"kind": kind, "at": repr(clock.now())}
    entry.update({k: str(v) for k, v in fields.items()})
    redis.xadd(keys.events, entry, maxlen=EVENTS_MAXLEN, approximate=True)


def read_events(redis: Redis, keys: QueueKeys, count: int = 10) -> list[dict[str, str]]:
    """The latest `count` events, newest first."""
    entries = cast("list[tuple[str, dict[str, str]]]", redis.xrevrange(keys.events, count=count))
    return [{"id": entry_id, **fields} for entry_id, fields in entries]


def set_mode(redis: Redis, keys: QueueKeys, mode: Mode, actor: str = "operator") -> Mode:
    """Set the operator override and record it (event and audit trail); returns the previous mode."""
    raw = cast("str | None", redis.get(keys.mode))
    previous = Mode(raw) if raw in {m.value for m in Mode} else Mode.NORMAL
    pipe = redis.pipeline(transaction=True)
    pipe.set(keys.mode, mode.value)
    append_event(pipe, keys, "mode", previous=previous.value, mode=mode.value, actor=actor)
    record_action(
        pipe, keys, actor=actor, action="mode.set", target=keys.queue, before=previous.value, after=mode.value
    )
    pipe.execute()
    return previous
