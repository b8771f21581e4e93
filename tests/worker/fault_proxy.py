"""A fault-injecting front for a simulator: a seeded share of completion calls answer HTTP 500, or
every answer breaks off after its first events.

Stands in for the simulator's own fault flags in tests that need a candidate which fails some
calls and answers the others (the simulator's answer is relayed whole, stream included).
"""

from __future__ import annotations

import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

import requests

HOP_HEADERS = frozenset({"connection", "transfer-encoding", "content-length", "keep-alive"})


class FaultProxy:
    """Serves on a free loopback port; `url` is its base URL."""

    def __init__(
        self, upstream: str, error_rate: float, seed: int = 7, cut_after_events: int | None = None
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.error_rate = error_rate
        self.cut_after_events = cut_after_events
        """Relay only this many server-sent events of an answer, then end it without `[DONE]`."""
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.failed = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _fails(self) -> bool:
        with self.lock:
            fail = self.random.random() < self.error_rate
            self.failed += fail
            return fail

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._relay(None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if proxy._fails():
                    self._send(
                        500, b'{"error": {"message": "injected fault", "code": 500}}', "application/json"
                    )
                    return
                self._relay(body)

            def _relay(self, body: bytes | None) -> None:
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                answer = requests.request(
                    self.command, proxy.upstream + self.path, data=body, headers=headers, timeout=30
                )
                payload = answer.content
                if proxy.cut_after_events is not None and body is not None:
                    payload = b"\n\n".join(payload.split(b"\n\n")[: proxy.cut_after_events]) + b"\n\n"
                self._send(
                    answer.status_code, payload, answer.headers.get("Content-Type", "application/json")
                )

            def _send(self, status: int, payload: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler
