"""The drill's faults, one function each; `STEPS` is their order. Each returns a line of what it did."""

from __future__ import annotations

import signal
import time
from functools import partial
from typing import TYPE_CHECKING

import requests

from ops.lab.procs.children import ChildProcess
from ops.lab.procs.ports import http_ok

if TYPE_CHECKING:
    from ops.lab.chaos.drill import Drill


def worker_kill(drill: Drill) -> str:
    """kill -9 one worker: its leases lapse and another worker's reaper returns its tickets."""
    child = drill.stack.workers.pop("worker-gpu0")
    child.signal(signal.SIGKILL)
    child.stop(grace_seconds=1)
    time.sleep(drill.lease_seconds + 1.0)
    drill.stack.start_worker(0)
    drill.stack.wait_worker(0)
    return "killed worker-gpu0 with SIGKILL, restarted it after one lease"


def redis_restart(drill: Drill) -> str:
    """Stop Redis (a clean shutdown writes its AOF out) and start it again on its port."""
    drill.redis.stop()
    time.sleep(1.0)
    drill.redis.start()
    return "restarted redis-server (AOF) on the same port"


def sim_crash(drill: Drill) -> str:
    """kill -9 one simulator, the way an engine crash looks, and bring it back on its port."""
    old = next(c for c in drill.stack.children if c.name == "sim-gpu1" and c.running())
    old.signal(signal.SIGKILL)
    old.stop(grace_seconds=1)
    time.sleep(drill.outage_seconds)
    new = ChildProcess(old.name, old.command, old.log_path, env=old.env).start()
    drill.stack.children.append(new)
    new.wait_ready(partial(http_ok, drill.stack.vllm_urls[1] + "/health"), 30, "/health 200")
    return f"killed sim-gpu1 with SIGKILL, restarted it after {drill.outage_seconds:g} s"


BURST_LIMIT_SECONDS = 15.0
"""The error burst lasts until every endpoint's circuit has opened, but no longer than this."""


def _faults(drill: Drill, **fields: object) -> None:
    for url in drill.stack.vllm_urls:
        requests.post(url + "/sim/faults", json=fields, timeout=5).raise_for_status()


def error_burst(drill: Drill) -> str:
    """Every answer a 503, the batch in flight included, until the breakers open; then healthy
    again, for the half-open probes to close them."""
    _faults(drill, extra_latency_s=1.0)  # a batch builds up in flight ...
    time.sleep(1.5)
    _faults(drill, error_rate=1.0, error_status=503, extra_latency_s=0.5)  # ... and fails together
    started = time.monotonic()
    time.sleep(drill.outage_seconds)
    while not drill.every_circuit_opened(since=time.time() - (time.monotonic() - started)):
        if time.monotonic() - started > BURST_LIMIT_SECONDS:
            break
        time.sleep(0.2)
    held = time.monotonic() - started
    _faults(drill, error_rate=0.0, extra_latency_s=0.0)
    time.sleep(drill.open_seconds + 2.0)
    return f"both simulators answered 503 for {held:.0f} s"


def slow_answers(drill: Drill) -> str:
    """Every answer late by a second and a half."""
    _faults(drill, extra_latency_s=1.5)
    time.sleep(drill.outage_seconds)
    _faults(drill, extra_latency_s=0.0)
    return f"both simulators answered 1.5 s late for {drill.outage_seconds:g} s"


def redis_stall(drill: Drill) -> str:
    """SIGSTOP Redis (a paused VM or a partition looks like this), then let it go on."""
    assert drill.redis.child is not None
    drill.redis.child.signal(signal.SIGSTOP)
    time.sleep(drill.stall_seconds)
    drill.redis.child.signal(signal.SIGCONT)
    return f"stopped redis-server with SIGSTOP for {drill.stall_seconds:g} s"


STEPS = (
    ("worker kill -9", worker_kill),
    ("Redis restart", redis_restart),
    ("simulator crash", sim_crash),
    ("error burst", error_burst),
    ("slow answers", slow_answers),
    ("Redis stall", redis_stall),
)
