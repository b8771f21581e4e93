"""The bench's CPU meters: the harness's CPU in the surge's window, not diluted by the rest of the run."""

from __future__ import annotations

import os
import sys
import time

import pytest

from ops.lab.bench.cpu import WindowCpu
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_window_meter_counts_the_cpu_spent_inside_its_window() -> None:
    meter = WindowCpu(os.getpid(), (0.05, 0.25))
    meter.start()

    def spun() -> bool:  # busy, so the window holds CPU time to count
        until = time.perf_counter() + 0.01
        while time.perf_counter() < until:
            pass
        return meter.complete

    wait_until(spun, 10, "the window's two readings", interval=0)
    cores = meter.stop()
    assert cores is not None and 0 < cores <= (os.cpu_count() or 1)


def test_a_window_the_run_never_reached_has_no_figure() -> None:
    meter = WindowCpu(os.getpid(), (30.0, 60.0))
    meter.start()
    assert meter.stop() is None
    with pytest.raises(ValueError, match=r"window_s=.* is empty"):
        WindowCpu(os.getpid(), (5.0, 5.0))
