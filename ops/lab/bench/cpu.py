"""CPU time of the benchmark's own processes, to check the harness is not what limits the figures.

On a small machine the load generator, the simulator and the system under test share a few cores; a
figure is only about the system when none of them sits near a full core. Linux's `/proc/<pid>/stat`
gives user + system time per process without an extra dependency; elsewhere the readings are absent
and the report says so.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine so far, all cores; None off Linux."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` so far; None when /proc cannot say (gone, or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after its closing parenthesis are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS


@dataclass
class CpuMeter:
    """CPU used by named processes between `start()` and `stop()`, in cores (1.0 = one full core).

    `machine` is every process on the machine, ours and anyone else's: when it is far above the sum
    of ours, something else competed for the CPUs during the run.
    """

    pids: Mapping[str, int]
    _started: dict[str, float] = field(default_factory=dict)
    _machine_start: tuple[float, float] | None = None
    _wall_start: float = 0.0
    usage: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self._wall_start = time.monotonic()
        self._machine_start = machine_cpu_seconds()
        for name, pid in self.pids.items():
            seconds = process_cpu_seconds(pid)
            if seconds is not None:
                self._started[name] = seconds

    def stop(self) -> dict[str, float]:
        """Cores used per process over the interval; unreadable ones are left out."""
        wall = max(time.monotonic() - self._wall_start, 1e-9)
        for name, before in self._started.items():
            after = process_cpu_seconds(self.pids[name])
            if after is not None:
                self.usage[name] = round((after - before) / wall, 3)
        machine_now = machine_cpu_seconds()
        if self._machine_start is not None and machine_now is not None:
            self.usage["machine"] = round((machine_now[0] - self._machine_start[0]) / wall, 3)
        return self.usage


class WindowCpu:
    """CPU cores one process used in a window of a run (the surge's plateau, where a load generator
    is busiest), read by two timers so the figure is not diluted by the quiet parts of the run."""

    def __init__(self, pid: int, window_s: tuple[float, float]) -> None:
        start, end = window_s
        if end <= start:
            raise ValueError(f"window_s={window_s} is empty; its end must come after its start")
        self.pid = pid
        self.window_s = window_s
        self._readings: list[float | None] = []
        self._timers = [threading.Timer(at, self._read) for at in window_s]

    def start(self) -> None:
        for timer in self._timers:
            timer.daemon = True
            timer.start()

    @property
    def complete(self) -> bool:
        """Both readings are taken: the window has passed."""
        return len(self._readings) >= 2

    def stop(self) -> float | None:
        """Cores used in the window; None when the run ended before it did, or /proc could not say."""
        for timer in self._timers:
            timer.cancel()
        if not self.complete or None in self._readings[:2]:
            return None
        first, second = self._readings[0], self._readings[1]
        assert first is not None and second is not None
        return round((second - first) / (self.window_s[1] - self.window_s[0]), 3)

    def _read(self) -> None:
        self._readings.append(process_cpu_seconds(self.pid))
