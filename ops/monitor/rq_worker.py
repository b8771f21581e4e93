"""An rq worker for the action and callback queues, run beside the monitor (`--rq-worker`).

Production runs `rq worker --with-scheduler --worker-class shared.rq_logs.JsonLogWorker
tidegate-actions tidegate-callbacks` on its own; this starts the same thing in a child process for the demo and single-machine setups. A child process,
not a thread, because rq's job timeouts use signals that only a main thread receives.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

from rq import Queue

from ops.monitor.dispatch import rq_connection
from shared.rq_logs import JsonLogWorker

log = logging.getLogger(__name__)


def _stop_when_orphaned(parent_pid: int) -> None:
    # A monitor killed with SIGKILL cannot stop its child; the child notices and stops itself.
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def work(
    redis_url: str, queue_names: Sequence[str], burst: bool = False, parent_pid: int | None = None
) -> None:
    """Run an rq worker (with the scheduler that retries with intervals need) until stopped."""
    if parent_pid is not None:
        threading.Thread(target=_stop_when_orphaned, args=(parent_pid,), daemon=True).start()
    conn = rq_connection(redis_url)
    queues = [Queue(name, connection=conn) for name in queue_names]
    JsonLogWorker(queues, connection=conn).work(burst=burst, with_scheduler=True, logging_level="WARNING")


def start_worker_process(redis_url: str, queue_names: Sequence[str]) -> BaseProcess:
    """Start `work` in a spawned child process (a clean interpreter, not a fork of the monitor)."""
    # Not a daemon: rq's scheduler is itself a child process, which daemons may not start.
    process = multiprocessing.get_context("spawn").Process(
        target=work, args=(redis_url, list(queue_names), False, os.getpid()), name="tidegate-rq-worker"
    )
    process.start()
    log.info("rq worker for %s started (pid %s)", ", ".join(queue_names), process.pid)
    return process


def stop_worker_process(process: BaseProcess, timeout: float = 10.0) -> None:
    """Ask the worker to finish its current job and stop (SIGTERM), then kill it if it lingers."""
    if process.is_alive():
        process.terminate()
        process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join(timeout)
