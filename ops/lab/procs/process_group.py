"""Stopping a child together with everything it forked: its process group.

Children started with `start_new_session=True` lead their own group, so one signal reaches what they
forked too (vLLM's engine core, rq's scheduler), and a stop can wait until the whole group is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether a live member of group `pgid` remains; zombies do not count (a container's init may
    never reap them). Without /proc, any member the kernel still knows counts as alive."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if int(fields[2]) == pgid and fields[0] not in {"Z", "X"}:
            return True
    return False


def stop_group(process: subprocess.Popen[bytes], grace_seconds: float, name: str = "child") -> int | None:
    """SIGTERM the group led by `process`, SIGKILL it after `grace_seconds`, then wait (as long
    again) for stragglers of the group to go; returns the leader's exit code."""
    pgid = process.pid
    if process.poll() is None:
        signal_group(pgid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", name, pgid, grace_seconds)
            signal_group(pgid, signal.SIGKILL)
            process.wait(timeout=grace_seconds)
    # Grandchildren may outlive the leader for a moment.
    deadline = time.monotonic() + grace_seconds
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if group_alive(pgid):
        signal_group(pgid, signal.SIGKILL)
    return process.returncode
