"""Child processes that can always be stopped: each in its own process group, logging to a file.

A process group per child means a stop signal reaches whatever the child forked too (vLLM's engine
core, rq's scheduler), and Ctrl-C in the terminal reaches only the parent, which then stops the
children in order instead of leaving them to die mid-write. Every child ever started is remembered in
`ChildRegistry`, whose `stop_all` runs from `atexit` and from SIGTERM, so no path out of the parent
leaves an orphan.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from ops.lab.procs.process_group import signal_group, stop_group

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 10.0


class ChildError(RuntimeError):
    """A child did not start or did not become ready; the message ends with its log's tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log {path} unreadable: {exc.strerror})"


class ChildProcess:
    """One command in its own session (so its own process group), stdout and stderr to `log_path`."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.grace_seconds = grace_seconds
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> ChildProcess:
        if self._process is not None:
            raise ChildError(f"{self.name} was already started (pid {self._process.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        REGISTRY.add(self)
        log.debug("started %s (pid %d): %s", self.name, self._process.pid, " ".join(self.command))
        return self

    def poll(self) -> int | None:
        """The exit code once the child has exited, else None."""
        return self._process.poll() if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait_ready(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `ready` until it is true; fail early if the child exits, or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.poll()
            if code is not None:
                raise ChildError(
                    f"{self.name} exited with code {code} before {what}; log {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            if ready():
                return
            time.sleep(0.1)
        raise ChildError(
            f"{self.name} did not report {what} within {timeout:.0f} s; log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the child's whole process group."""
        if self._process is not None:
            signal_group(self._process.pid, sig)

    def terminate(self) -> None:
        """Send SIGTERM to the group without waiting (`stop` then waits): lets a caller stop many at once."""
        if self._process is not None and self._process.poll() is None:
            signal_group(self._process.pid, signal.SIGTERM)

    def stop(self, grace_seconds: float | None = None) -> int | None:
        """SIGTERM the group, SIGKILL it after the grace period; returns the exit code (None if never run)."""
        process = self._process
        if process is None:
            return None
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        stop_group(process, grace, self.name)
        if self._log is not None:
            self._log.close()
            self._log = None
        REGISTRY.discard(self)
        return process.returncode


def stop_together(children: Sequence[ChildProcess], grace_seconds: float | None = None) -> None:
    """Stop several children in parallel: all get SIGTERM first, then each is waited for."""
    for child in children:
        child.terminate()
    for child in children:
        child.stop(grace_seconds)


class ChildRegistry:
    """Every child still running, so an exit path that skips the normal shutdown still stops them."""

    def __init__(self) -> None:
        self._children: list[ChildProcess] = []
        self._lock = threading.Lock()
        self._hooked = False

    def add(self, child: ChildProcess) -> None:
        with self._lock:
            self._children.append(child)
            if not self._hooked:
                atexit.register(self.stop_all)
                self._hooked = True

    def discard(self, child: ChildProcess) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)

    def alive(self) -> list[ChildProcess]:
        with self._lock:
            return list(self._children)

    def stop_all(self, grace_seconds: float = 5.0) -> None:
        """Stop every child still running, all at once, each with `grace_seconds`."""
        stop_together(list(reversed(self.alive())), grace_seconds)


REGISTRY = ChildRegistry()


def stop_children_on_sigterm() -> None:
    """Make SIGTERM (and SIGHUP) raise SystemExit in the main thread, so `finally` blocks and atexit
    run and the children are stopped, as they are after Ctrl-C's KeyboardInterrupt."""

    def _exit(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)
        signal.signal(signal.SIGHUP, _exit)


def python_command(*args: str) -> list[str]:
    """Run `args` with this interpreter, so children use the same virtualenv without PATH lookups."""
    return [sys.executable, *args]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra`, unbuffered so logs show lines as they happen."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env
