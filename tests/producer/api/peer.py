"""A scripted HTTP peer: answers POSTs from a list and records what it received.

Stands in for the far side of a connection (a flaky API, a branch's callback receiver) so the
client's retry rules and callback delivery are tested over real sockets.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, dict[str, str], Any]


class ScriptedPeer:
    """The n-th request gets script[n] (the last entry repeats; a body given as bytes is sent as it
    is); `requests`, `bodies` (parsed) and `raw_bodies` (the bytes, for signature checks) record them."""

    def __init__(self, script: list[Answer]) -> None:
        self.script = script
        self.requests: list[dict[str, str]] = []
        self.bodies: list[Any] = []
        self.raw_bodies: list[bytes] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                peer.requests.append(dict(self.headers))
                peer.raw_bodies.append(raw)
                peer.bodies.append(json.loads(raw) if raw else None)
                status, headers, body = peer.script[min(len(peer.requests), len(peer.script)) - 1]
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedPeer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
