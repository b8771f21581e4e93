"""`--gpus all`: one worker process per GPU (or vLLM endpoint), each restarted if it crashes.

Processes rather than threads, so one worker's crash (or a stuck CUDA call in a future in-process
backend) cannot take its siblings down. A child that exits 0 is done (a burst run drained the
queue) and stays down; one that dies is restarted with exponential backoff, reset once it has run
for a while. SIGTERM/SIGINT are forwarded to every child, which then shuts down in order on its
own; a child still alive after its grace period (plus a margin) is killed.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shared import backoff

log = logging.getLogger(__name__)

STABLE_AFTER_SECONDS = 60.0
"""A child that ran this long before dying is restarted at once (its backoff resets)."""


class PlanError(ValueError):
    """`--gpus` and `--vllm-url` do not describe a set of workers; the message says why."""


def plan_targets(
    count: int | None, vllm_urls: Sequence[str], device_count: Callable[[], int]
) -> list[tuple[int, str]]:
    """(GPU index, vLLM URL) of each child; `count` is `--gpus N` (None: `--gpus all`).

    Several URLs: one child per URL (GPU i serves URL i). One URL: one child per GPU, all on that
    endpoint (a data-parallel vLLM, or the simulator with `--gpus N`). `--gpus N` fixes the count.
    """
    if not vllm_urls:
        raise PlanError("--vllm-url: at least one vLLM URL is needed")
    if count is None:
        count = len(vllm_urls) if len(vllm_urls) > 1 else device_count()
    if count < 1:
        raise PlanError("--gpus all found no GPU on this node")
    if len(vllm_urls) == 1:
        return [(index, vllm_urls[0]) for index in range(count)]
    if len(vllm_urls) != count:
        raise PlanError(
            f"--gpus {count} asks for {count} workers but {len(vllm_urls)} --vllm-url values were given; "
            "give one URL per GPU, or a single URL for all"
        )
    return list(enumerate(vllm_urls))


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    done: bool = False
    exit_codes: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        children: Sequence[tuple[str, list[str]]],
        *,
        stop_timeout_seconds: float,
        backoff_base_seconds: float = 1.0,
        backoff_max_seconds: float = 30.0,
        poll_seconds: float = 0.2,
    ) -> None:
        self.children = [Child(name, argv) for name, argv in children]
        self.stop_timeout_seconds = stop_timeout_seconds
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()

    def request_stop(self) -> None:
        """Safe from a signal handler: only sets an event."""
        self._stop.set()

    def run(self) -> int:
        """Supervise until stopped or every child is done; 0 when every child ended cleanly."""
        for child in self.children:
            self._start(child)
        while not self._stop.is_set() and not all(c.done for c in self.children):
            self._tend()
            self._stop.wait(self.poll_seconds)
        self._stop_all()
        clean = all(c.done and (not c.exit_codes or c.exit_codes[-1] == 0) for c in self.children)
        return 0 if clean else 1

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(child.argv)
        child.started_at = time.monotonic()
        log.info("started %s (pid %d)", child.name, child.process.pid)

    def _tend(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.done:
                continue
            if child.process is None:
                if now >= child.next_start:
                    self._start(child)
                continue
            code = child.process.poll()
            if code is None:
                continue
            child.exit_codes.append(code)
            child.process = None
            if code == 0:
                log.info("%s finished", child.name)
                child.done = True
                continue
            ran = now - child.started_at
            child.restarts = 0 if ran >= STABLE_AFTER_SECONDS else child.restarts + 1
            # No jitter: each child restarts alone, so there is no crowd to spread.
            ceiling = backoff.ceiling(child.restarts, self.backoff_base_seconds, self.backoff_max_seconds)
            delay = 0.0 if child.restarts == 0 else ceiling
            child.next_start = now + delay
            log.warning("%s exited with %d after %.1f s; restarting in %.1f s", child.name, code, ran, delay)

    def _stop_all(self) -> None:
        live = [c for c in self.children if c.process is not None and c.process.poll() is None]
        for child in live:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_seconds
        for child in live:
            assert child.process is not None
            try:
                child.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s did not stop within %.0f s; killing it", child.name, self.stop_timeout_seconds
                )
                child.process.kill()
                child.process.wait()
            child.exit_codes.append(child.process.returncode)
            child.done = True
