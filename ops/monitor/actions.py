"""The alarm actions, each run as an rq job so a slow or failing hook never stalls the monitor.

Admission enforces degrade and reject from the published alarm level within one sample, without
waiting for these jobs, and workers cap answers from that level too; the jobs do what lives outside
the queue: record the action in the event stream and call the operator's hooks (the desired worker
count is published by the monitor itself). A hook failure raises, so rq retries the job and finally
keeps it in its failed-job registry.

A job that runs late (retried, or queued behind others) first checks that its level still stands:
a scale-out for a yellow alarm that has already cleared, or an undo for a level raised again since,
is skipped and recorded as such, so a retry never leaves the opposite of the current state behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from redis import Redis
from rq import get_current_job

from ops.monitor.hooks import HookFailed, run_hook
from shared import clock
from shared.config import Settings
from shared.control import append_event
from shared.keys import QueueKeys
from shared.policy import AlarmLevel, HooksPolicy
from shared.redis_conn import connect_from


@dataclass(frozen=True)
class ActionSpec:
    """What entering (`forward`) or clearing (undo) one level does."""

    name: str
    level: AlarmLevel
    hook: str
    """Which policy hook it calls: scale_hook or notify_hook."""
    forward_event: str
    undo_event: str


ACTIONS: dict[AlarmLevel, ActionSpec] = {
    AlarmLevel.YELLOW: ActionSpec("scale_out", AlarmLevel.YELLOW, "scale_hook", "scale_out", "scale_in"),
    AlarmLevel.ORANGE: ActionSpec("degrade", AlarmLevel.ORANGE, "notify_hook", "degrade", "recover"),
    AlarmLevel.RED: ActionSpec("reject_mode", AlarmLevel.RED, "notify_hook", "reject", "recover"),
}


def queue_connection() -> Redis:
    """The queue's Redis as seen from an rq job (on a Cluster not rq's own)."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("the monitor's actions run as rq jobs; enqueue them with ops.monitor.dispatch")
    settings = Settings()
    # On a Cluster rq's jobs live on a Redis of their own; the queue is reached through the settings.
    return connect_from(settings) if settings.redis_cluster else job.connection


def _published_level(conn: Redis, keys: QueueKeys) -> AlarmLevel | None:
    raw = cast("bytes | str | None", conn.hget(keys.alarm, "level"))
    if raw is None:
        return None
    return AlarmLevel.parse(raw.decode() if isinstance(raw, bytes) else raw)


def _record(client: Any, keys: QueueKeys, spec: ActionSpec, state: str, detail: str = "") -> None:
    append_event(client, keys, "action", action=spec.name, level=spec.level.label, state=state, detail=detail)


def _call_hook(
    spec: ActionSpec, event: str, hooks: HooksPolicy, payload: dict[str, str | int | float]
) -> str:
    hook = getattr(hooks, spec.hook)
    if not hook:
        return f"no {spec.hook} configured"
    return run_hook(spec.hook, hook, {"event": event, **payload}, hooks.timeout_seconds)


def _run(queue_name: str, spec: ActionSpec, undo: bool, desired_workers: int, hooks: dict[str, Any]) -> str:
    conn = queue_connection()
    keys = QueueKeys(queue_name)
    policy = HooksPolicy.model_validate(hooks)
    current = _published_level(conn, keys)
    if current is not None and (current >= spec.level if undo else current < spec.level):
        detail = f"skipped: the alarm is {current.label} now"
        _record(conn, keys, spec, "undone" if undo else "done", detail)
        return detail
    if not undo:
        _record(conn, keys, spec, "started")
    payload: dict[str, str | int | float] = {
        "queue": queue_name,
        "level": spec.level.label,
        "desired_workers": desired_workers,
        "at": clock.now(),
    }
    try:
        detail = _call_hook(spec, spec.undo_event if undo else spec.forward_event, policy, payload)
    except HookFailed as exc:
        _record(conn, keys, spec, "failed", str(exc))
        raise
    _record(conn, keys, spec, "undone" if undo else "done", detail)
    return detail


def scale_out(queue_name: str, desired_workers: int, hooks: dict[str, Any]) -> str:
    """Yellow: ask for `desired_workers` workers (stored in Redis, then the scale hook)."""
    return _run(queue_name, ACTIONS[AlarmLevel.YELLOW], False, desired_workers, hooks)


def degrade(queue_name: str, desired_workers: int, hooks: dict[str, Any]) -> str:
    """Orange: notify (intake and workers degrade from the published level itself)."""
    return _run(queue_name, ACTIONS[AlarmLevel.ORANGE], False, desired_workers, hooks)


def reject_mode(queue_name: str, desired_workers: int, hooks: dict[str, Any]) -> str:
    """Red: notify (admission rejects non-critical types from the published level itself)."""
    return _run(queue_name, ACTIONS[AlarmLevel.RED], False, desired_workers, hooks)


def restore(queue_name: str, level: str, desired_workers: int, hooks: dict[str, Any]) -> str:
    """A level cleared: undo its action (scale in, stop degrading, stop rejecting) and record it."""
    return _run(queue_name, ACTIONS[AlarmLevel.parse(level)], True, desired_workers, hooks)


FORWARD_JOBS = {AlarmLevel.YELLOW: scale_out, AlarmLevel.ORANGE: degrade, AlarmLevel.RED: reject_mode}


def page_breaker(queue_name: str, endpoint: str, deep_since: float, hooks: dict[str, Any]) -> str:
    """Deep breaker level: page a human through the notify hook, once per episode."""
    conn = queue_connection()
    keys = QueueKeys(queue_name)
    policy = HooksPolicy.model_validate(hooks)
    payload: dict[str, str | int | float] = {
        "event": "breaker_deep",
        "queue": queue_name,
        "level": "deep",
        "endpoint": endpoint,
        "since": deep_since,
        "at": clock.now(),
    }
    if not policy.notify_hook:
        detail = "no notify_hook configured"
    else:
        try:
            detail = run_hook("notify_hook", policy.notify_hook, payload, policy.timeout_seconds)
        except HookFailed as exc:
            append_event(conn, keys, "page", endpoint=endpoint, state="failed", detail=str(exc))
            raise
    append_event(conn, keys, "page", endpoint=endpoint, state="done", detail=detail)
    return detail
