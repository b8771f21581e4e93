"""The monitor's loop: sample every interval, and if this monitor acts, publish and dispatch.

Every sample the acting monitor writes the alarm hash (level, since, depth, updated_at) and its
figures (`monitor_state`), so admission always reads a fresh level. A transition, its event and its
action job are written in one transaction that also checks this monitor still holds the lock, so a
monitor that lost the lock mid-sample cannot record anything. Actions run in rq, never here: the
loop only writes to Redis and goes on.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis import Redis
from rq import Queue

from ops.monitor.dispatch import JobOptions, action_jobs, page_job
from ops.monitor.hysteresis import AlarmTracker, Transition
from ops.monitor.leader import Leadership, new_monitor_id
from ops.monitor.memory_guard import MemoryGuard, MemoryReading, read_memory
from ops.monitor.outbox import OutboxDrainer
from ops.monitor.rollout_controller import RolloutController
from ops.monitor.sampler import Sample, Sampler
from ops.monitor.scaling import ScalingConfig, desired_workers
from shared import clock
from shared.breaker_store import BreakerStore
from shared.control import append_event
from shared.depth_history import append_depth
from shared.policy import AlarmLevel, Policy
from shared.queue import TicketQueue
from shared.redis_conn import is_cluster

PAGE_CLAIM_SECONDS = 7 * 86_400
"""How long the claim on one deep episode's page is kept (an episode is named by its start)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MonitorConfig:
    interval_seconds: float = 1.0
    lock_ttl_seconds: float = 5.0
    """A dead acting monitor is replaced within this long."""
    rate_window_seconds: float = 30.0
    outbox_batch: int = 500
    reap: bool = True
    """Sweep expired TTLs and dead leases too, so tickets expire even while no worker runs."""
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    jobs: JobOptions = field(default_factory=JobOptions)


@dataclass(frozen=True)
class TickResult:
    at: float
    acting: bool
    level: AlarmLevel | None
    sample: Sample | None = None
    desired_workers: int | None = None
    transitions: list[Transition] = field(default_factory=list)
    callbacks_handed: int = 0
    error: str | None = None
    memory: MemoryReading | None = None
    memory_guard: bool = False

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "at": self.at,
            "acting": self.acting,
            "level": self.level.label if self.level is not None else None,
            "desired_workers": self.desired_workers,
            "transitions": [
                {"from": t.previous.label, "to": t.level.label, "depth": t.depth, "at": t.at}
                for t in self.transitions
            ],
            "callbacks_handed": self.callbacks_handed,
            "error": self.error,
            "memory_guard": self.memory_guard,
        }
        if self.memory is not None:
            doc.update(redis_used_memory=self.memory.used_bytes, redis_memory_budget=self.memory.budget_bytes)
        if self.sample is not None:
            doc.update(
                depth=self.sample.depth,
                depth_by_type=self.sample.stats.depth_by_type,
                inflight=self.sample.stats.inflight,
                oldest_wait_seconds=self.sample.stats.oldest_age_by_type,
                drain_rate=self.sample.drain_rate,
                arrival_rate=self.sample.arrival_rate,
                workers_alive=self.sample.workers_alive,
                kv_free_min=self.sample.kv_free_min,
            )
        return doc


class NotActing(Exception):
    """The lock moved to another monitor between renewing it and publishing."""


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else (None if value is None else str(value))


class Monitor:
    """One monitor of one queue; several may run, the lock holder acts."""

    def __init__(
        self,
        client: Redis,
        rq_conn: Redis,
        policy: Policy,
        queue_name: str = "default",
        config: MonitorConfig | None = None,
        monitor_id: str | None = None,
    ) -> None:
        self.redis = client
        self.rq_conn = rq_conn
        self.policy = policy
        self.config = config or MonitorConfig()
        self.monitor_id = monitor_id or new_monitor_id()
        self.queue = TicketQueue(client, policy, queue_name)
        self.keys = self.queue.keys
        self.sampler = Sampler(self.queue, self.config.rate_window_seconds)
        self.leadership = Leadership(client, self.keys, self.monitor_id, self.config.lock_ttl_seconds)
        self.actions_queue = Queue(self.config.jobs.actions_queue, connection=rq_conn)
        self.rq_apart = is_cluster(client)
        """rq's jobs live on a Redis of their own (the queue's is a Cluster, where rq cannot run)."""
        self.outbox = OutboxDrainer(rq_conn, queue_name, self.config.jobs, client if self.rq_apart else None)
        self.breakers = BreakerStore(client, self.keys, policy.breaker)
        self.tracker: AlarmTracker | None = None
        """The alarm state while acting; rebuilt from what Redis holds on taking over."""
        self.memory_guard = MemoryGuard(policy.memory)
        self.rollout = RolloutController(client, rq_conn, policy, self.keys, self.config.jobs)

    @property
    def queue_name(self) -> str:
        return self.keys.queue

    # ---- one sample ---------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> TickResult:
        """Sample once; when acting, publish the level and figures and dispatch actions."""
        at = clock.now() if now is None else now
        try:
            acting = self.leadership.refresh()
            if not acting:
                self.tracker = None
                return self._standby(at)
            if self.config.reap:
                self.queue.reap(self.monitor_id, self.config.interval_seconds)
            return self._act(at)
        except redis.RedisError as exc:
            self.tracker = None  # what was published is unknown; reload it next time
            log.warning("monitor %s: Redis error, will retry: %s", self.monitor_id, exc)
            return TickResult(at, self.leadership.acting, None, error=f"Redis error: {exc}")

    def _standby(self, at: float) -> TickResult:
        sample = self.sampler.sample(at)  # keeps the rate windows warm for a takeover
        raw = _text(self.redis.hget(self.keys.alarm, "level"))
        level = AlarmLevel.parse(raw) if raw else None
        return TickResult(at, False, level, sample, self._desired(sample))

    def _act(self, at: float) -> TickResult:
        sample = self.sampler.sample(at)
        desired = self._desired(sample)
        if self.tracker is None:  # taking over: carry on with the guard as the last monitor left it
            self.memory_guard.active = _text(self.redis.hget(self.keys.monitor_state, "memory_guard")) == "1"
        tracker = copy.deepcopy(self.tracker) if self.tracker is not None else self._tracker_from_redis()
        transitions = tracker.observe(sample.depth, at)
        memory = read_memory(self.redis, self.policy.memory)
        guard_was = self.memory_guard.active
        guard = self.memory_guard.observe(memory)
        try:
            self._publish(sample, desired, tracker, transitions, at, memory, guard_was)
        except (NotActing, redis.WatchError):
            log.warning("monitor %s: lock moved before publishing; standing by", self.monitor_id)
            self.leadership.acting = False
            self.tracker = None
            return TickResult(at, False, None, sample, desired, error="lost the lock before publishing")
        self.tracker = tracker
        for t in transitions:
            log.warning(
                "alarm %s -> %s at depth %d (queue %s)",
                t.previous.label,
                t.level.label,
                t.depth,
                self.queue_name,
            )
        if guard != guard_was:
            log.warning(
                "memory guard %s: Redis uses %d of %s bytes",
                "on" if guard else "off",
                memory.used_bytes,
                memory.budget_bytes,
            )
        self._page_deep_breakers()
        handed = self.outbox.drain(self.config.outbox_batch)
        self.rollout.tick(at)
        return TickResult(
            at, True, tracker.level, sample, desired, transitions, handed, memory=memory, memory_guard=guard
        )

    def _page_deep_breakers(self) -> None:
        """One page per deep episode of an endpoint's breaker, whichever monitor sees it first."""
        for view in self.breakers.views():
            if not view.state.deep or view.state.deep_since <= 0:
                continue
            claim = self.keys.breaker_paged(view.endpoint, view.state.deep_since)
            if not self.redis.set(claim, self.monitor_id, nx=True, ex=PAGE_CLAIM_SECONDS):
                continue
            log.error("breaker %s is at its deep level: paging", view.endpoint)
            self.actions_queue.enqueue_many(
                [
                    page_job(
                        self.queue_name,
                        view.endpoint,
                        view.state.deep_since,
                        self.policy.hooks,
                        self.config.jobs,
                    )
                ]
            )

    def _desired(self, sample: Sample) -> int:
        return desired_workers(
            sample.depth, sample.drain_rate, sample.arrival_rate, sample.workers_alive, self.config.scaling
        )

    def _tracker_from_redis(self) -> AlarmTracker:
        raw = cast("dict[str, str]", self.redis.hgetall(self.keys.alarm))
        level = AlarmLevel.parse(raw["level"]) if raw.get("level") else AlarmLevel.GREEN
        since = float(raw["since"]) if raw.get("since") else None
        return AlarmTracker(self.policy.alarms, level, since)

    def _publish(
        self,
        sample: Sample,
        desired: int,
        tracker: AlarmTracker,
        transitions: list[Transition],
        at: float,
        memory: MemoryReading,
        guard_was: bool,
    ) -> None:
        alarm = {
            "level": tracker.level.label,
            "since": repr(tracker.since),
            "depth": sample.depth,
            "updated_at": repr(at),
        }
        kv_free = sample.kv_free_min
        figures = {
            "drain_rate": round(sample.drain_rate, 4),
            "service_rate": round(sample.service_rate, 4),
            "service_peak": round(sample.service_peak, 4),
            "free_slots": sample.free_slots,
            "arrival_rate": round(sample.arrival_rate, 4),
            **{f"arrival_rate:{name}": round(rate, 4) for name, rate in sample.arrival_rate_by_type.items()},
            "desired_workers": desired,
            "kv_free_min": "" if kv_free is None else round(kv_free, 4),
            "workers_alive": sample.workers_alive,
            "acting_monitor": self.monitor_id,
            "redis_used_memory": memory.used_bytes,
            "redis_memory_budget": memory.budget_bytes or "",
            "memory_guard": "1" if self.memory_guard.active else "0",
            "updated_at": repr(at),
        }
        jobs = action_jobs(self.queue_name, transitions, desired, self.policy.hooks, self.config.jobs)
        # rq does not run on a Cluster: there the transaction holds the queue's keys alone (one slot)
        # and the action jobs follow it on rq's own Redis (lost if this monitor dies in between).
        conn = self.redis if self.rq_apart else self.rq_conn
        with conn.pipeline(transaction=True) as pipe:
            pipe.watch(self.keys.monitor_lock)  # type: ignore[no-untyped-call]
            if _text(pipe.get(self.keys.monitor_lock)) != self.monitor_id:
                raise NotActing(self.monitor_id)
            pipe.multi()
            pipe.hset(self.keys.alarm, mapping=alarm)
            pipe.hset(self.keys.monitor_state, mapping=figures)
            append_depth(pipe, self.keys, at, sample.stats.depth_by_type)
            for t in transitions:
                fields: dict[str, str | int | float] = {
                    "from": t.previous.label,
                    "to": t.level.label,
                    "depth": t.depth,
                    "at": repr(t.at),
                }
                append_event(pipe, self.keys, "alarm", **fields)
            if self.memory_guard.active != guard_was:
                state = "on" if self.memory_guard.active else "off"
                append_event(
                    pipe,
                    self.keys,
                    "memory_guard",
                    state=state,
                    used=memory.used_bytes,
                    budget=memory.budget_bytes or 0,
                )
            if jobs and not self.rq_apart:
                self.actions_queue.enqueue_many(jobs, pipeline=pipe)
            pipe.execute()
        if jobs and self.rq_apart:
            self.actions_queue.enqueue_many(jobs)

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_tick: Callable[[TickResult], None] | None = None) -> None:
        """Tick every interval until `stop` is set; then give the lock up so a standby takes over."""
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    result = self.tick()
                    if on_tick is not None:
                        on_tick(result)
                except Exception:
                    # A bug in one sample must not stop the alarms: log it and sample again.
                    log.exception("monitor %s: sample failed", self.monitor_id)
                    self.tracker = None
                stop.wait(max(self.config.interval_seconds - (time.monotonic() - started), 0.0))
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.leadership.release()
        except redis.RedisError as exc:
            log.warning("monitor %s: could not release the lock: %s", self.monitor_id, exc)
