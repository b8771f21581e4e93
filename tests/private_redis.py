"""A private redis-server on a free loopback port, for tests that need their own settings."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from redis import Redis

from tests.tls_certs import TlsFiles
from tests.waiting import wait_until


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def private_redis(
    directory: Path, extra_args: Sequence[str] = (), tls: TlsFiles | None = None
) -> Iterator[str]:
    """Start `redis-server` with `extra_args`, keeping nothing on disk unless asked; yields its URL.

    With `tls` it listens only for TLS (a `rediss://` URL) with that certificate; clients need no
    certificate of their own.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = _free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    url = f"redis://127.0.0.1:{port}/0"
    if tls is not None:
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls.cert)]
        args += [
            "--tls-key-file",
            str(tls.key),
            "--tls-ca-cert-file",
            str(tls.ca),
            "--tls-auth-clients",
            "no",
        ]
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tls.ca}"
    args += ["--dir", str(directory), *extra_args]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
        wait_until(
            lambda: process.poll() is None and client.ping(),
            10,
            f"redis-server on port {port} to start",
            interval=0.05,
            ignoring=(Exception,),
        )
        client.close()
        yield url.partition("?")[0]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
