"""Samples of a running system taken at a fixed interval: queue depth, in-flight work, alarm level and
the model servers' state, for the plot and the JSON.

The sampler knows nothing about which system it watches: each system hands it callables. A failed
read leaves a gap (None) rather than stopping the run, because a crashed simulator is one of the
things the benchmark is there to see.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from ops.lab.bench.sim_probe import SimCounters, SimProbeError, read_counters

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    t: float
    """Seconds since the run started."""
    depth: int | None
    inflight: int | None
    alarm_level: int | None
    """0..3 (green..red) for tidegate; None for a system without alarms."""
    sim_running: int | None
    sim_waiting: int | None
    kv_usage_max: float | None
    oom_crashes: int | None
    """Cumulative since the run started, over every model server."""
    bound: str | None = None
    """What bound tidegate's workers' next claims (worker/claim_plan.py), comma-joined."""

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


@dataclass(frozen=True)
class SystemState:
    """What one system says about itself at one moment."""

    depth: int
    inflight: int
    alarm_level: int | None
    """0..3 (green..red); None for a system without alarms."""
    bound: str | None = None


SystemProbe = Callable[[], SystemState]


def _safe(probe: SystemProbe) -> SystemState | None:
    try:
        return probe()
    except Exception as exc:  # a sampler must outlive whatever it watches
        log.debug("sample read failed: %s", exc)
        return None


def sum_counters(urls: Sequence[str]) -> SimCounters | None:
    """The model servers' counters added together (KV usage: the fullest one); None if one is unreadable."""
    readings: list[SimCounters] = []
    for url in urls:
        try:
            readings.append(read_counters(url, timeout=2.0))
        except SimProbeError:
            return None
    if not readings:
        return None
    return SimCounters(
        oom_crashes=sum(r.oom_crashes for r in readings),
        preemptions=sum(r.preemptions for r in readings),
        prompt_tokens=sum(r.prompt_tokens for r in readings),
        generation_tokens=sum(r.generation_tokens for r in readings),
        running=sum(r.running for r in readings),
        waiting=sum(r.waiting for r in readings),
        kv_usage_max=max(r.kv_usage_max for r in readings),
    )


class Timeline:
    """A background thread appending one `Sample` every `interval_s` until `stop()`."""

    def __init__(self, probe: SystemProbe, sim_urls: Sequence[str], interval_s: float = 0.5) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s} is not accepted; it must be above 0")
        self.probe = probe
        self.sim_urls = list(sim_urls)
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-timeline", daemon=True)
        self._t0 = 0.0
        self._crashes_at_start = 0

    def start(self, t0: float | None = None) -> Timeline:
        """Start sampling; `t0` (a `time.monotonic()` value) is the run's zero, default now."""
        self._t0 = time.monotonic() if t0 is None else t0
        first = sum_counters(self.sim_urls)
        self._crashes_at_start = first.oom_crashes if first is not None else 0
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.samples.append(self.sample())
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def sample(self) -> Sample:
        t = round(time.monotonic() - self._t0, 3)
        state = _safe(self.probe)
        counters = sum_counters(self.sim_urls)
        return Sample(
            t=t,
            depth=state.depth if state else None,
            inflight=state.inflight if state else None,
            alarm_level=state.alarm_level if state else None,
            sim_running=counters.running if counters else None,
            sim_waiting=counters.waiting if counters else None,
            kv_usage_max=round(counters.kv_usage_max, 4) if counters else None,
            oom_crashes=counters.oom_crashes - self._crashes_at_start if counters else None,
            bound=state.bound if state else None,
        )
