"""Each second of a run as Redis saw it: depth per type, alarm level, workers' batch limits and KV use,
outcome counts. Read straight from Redis (three round trips a sample), the same state the API's
`/v1/queues` and the metrics report, without adding HTTP load to the run being measured.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from redis import Redis
from redis.exceptions import ResponseError

from shared.control import EVENTS_MAXLEN, read_control_state
from shared.keys import QueueKeys
from shared.live_workers import read_live_workers
from shared.policy import Policy
from shared.queue import TicketQueue


@dataclass(frozen=True)
class WorkerPoint:
    worker_id: str
    batch_limit: int | None
    inflight: int | None
    kv_usage: float | None
    gpu_free_bytes: int | None


@dataclass(frozen=True)
class Sample:
    t: float
    """Seconds since the run started."""
    depth_by_type: dict[str, int]
    inflight: int
    level: str
    mode: str
    drain_rate: float | None
    desired_workers: int | None
    workers: list[WorkerPoint]
    counts: dict[str, int]

    @property
    def depth(self) -> int:
        return sum(self.depth_by_type.values())

    def count(self, ticket_type: str | None, outcome: str) -> int:
        if ticket_type is not None:
            return self.counts.get(f"{ticket_type}:{outcome}", 0)
        return sum(v for k, v in self.counts.items() if k.endswith(f":{outcome}"))


@dataclass(frozen=True)
class AlarmChange:
    t: float
    """Seconds since the run started."""
    at: float
    previous: str
    level: str
    depth: int


def take_sample(queue: TicketQueue, policy: Policy, t: float) -> Sample:
    stats = queue.stats()
    state, _ = read_control_state(queue.redis, queue.keys, policy.alarms)
    workers = read_live_workers(queue.redis, queue.keys)
    return Sample(
        t=t,
        depth_by_type=stats.depth_by_type,
        inflight=stats.inflight,
        level=state.level.label,
        mode=state.mode.value,
        drain_rate=state.drain_rate,
        desired_workers=state.desired_workers,
        workers=[
            WorkerPoint(w.worker_id, w.batch_limit, w.inflight, w.kv_usage, w.gpu_free_bytes)
            for w in sorted(workers, key=lambda w: w.worker_id)
        ],
        counts=stats.counts,
    )


def read_alarm_changes(
    redis: Redis, keys: QueueKeys, after_id: str, started_at: float
) -> tuple[list[AlarmChange], str]:
    """Alarm transitions in the event stream after `after_id`, oldest first, and the last id read."""
    entries = cast("list[tuple[str, dict[str, str]]]", redis.xrange(keys.events, min=after_id))
    changes = []
    last = after_id
    for entry_id, fields in entries:
        if entry_id == after_id:
            continue
        last = entry_id
        if fields.get("kind") != "alarm":
            continue
        at = float(fields.get("at", 0.0))
        changes.append(
            AlarmChange(
                t=at - started_at,
                at=at,
                previous=fields.get("from", "?"),
                level=fields.get("to", "?"),
                depth=int(float(fields.get("depth", 0))),
            )
        )
    return changes, last


def events_trimmed_after(redis: Redis, keys: QueueKeys, after_id: str) -> bool:
    """Whether the capped event stream has dropped an entry newer than `after_id` ("-": any entry):
    then a path read after `after_id` may be missing its first transitions. A trim drops the oldest
    entries, so one newer than `after_id` is gone only if the oldest kept entry is newer too."""
    try:
        info = cast("dict[str, Any]", redis.xinfo_stream(keys.events))
    except ResponseError:  # no stream: nothing was written, so nothing was dropped
        return False
    length = int(info.get("length", 0))
    added = info.get("entries-added")
    if added is None:  # a server that does not count what it added (before Redis 7): a full stream may have
        return length >= EVENTS_MAXLEN
    first = info.get("first-entry")
    if int(added) <= length or not first:
        return False
    return _stream_id(first[0]) > _stream_id(after_id)


def _stream_id(entry_id: str) -> tuple[int, int]:
    if entry_id == "-":
        return (0, 0)
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0))


@dataclass
class TimeSeries:
    samples: list[Sample] = field(default_factory=list)
    alarms: list[AlarmChange] = field(default_factory=list)

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def peak_level(self) -> str:
        order = ["green", "yellow", "orange", "red"]
        levels = [s.level for s in self.samples] + [a.level for a in self.alarms]
        return max(levels, key=lambda lv: order.index(lv) if lv in order else -1, default="green")

    def to_dict(self) -> dict[str, Any]:
        return {"samples": [asdict(s) for s in self.samples], "alarms": [asdict(a) for a in self.alarms]}


class Recorder:
    """Samples every `interval` seconds on a thread, and follows the alarm transitions."""

    def __init__(self, redis: Redis, policy: Policy, queue_name: str, interval: float = 1.0) -> None:
        self.queue = TicketQueue(redis, policy, queue_name)
        self.policy = policy
        self.interval = interval
        self.series = TimeSeries()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="timeseries", daemon=True)
        self._t0 = time.monotonic()
        self.started_at = time.time()
        # Events are read from here on: this run's transitions only.
        self._since = f"{int(self.started_at * 1000)}-0"
        self._sample_lock = threading.Lock()
        self.errors = 0
        self.baseline_counts: dict[str, int] = {}

    def start(self) -> None:
        """Start sampling; outcome counts from here on are this run's (see `counts_since_start`)."""
        self.baseline_counts = self.queue.stats().counts
        self._t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling after one last sample; a second call does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> Sample | None:
        with self._sample_lock:  # the final sample after stop() must not race the thread's last one
            return self._sample()

    def _sample(self) -> Sample | None:
        try:
            point = take_sample(self.queue, self.policy, time.monotonic() - self._t0)
            changes, self._since = read_alarm_changes(
                self.queue.redis, self.queue.keys, self._since, self.started_at
            )
        except Exception:  # Redis briefly away: a gap in the series, not a failed run
            self.errors += 1
            return None
        with self._lock:
            self.series.samples.append(point)
            self.series.alarms.extend(changes)
        return point

    def counts_since_start(self) -> dict[str, int]:
        """Outcome counts now, less those the queue had before `start` (a calibration, an earlier run)."""
        now = self.queue.stats().counts
        return {k: v - self.baseline_counts.get(k, 0) for k, v in now.items()}

    def snapshot(self) -> TimeSeries:
        with self._lock:
            return TimeSeries(list(self.series.samples), list(self.series.alarms))
