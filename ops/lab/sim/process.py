"""Run a simulator for tests, the demo and benchmarks: as a subprocess, or inside this process.

`SimulatorProcess(time_scale=20, kv_blocks=64)` starts `python -m ops.lab.sim` with those flags on a free
loopback port, waits for `/health` and stops it on exit. `InProcessSimulator` serves the same app from
a thread, which starts faster and exposes the engines for white-box checks.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import requests
import uvicorn

from ops.lab.sim.cli import READY_LINE
from ops.lab.sim.config import build_config
from ops.lab.sim.pool import EnginePool


class SimulatorError(RuntimeError):
    """The simulator did not come up; the message carries the end of its log."""


def _flag_args(flags: dict[str, object]) -> list[str]:
    """`kv_blocks=64` -> `--kv-blocks 64`, `enable_chunked_prefill=False` -> `--no-enable-chunked-prefill`;
    None leaves the profile's value."""
    args: list[str] = []
    for name, value in flags.items():
        if value is None:
            continue
        option = name.replace("_", "-")
        if isinstance(value, bool):
            args.append(f"--{option}" if value else f"--no-{option}")
            continue
        args += [f"--{option}", str(value.value if hasattr(value, "value") else value)]
    return args


def _wait_healthy(base_url: str, deadline: float, exited: Callable[[], bool] = lambda: False) -> None:
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if exited():
            raise SimulatorError("the simulator exited before it answered /health")
        try:
            if requests.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                return
            last_error = "health answered but not 200"
        except requests.RequestException as error:
            last_error = str(error)
        time.sleep(0.05)
    raise SimulatorError(f"{base_url}/health did not answer 200 in time: {last_error}")


class SimulatorProcess:
    """A `tidegate sim-vllm` subprocess on loopback; a context manager."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 30.0,
        **flags: object,
    ) -> None:
        self.host = host
        self._requested_port = port or 0
        self._flags = flags
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._log_file: IO[str] | None = None
        self.port = 0
        descriptor, path = tempfile.mkstemp(prefix="tidegate-sim-", suffix=".log")
        os.close(descriptor)
        self.log_path = Path(path)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> Self:
        command = [
            sys.executable,
            "-m",
            "ops.lab.sim",
            "--host",
            self.host,
            "--port",
            str(self._requested_port),
        ]
        command += _flag_args(self._flags)
        self._log_file = self.log_path.open("w")
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        self._process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._log_file, text=True, env=env
        )
        deadline = time.monotonic() + self._startup_timeout_s
        try:
            self.port = self._read_port(deadline)
            _wait_healthy(
                self.base_url, deadline, lambda: self._process is None or self._process.poll() is not None
            )
        except SimulatorError as error:
            self.stop(keep_log=True)
            raise SimulatorError(f"{error}\n--- simulator log ---\n{self.log_text()[-4000:]}") from None
        return self

    def _read_port(self, deadline: float) -> int:
        if self._process is None or self._process.stdout is None:
            raise SimulatorError("the simulator process was not started")
        lines: queue.Queue[str] = queue.Queue()
        stdout = self._process.stdout

        def pump() -> None:
            # Keep draining stdout for the process's life so it can never block on a full pipe.
            for line in stdout:
                lines.put(line)

        threading.Thread(target=pump, name="sim-stdout", daemon=True).start()
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                if self._process.poll() is not None:
                    raise SimulatorError(
                        f"the simulator exited with code {self._process.returncode}"
                    ) from None
                continue
            if line.startswith(READY_LINE):
                return int(line.rsplit(":", 1)[1])
        raise SimulatorError("the simulator did not announce its port in time")

    def stop(self, *, keep_log: bool = False) -> None:
        """Terminate, then kill after 5 s; the log file goes too unless `keep_log` (for a post-mortem)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
        if self._process is not None and self._process.stdout is not None:
            self._process.stdout.close()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if not keep_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(keep_log=exc_type is not None)


class InProcessSimulator:
    """The simulator app served by uvicorn on a background thread; `pool` exposes its engines."""

    def __init__(self, *, host: str = "127.0.0.1", startup_timeout_s: float = 10.0, **flags: Any) -> None:
        profile = str(flags.pop("profile", "a100-7b"))
        if "per_seq_slowdown" in flags:
            flags["per_seq_slowdown_s"] = flags.pop("per_seq_slowdown")
        self.config = build_config(profile, **flags)
        self.host = host
        self._startup_timeout_s = startup_timeout_s
        self._socket = socket.create_server((host, 0))
        self.port: int = self._socket.getsockname()[1]
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.pool: EnginePool | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        from ops.lab.sim.server import create_app

        app = create_app(self.config)
        self.pool = app.state.pool
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="sim-server", daemon=True
        )
        self._thread.start()
        _wait_healthy(self.base_url, time.monotonic() + self._startup_timeout_s)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
