"""Running the real API under uvicorn on a free port, in a thread of the test process."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from tests.waiting import wait_until

START_TIMEOUT_S = 10.0


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 at a port the OS picks; yields the base URL, stops on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), f"uvicorn on port {port} stopped before it started"
        return server.started

    wait_until(started, START_TIMEOUT_S, f"uvicorn to start on port {port}", interval=0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
