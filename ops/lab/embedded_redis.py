"""A Redis for the demo and benchmarks: the configured one, the local one, or one started here.

`ensure_redis(url)` uses `url` when given; else a Redis on 127.0.0.1:6379 if it answers; else a
`redis-server` child on a free port with persistence off; else fakeredis's TCP server (with Lua, so
the queue's scripts run) in a child process. A child rather than a thread because fakeredis is pure
Python: in the demo's own process it would compete for the GIL with the traffic generator.

`python -m ops.lab.embedded_redis --port N` is that fakeredis child.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Literal

import redis

from ops.lab.procs.children import ChildError, ChildProcess, child_env, python_command
from ops.lab.procs.ports import free_port
from shared.redis_conn import DEFAULT_LOCAL_URL, local_redis_answers

log = logging.getLogger(__name__)

RedisKind = Literal["external", "local", "embedded redis-server", "embedded fakeredis"]
Embedded = Literal["auto", "redis-server", "fakeredis"]
EMBEDDED_CHOICES: tuple[Embedded, ...] = ("auto", "redis-server", "fakeredis")
FORCE_ENV = "TIDEGATE_EMBEDDED_REDIS"
"""`redis-server` or `fakeredis`: skip the local Redis and embed that one (tests use it)."""
STARTUP_SECONDS = 15.0
PORT_ATTEMPTS = 3


class RedisStartError(RuntimeError):
    """No Redis could be found or started; the message says what was tried."""


@dataclass
class RedisHandle:
    """Where Redis is and whether this process owns it (`stop()` ends an embedded one)."""

    url: str
    kind: RedisKind
    child: ChildProcess | None = field(default=None, repr=False)
    reason: str = ""
    """Why this one, in words (for the line the demo prints)."""

    @property
    def shared(self) -> bool:
        """True for a Redis others may use too: touch only your own keys there."""
        return self.child is None

    def describe(self) -> str:
        label = f"{self.kind} Redis" if self.shared else self.kind
        return f"{label} at {self.url}"

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(grace_seconds=5.0)


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1.0)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _start_child(kind: RedisKind, command_for_port: list[str], run_dir: Path, log_name: str) -> RedisHandle:
    """Start the command on a free port, retrying a few times if another process took the port first."""
    last: ChildError | None = None
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        command = [part.replace("{port}", str(port)) for part in command_for_port]
        url = f"redis://127.0.0.1:{port}/0"
        child = ChildProcess(kind, command, run_dir / log_name, env=child_env()).start()
        try:
            child.wait_ready(partial(_answers, url), STARTUP_SECONDS, "answering PING")
        except ChildError as exc:
            child.stop(grace_seconds=2.0)
            last = exc
            continue
        return RedisHandle(url=url, kind=kind, child=child)
    raise RedisStartError(f"could not start the {kind} Redis: {last}")


def start_redis_server(run_dir: Path, binary: str = "redis-server") -> RedisHandle:
    """A throwaway `redis-server` on loopback: no RDB snapshots, no AOF, files in `run_dir`."""
    command = [
        binary,
        "--port",
        "{port}",
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        str(run_dir),
    ]
    return _start_child("embedded redis-server", command, run_dir, "redis-server.log")


def start_fakeredis(run_dir: Path) -> RedisHandle:
    """fakeredis's TCP server (Lua through lupa) in a child process."""
    command = python_command("-m", "ops.lab.embedded_redis", "--port", "{port}")
    return _start_child("embedded fakeredis", command, run_dir, "fakeredis.log")


def ensure_redis(
    url: str | None,
    *,
    embedded: Embedded = "auto",
    run_dir: Path | None = None,
    local_url: str = DEFAULT_LOCAL_URL,
) -> RedisHandle:
    """The Redis to use, starting one if none is configured or running.

    `embedded` other than "auto" (or TIDEGATE_EMBEDDED_REDIS) skips the local Redis and starts that
    kind, so a run can be isolated from whatever happens to listen on 6379.
    """
    if embedded not in EMBEDDED_CHOICES:
        raise RedisStartError(f"embedded={embedded!r} is not accepted; use {'|'.join(EMBEDDED_CHOICES)}")
    forced = os.environ.get(FORCE_ENV, "").strip()
    if embedded == "auto" and forced:
        if forced not in ("redis-server", "fakeredis"):
            raise RedisStartError(f"{FORCE_ENV}={forced!r} is not accepted; use redis-server|fakeredis")
        embedded = "redis-server" if forced == "redis-server" else "fakeredis"
    if url:
        if not _answers(url):
            raise RedisStartError(f"TIDEGATE_REDIS_URL={url} does not answer PING; start it or unset it")
        return RedisHandle(url=url, kind="external", reason="from TIDEGATE_REDIS_URL")
    if embedded == "auto" and local_redis_answers(local_url):
        return RedisHandle(url=local_url, kind="local", reason="already running")
    folder = run_dir or Path(tempfile.mkdtemp(prefix="tidegate-redis-"))
    folder.mkdir(parents=True, exist_ok=True)
    binary = shutil.which("redis-server")
    if embedded == "redis-server" and binary is None:
        raise RedisStartError("embedded=redis-server, but no redis-server binary is on PATH")
    asked = "asked for" if embedded != "auto" else ""
    if embedded in ("auto", "redis-server") and binary is not None:
        handle = start_redis_server(folder, binary)
        handle.reason = asked or "none was configured or running; started one for this run"
        return handle
    handle = start_fakeredis(folder)
    handle.reason = asked or "none was configured or running and no redis-server is installed"
    return handle


def serve_fakeredis(port: int, host: str = "127.0.0.1") -> None:
    """Serve fakeredis over TCP until SIGTERM/SIGINT."""
    from fakeredis import TcpFakeServer

    server = TcpFakeServer((host, port), server_type="redis")
    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            # shutdown() waits for serve_forever to return, so it must run off the serving thread.
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"fakeredis listening on {host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.lab.embedded_redis", description=serve_fakeredis.__doc__
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    serve_fakeredis(args.port, args.host)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
