"""A queue's rollout in Redis: start, pause, resume, advance, roll back, each one atomic with its event.

Every step is an optimistic transaction (WATCH the rollout hash, check the status it expects,
MULTI, write the new state, its `rollout` event and its audit entry, EXEC), so an operator's `pause` racing the
monitor's `advance` leaves exactly one of them applied, and the event stream records only steps
that happened. The caller may add its own writes to the same transaction (the monitor adds the
notify job of a rollback).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import Any

import redis

from shared import clock
from shared.audit import record_action
from shared.control import append_event
from shared.keys import QueueKeys
from shared.rollout import ACTIVE, RolloutState, RolloutStatus

TRANSACTION_TRIES = 5


class RolloutError(Exception):
    """A step the rollout's current status does not allow; the message says why."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_rollout(client: Any, keys: QueueKeys) -> RolloutState | None:
    """The queue's rollout (any status), or None when none was ever started."""
    raw = client.hgetall(keys.rollout)
    return RolloutState.from_redis({_text(k): _text(v) for k, v in raw.items()})


class RolloutStore:
    """The steps of one queue's rollout. `client` may decode replies or not (rq's client does not)."""

    def __init__(self, client: Any, keys: QueueKeys) -> None:
        self.redis = client
        self.keys = keys

    def read(self) -> RolloutState | None:
        return read_rollout(self.redis, self.keys)

    def start(
        self,
        *,
        candidate_url: str,
        version: str,
        interval_seconds: float,
        shadow_fraction: float,
        actor: str,
    ) -> RolloutState:
        """Begin wave 0; refused while another rollout is running or paused."""
        now = clock.now()
        new = RolloutState(
            id=uuid.uuid4().hex[:12],
            candidate_url=candidate_url,
            version=version,
            interval_seconds=interval_seconds,
            shadow_fraction=shadow_fraction,
            status=RolloutStatus.RUNNING,
            wave=0,
            started_at=now,
            wave_started_at=now,
            actor=actor,
        )

        def check(current: RolloutState | None) -> RolloutState:
            if current is not None and current.active:
                raise RolloutError(
                    f"rollout {current.id} of version {current.version} is {current.status.value}; "
                    "roll it back (or let it complete) before starting another"
                )
            return new

        fields: dict[str, str | int | float] = {
            "candidate": candidate_url,
            "version": version,
            "interval_seconds": interval_seconds,
            "shadow": shadow_fraction,
        }
        return self._step("start", None, check, actor, fields)

    def pause(self, actor: str) -> RolloutState:
        return self._step("pause", {RolloutStatus.RUNNING}, lambda s: _some(s).paused(clock.now()), actor)

    def resume(self, actor: str) -> RolloutState:
        return self._step("resume", {RolloutStatus.PAUSED}, lambda s: _some(s).resumed(clock.now()), actor)

    def rollback(
        self,
        actor: str,
        reason: str,
        *,
        expected_wave: int | None = None,
        also: Callable[[Any], None] | None = None,
        figures: dict[str, str | int | float] | None = None,
    ) -> RolloutState:
        """Send every branch back to the primary; `expected_wave` guards a judgement made earlier."""

        def change(current: RolloutState | None) -> RolloutState:
            state = _some(current)
            if expected_wave is not None and state.wave != expected_wave:
                raise RolloutError(
                    f"the rollout moved to wave {state.wave} since wave {expected_wave} was judged"
                )
            return state.rolled_back(clock.now(), reason)

        fields = {"reason": reason, **(figures or {})}
        return self._step("rollback", ACTIVE, change, actor, fields, also)

    def advance(
        self, expected_wave: int, actor: str, figures: dict[str, str | int | float] | None = None
    ) -> RolloutState:
        """Start the next wave (or complete the rollout after the last one)."""

        def change(current: RolloutState | None) -> RolloutState:
            state = _some(current)
            if state.wave != expected_wave:
                raise RolloutError(
                    f"the rollout moved to wave {state.wave} since wave {expected_wave} was judged"
                )
            return state.advanced(clock.now())

        return self._step("advance", {RolloutStatus.RUNNING}, change, actor, figures or {})

    def note(self, step: str, **fields: str | int | float) -> None:
        """Record a step that changes no state (a wave held for samples) in the event stream."""
        state = self.read()
        append_event(self.redis, self.keys, "rollout", step=step, rollout=state.id if state else "", **fields)

    def _step(
        self,
        step: str,
        allowed: Collection[RolloutStatus] | None,
        change: Callable[[RolloutState | None], RolloutState],
        actor: str,
        fields: dict[str, str | int | float] | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> RolloutState:
        for _ in range(TRANSACTION_TRIES):
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.keys.rollout)
                    current = read_rollout(pipe, self.keys)
                    if allowed is not None and (current is None or current.status not in allowed):
                        raise RolloutError(_refusal(step, current, allowed))
                    new = change(current)
                    pipe.multi()
                    pipe.delete(self.keys.rollout)
                    pipe.hset(self.keys.rollout, mapping=new.to_redis())
                    event = {"rollout": new.id, "status": new.status.value, "wave": new.wave, "actor": actor}
                    append_event(pipe, self.keys, "rollout", step=step, **event, **(fields or {}))
                    record_action(
                        pipe,
                        self.keys,
                        actor=actor,
                        action=f"rollout.{step}",
                        target=new.id,
                        before=_audited(current),
                        after=_audited(new),
                    )
                    if also is not None:
                        also(pipe)
                    pipe.execute()
                    return new
                except redis.WatchError:
                    continue
        raise RolloutError(f"rollout {step}: the state kept changing under {TRANSACTION_TRIES} tries")


def _audited(state: RolloutState | None) -> dict[str, object] | None:
    """What the audit trail keeps of a rollout: where it stood, not its timings."""
    if state is None:
        return None
    return {"status": state.status.value, "wave": state.wave, "version": state.version}


def _some(state: RolloutState | None) -> RolloutState:
    if state is None:
        raise RolloutError("no rollout was started on this queue")
    return state


def _refusal(step: str, current: RolloutState | None, allowed: Collection[RolloutStatus]) -> str:
    if current is None:
        return f"cannot {step}: no rollout was started on this queue"
    wanted = " or ".join(sorted(s.value for s in allowed))
    return f"cannot {step}: rollout {current.id} is {current.status.value}, not {wanted}"
